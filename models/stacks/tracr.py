"""A transformer compiled from a RASP program by Tracr (``models.compiled``) as a family of ``FamilyDecoder``: token
and position embeddings, blocks of attention then a ReLU feed-forward with no norm anywhere, causal or not as it was
compiled, and an unembedding that reads the program's output out of the residual stream: one logit per output value
(a categorical output, decoded by its argmax) or the value itself (a numerical one)."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HeadLensError
from ..scratch import ScratchModel
from .family import Family, FamilyConfig, FamilyDecoder
from .weights import Weights

BOS, PAD, UNK = "BOS", "PAD", "UNK"
ZERO = 1e-6  # an attention weight under this is a compiled Select's 0

FAMILY = Family(norm="layer", pre_norms=False, positions="learned", gated=False)


@dataclass(frozen=True)
class TracrConfig(FamilyConfig):
    """A compiled program's sizes under the family's names, with what it reads and writes: ``vocab`` (its tokens,
    in its embedding's order: the BOS and the pad among them), ``outputs`` (the output values in the unembedding's
    order; empty for a numerical output) and ``causal``."""

    model_type: str = "tracr"
    causal: bool = False
    vocab: tuple = ()
    outputs: tuple = ()
    numerical: bool = False
    ground_truth: str = ""  # what the compiler put where (``models.compiled_truth``), as JSON
    hidden_act: str = "relu"
    mlp_bias: bool = True

    @classmethod
    def from_dict(cls, d: dict) -> "TracrConfig":
        d = dict(d)
        d["vocab"], d["outputs"] = tuple(d.get("vocab", ())), tuple(d.get("outputs", ()))
        config = cls.read(d, source=None)
        if len(config.vocab) != config.vocab_size or (not config.numerical and not config.outputs):
            raise HeadLensError("A compiled model's config.json names its vocabulary and its output values; this one "
                                "does not. Compile it again with models.compile_rasp.")
        return config

    @property
    def tokens(self) -> tuple:
        """The tokens a text is made of: the vocabulary less the BOS and the pad."""
        return tuple(v for v in self.vocab if v not in ("BOS", "PAD"))

    def to_dict(self) -> dict:
        d = super().to_dict()
        del d["layer_types"]  # none: transformers, reading the folder's tokenizer, checks a list against the layers
        return d


class TracrStack(FamilyDecoder):
    """Embeddings, the compiled blocks and the unembedding of the program's output (``lm_head``, ``(outputs,
    E)``): its logits are the output space of the residual stream."""

    config_class = TracrConfig
    model_types = ("tracr",)
    description = "transformers compiled from RASP programs"
    family = FAMILY
    language_model = False
    weights = Weights((("embedding.", "embedding."), ("positions.", "positions."), ("lm_head.", "lm_head."),
                       ("layers.{i}.", "layers.{i}.")), what="the weights of a compiled program")

    def __init__(self, config: TracrConfig):
        super().__init__(replace(config, tie_word_embeddings=True))
        self.config = config
        self.causal = config.causal  # as compiled, not every decoder's mask
        for block in self.layers:
            block.causal = config.causal
        self.norm = nn.Identity()
        self.lm_head = nn.Linear(config.hidden_size, max(1, len(config.outputs)), bias=False)

    @property
    def readouts(self) -> tuple[str, ...]:
        return ("compiled",)

    @property
    def model_class(self):
        return CompiledModel

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if int(input_ids.max()) >= self.config.vocab_size:
            raise HeadLensError(f"This compiled program reads the tokens {', '.join(map(str, self.config.tokens))}, "
                                "separated by spaces.")
        return super().embed(input_ids, token_type_ids)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def logits(self, h: torch.Tensor, tokens: slice = slice(None)) -> torch.Tensor:
        """``(B, L, outputs)``: each output value's logit at every position, or ``(B, L, 1)``, the numerical value."""
        return F.linear(h, self.lm_head.weight[tokens])

    def unembedding(self) -> torch.Tensor:
        return self.lm_head.weight

    def norm_alone(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def norm_linear(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def frozen_finish(self, x: torch.Tensor):
        return (lambda part: part), torch.zeros_like(x)


class CompiledModel(ScratchModel):
    """A compiled program on the from-scratch engine: it reads its vocabulary's tokens separated by spaces."""

    @property
    def config(self):
        return self.stack.config

    @property
    def program(self) -> dict:
        """What was compiled: ``name``, ``vocab``, ``max_seq_len``, ``causal``, ``numerical``."""
        c = self.config
        return {"name": json.loads(c.ground_truth or "{}").get("program", ""), "vocab": list(c.tokens),
                "max_seq_len": c.max_positions - 1, "causal": c.causal, "numerical": c.numerical}

    def words(self, text: str) -> list[str]:
        """``text``'s tokens, checked: each of the vocabulary, at most ``max_seq_len`` of them (a sentence else)."""
        words = str(text).split()
        known = [str(v) for v in self.config.tokens]
        bad = [w for w in words if w not in known]
        if bad:
            raise HeadLensError(f"'{bad[0]}' is not a token of this compiled program: it reads "
                                f"{', '.join(known)}, separated by spaces.")
        longest = self.config.max_positions - 1
        if len(words) > longest:
            raise HeadLensError(f"This compiled program reads at most {longest} tokens; the text has {len(words)}.")
        return words

    def attend(self, texts, **options):
        """``ScratchModel.attend``, each weight under ``ZERO`` given as 0: a Select's unselected key, which Tracr's
        softmax means as none and float32 leaves at 1e-7 or less (within 1e-6 of Tracr's own weights still)."""
        out = super().attend(texts, **options)
        for attention in out if isinstance(out, list) else [out]:
            attention.weights[attention.weights < ZERO] = 0
        return out

    def random_inputs(self, n: int = 200, seed: int = 0) -> list[str]:
        """Up to ``n`` different random inputs of its tokens, of every length from 1 to its longest (as many of
        each as there are), seeded: what its heads are explained on."""
        import random

        rng, tokens, longest = random.Random(seed), [str(v) for v in self.config.tokens], self.config.max_positions - 1
        found: dict[str, None] = {}
        for _ in range(20 * n):
            length = min(longest, rng.randint(1, longest + 2))  # the longest, most often
            found.setdefault(" ".join(rng.choice(tokens) for _ in range(length)))
            if len(found) == n:
                break
        return list(found)

    def tokenize(self, *args, **kwargs):
        texts = args[0] if args else kwargs.get("text")
        for text in [texts] if isinstance(texts, str) else list(texts or ()):
            self.words(text)
        return super().tokenize(*args, **kwargs)

    def outputs(self, text: str) -> np.ndarray:
        """``(tokens, outputs)``: each output value's logit at every position (BOS first), or ``(tokens, 1)``, the
        numerical value."""
        enc = self.tokenize([text], return_tensors="pt")
        with torch.no_grad():
            h = self.stack(enc["input_ids"].to(self.device), need_weights=False).last_hidden_state
            return self.stack.logits(h)[0].to("cpu", torch.float64).numpy()

    def apply(self, text: str) -> list:
        """Tracr's decoded output of ``text``: the BOS, then each position's output value (a categorical output's
        argmax, a numerical output's value)."""
        out = self.outputs(text)
        if self.config.numerical:
            return [BOS, *out[1:, 0].tolist()]
        return [BOS, *(self.config.outputs[k] for k in out[1:].argmax(-1))]
