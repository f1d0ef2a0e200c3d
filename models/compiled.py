"""Transformers whose heads' jobs are known: RASP programs (Weiss et al. 2021) compiled into weights by Tracr
(Lindner et al. 2023; ``tracr-pypi`` packages DeepMind's Tracr), run on our engine (``stacks.tracr``).

``compile_rasp(program, vocab=..., max_seq_len=...)`` compiles any program into a model folder and opens it;
``compiled(name)`` does so for a built-in program (``BUILT_IN``, Tracr's library), once, kept on disk. A compiled
model reads a text as its vocabulary's tokens separated by spaces, the BOS put first as Tracr's ``apply`` wants it
(``model.attend("3 1 5 2")``), and ``model.apply(text)`` gives Tracr's decoded output. What the compiler put where
(each head's ``Select`` and ``Aggregate``, each feed-forward's ``Map``, the true edges) is ``ground_truth(model)``.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .compiled_truth import block_at
from .errors import HeadLensError
from .gguf import cache_root
from .stacks.tracr import BOS, PAD, UNK, CompiledModel

__all__ = ["BOS", "BUILT_IN", "PAD", "UNK", "CompiledModel", "Program", "Truth", "compile_rasp", "compiled",
           "ground_truth", "vocab_words"]

MAX_LENGTH = 16    # the longest sequence a program typed in the app compiles for
MAX_VOCAB = 32     # and its most tokens


@dataclass(frozen=True)
class Program:
    """A built-in program: ``make()`` the RASP program (Tracr imported only then), its vocabulary, length and mask,
    and what it computes, in words."""

    name: str
    make: Callable
    vocab: tuple
    max_seq_len: int
    about: str
    causal: bool = False

    @property
    def example(self) -> str:
        """An input to open it on: one token short of its longest, drawn with its name as the seed."""
        import random

        rng = random.Random(self.name)
        return " ".join(str(rng.choice(self.vocab)) for _ in range(self.max_seq_len - 1))

    @property
    def title(self) -> str:
        """How the model picker names it: "Compiled · sort · tokens 1-5 · length 5"."""
        return f"Compiled · {self.name} · tokens {vocab_words(self.vocab)} · length {self.max_seq_len}"


def vocab_words(vocab) -> str:
    """A vocabulary in a few characters: "1-5" for a run of integers, else its tokens."""
    values = sorted(vocab, key=str)
    if all(isinstance(v, int) for v in values) and len(values) > 2 and \
            sorted(values) == list(range(min(values), max(values) + 1)):
        return f"{min(values)}-{max(values)}"
    return " ".join(map(str, values))


def _lib(name: str, *args, **kwargs) -> Callable:
    def make():
        from tracr.compiler import lib

        return getattr(lib, name)(*(a() if callable(a) else a for a in args), **kwargs)
    return make


def _tokens():
    from tracr.rasp import rasp

    return rasp.tokens


def _is_x():
    from tracr.rasp import rasp

    return rasp.numerical(rasp.Map(lambda t: 1 if t == "x" else 0, rasp.tokens))


def _previous_token():
    """Each token's previous token: a Select of ``indices`` against ``indices - 1`` with EQ, aggregating tokens."""
    from tracr.rasp import rasp

    before = rasp.Map(lambda i: i - 1, rasp.indices).named("before")
    return rasp.Aggregate(rasp.Select(rasp.indices, before, rasp.Comparison.EQ).named("previous"), rasp.tokens,
                          default=None).named("previous_token")


BUILT_IN = {p.name: p for p in (
    Program("length", _lib("make_length"), (1, 2, 3), 5, "the number of tokens, at every position"),
    Program("reverse", _lib("make_reverse", _tokens), (1, 2, 3), 5, "the tokens in reverse order"),
    Program("histogram", _lib("make_hist"), (1, 2, 3), 5, "how many times each token occurs"),
    Program("sort", _lib("make_sort", _tokens, _tokens, max_seq_len=5, min_key=1), (1, 2, 3, 4, 5), 5,
            "the tokens in increasing order"),
    Program("sort_unique", _lib("make_sort_unique", _tokens, _tokens), (1, 2, 3, 4, 5), 5,
            "the tokens in increasing order, each token at most once"),
    Program("sort_freq", _lib("make_sort_freq", max_seq_len=5), (1, 2, 3), 5,
            "the tokens by how often they occur, most often first"),
    Program("frac_prevs", _lib("make_frac_prevs", _is_x), ("x", "y"), 5,
            "the fraction of the tokens so far that are x"),
    Program("pair_balance", _lib("make_pair_balance", _tokens, "(", ")"), ("(", ")"), 6,
            "the balance of open and closed brackets so far, as a fraction of the tokens"),
    Program("shuffle_dyck", _lib("make_shuffle_dyck2"), ("(", ")", "{", "}"), 6,
            "whether two kinds of brackets are each balanced"),
    Program("previous_token", _previous_token, (1, 2, 3), 5, "the previous token (a previous-token head)",
            causal=True),
)}


# --- compiling ------------------------------------------------------------------------------------------------------

def compile_rasp(program, *, vocab, max_seq_len: int, causal: bool = False, name: str = "program",
                 folder: str | os.PathLike | None = None, device: str = "auto") -> CompiledModel:
    """Compile the RASP ``program`` (a ``tracr.rasp.rasp.SOp``) over ``vocab`` for sequences of up to
    ``max_seq_len`` tokens into a model folder (``folder``, else a new one under HeadLens's cache) and open it."""
    from .loading import load_model

    target = Path(folder) if folder is not None else cache_root() / "compiled" / f"{name}-{os.getpid()}"
    write_compiled(program, vocab, max_seq_len, causal, name, target)
    return load_model(target, backend="scratch", device=device)


def compiled(name: str, *, device: str = "auto") -> CompiledModel:
    """The built-in program ``name`` (``BUILT_IN``) compiled, once: its folder is kept in HeadLens's cache."""
    from .loading import load_model

    if name not in BUILT_IN:
        raise HeadLensError(f"No built-in program named '{name}': choose one of {', '.join(BUILT_IN)}.")
    p = BUILT_IN[name]
    target = compiled_folder(p)
    if not (target / "model.safetensors").is_file():
        from filelock import FileLock

        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if not (target / "model.safetensors").is_file():
                write_compiled(p.make(), p.vocab, p.max_seq_len, p.causal, p.name, target)
    return load_model(target, backend="scratch", device=device)


VERSION = 1  # of the folders compiled here: a new one compiles every built-in program again


def compiled_folder(p: Program) -> Path:
    key = hashlib.sha256(repr((VERSION, p.name, p.vocab, p.max_seq_len, p.causal)).encode()).hexdigest()[:12]
    return cache_root() / "compiled" / f"{p.name}-{key}"


def write_compiled(program, vocab, max_seq_len: int, causal: bool, name: str, folder: Path) -> Path:
    """Compile ``program`` with Tracr and write the folder ``load_model`` opens: config.json (sizes, vocabulary,
    output values, the ground truth), model.safetensors and a word-level tokenizer whose ids are Tracr's."""
    from .compiled_truth import assembled

    return write_assembled(*assembled(program, vocab, max_seq_len, causal, BOS, PAD), max_seq_len, causal, name,
                           folder)


def write_assembled(model, truth: dict, max_seq_len: int, causal: bool, name: str, folder: Path) -> Path:
    """``write_compiled`` of Tracr's assembled ``model`` and its ``truth`` (``compiled_truth.assembled``)."""
    stack = _stack_of(model, max_seq_len, causal, {**truth, "program": name})
    tmp = folder.with_name(folder.name + ".part")
    stack.save_pretrained(tmp)
    _tokenizer(stack.config.vocab, max_seq_len + 1).save_pretrained(tmp)
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def _stack_of(model, max_seq_len: int, causal: bool, truth: dict):
    """Tracr's assembled ``model`` as our stack, its weights copied."""
    from .stacks.tracr import TracrConfig, TracrStack

    params = {k: {p: np.asarray(v, dtype=np.float32) for p, v in d.items()} for k, d in model.params.items()}
    cfg, labels = model.model_config, model.residual_labels
    tokens = sorted(model.input_encoder.encoding_map.items(), key=lambda kv: kv[1])
    numerical = model.output_encoder is None or not hasattr(model.output_encoder, "encoding_map")
    outputs = () if numerical else tuple(v for v, _ in sorted(model.output_encoder.encoding_map.items(),
                                                              key=lambda kv: kv[1]))
    sink = truth["output"]["value"]
    rows = [labels.index(sink)] if numerical else [labels.index(f"{sink}:{v}") for v in outputs]
    config = TracrConfig(vocab_size=len(tokens), hidden_size=len(labels), intermediate_size=cfg.mlp_hidden_size,
                         num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                         head_dim=cfg.key_size, max_position_embeddings=max_seq_len + 1, causal=causal,
                         vocab=tuple(t for t, _ in tokens), outputs=outputs, numerical=numerical,
                         ground_truth=json.dumps(truth, default=str))
    stack = TracrStack(config)
    t = lambda a: torch.tensor(np.array(a))  # noqa: E731
    with torch.no_grad():
        stack.embedding.weight.copy_(t(params["token_embed"]["embeddings"]))
        stack.positions.weight.copy_(t(params["pos_embed"]["embeddings"]))
        for i, block in enumerate(stack.layers):
            at = f"transformer/layer_{i}/"
            q, k, v = (params[at + f"attn/{n}"]["w"].T for n in ("query", "key", "value"))
            block.attn.in_proj_weight.copy_(t(np.concatenate([q, k, v])))
            block.attn.out_proj.weight.copy_(t(params[at + "attn/linear"]["w"].T))
            block.mlp_in.weight.copy_(t(params[at + "mlp/linear_1"]["w"].T))
            block.mlp_in.bias.copy_(t(params[at + "mlp/linear_1"]["b"]))
            block.mlp_out.weight.copy_(t(params[at + "mlp/linear_2"]["w"].T))
            block.mlp_out.bias.copy_(t(params[at + "mlp/linear_2"]["b"]))
        eye = np.eye(len(labels), dtype=np.float32)
        stack.lm_head.weight.copy_(t(eye[rows]))
    return stack.eval()


def _tokenizer(vocab: tuple, longest: int):
    """A word-level tokenizer of ``vocab`` (ids in Tracr's order), splitting on spaces and putting the BOS first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {str(token): i for i, token in enumerate(vocab)}
    ids[UNK] = len(vocab)  # past the embedding: ``CompiledModel.words`` refuses such a text first
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, ids[BOS])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, pad_token=PAD, unk_token=UNK,
                                   model_max_length=longest)


@dataclass(frozen=True)
class Truth:
    """A compiled model's known algorithm: ``blocks``, one row per block an expression was placed in (``block``,
    ``layer``, ``head``, None for a feed-forward, the expression's ``label``, ``expression``, what it ``says``, and
    for a head its ``select``, ``comparisons``, ``keys``, ``queries`` and what it ``reads``), ``edges`` (``sender``,
    ``receiver``, ``input``: q, k, v, mlp or output) and the ``output``'s name and encoding."""

    blocks: pd.DataFrame
    edges: pd.DataFrame
    output: dict

    def to_json(self) -> str:
        return json.dumps({"output": self.output, "blocks": self.blocks.to_dict("records"),
                           "edges": self.edges.to_dict("records")}, indent=2, default=str)

    def head(self, layer: int, head: int) -> dict | None:
        """What head ``(layer, head)`` was compiled to (its row), or None: a head the compiler left empty."""
        rows = self.blocks[(self.blocks["layer"] == layer) & (self.blocks["head"] == head)]
        return None if rows.empty else rows.iloc[0].to_dict()


def ground_truth(model) -> Truth:
    """What the compiler put where in ``model`` (a compiled model; a sentence for any other)."""
    raw = getattr(getattr(getattr(model, "stack", None), "config", None), "ground_truth", "")
    if not raw:
        raise HeadLensError(f"{model.name} is not a compiled program: its heads' jobs are not known. Open one with "
                            "models.compiled or models.compile_rasp.")
    truth = json.loads(raw)
    rows = []
    for b in truth["blocks"]:
        for block in b["blocks"]:
            layer, head = block_at(block)
            rows.append({"block": block, "layer": layer, "head": head,
                         **{k: v for k, v in b.items() if k != "blocks"}})
    columns = ["block", "layer", "head", "label", "expression", "says", "select", "comparisons", "keys", "queries",
               "reads", "encoding"]
    blocks = pd.DataFrame(rows).reindex(columns=columns)
    blocks["head"] = blocks["head"].astype("Int64")
    return Truth(blocks, pd.DataFrame(truth["edges"], columns=["sender", "receiver", "input"]), truth["output"])
