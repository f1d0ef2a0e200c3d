"""The transformers engine: any Hugging Face model whose eager attention returns weights.

The SDPA path returns no weights, so models are opened with ``attn_implementation="eager"``.
``trust_remote_code`` is never set: no code that comes with a model is ever run.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import torch

from .base import AttentionModel
from .engine import open_scratch
from .errors import HeadLensError
from .files import load_tokenizer
from .limits import check_parameter_count
from .memory import page_in
from .result import Attention
from .stacks import for_model_type

DECODER_ONLY_TYPES = {"gpt2", "gpt_neo", "gptj", "gpt_neox", "gpt_bigcode", "llama", "mistral", "opt",
                      "bloom", "falcon", "qwen2", "qwen3", "phi", "phi3", "gemma", "gemma2", "gemma3_text",
                      "codegen", "ctrl"}
# RoBERTa-style models number positions from pad_token_id + 1, so that many positions are never used.
OFFSET_POSITION_TYPES = {"roberta", "xlm-roberta", "camembert", "longformer", "data2vec-text", "xmod",
                         "roberta-prelayernorm"}


def open_transformers(folder: Path, config: dict, display: str, device: torch.device, *, untrained: bool = False,
                      seed: int = 0, allow_pickle: bool = False) -> "TransformersModel":
    """The model in ``folder`` (its config.json already checked), as transformers builds it."""
    if untrained:
        raise HeadLensError("An untrained model is built by the from-scratch engine; pass backend='scratch'.")
    if str(config.get("model_type", "")).startswith("headlens_"):
        raise HeadLensError(f"{display} was trained in HeadLens, and only HeadLens's own engine runs it; "
                            "open it with backend='scratch'.")
    if config.get("pruned_heads"):
        raise HeadLensError(f"{display} has pruned heads, which transformers no longer builds; "
                            "open it with the from-scratch engine (backend='scratch').")
    model = _load_hf_model(folder, allow_pickle)
    return TransformersModel(model.to(device), load_tokenizer(folder), display, device, folder=folder, config=config)


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
    return model.eval().requires_grad_(False)  # read, never trained: no gradient of a weight is ever taken


def config_windows(c, n_layers: int) -> tuple[int | None, ...] | None:
    """Per layer, the sliding window a transformers config gives it (``layer_types`` with ``sliding_window``,
    or Mistral's window on every layer); None when no layer slides."""
    window = getattr(c, "sliding_window", None)
    if not window:
        return None
    types = getattr(c, "layer_types", None)
    if types:
        windows = tuple(window if t == "sliding_attention" else None for t in types)
    elif c.model_type == "mistral":
        windows = (window,) * n_layers
    else:
        return None
    return windows if any(w is not None for w in windows) else None


class TransformersModel(AttentionModel):
    """Any transformers model whose eager attention returns weights."""

    backend = "transformers"

    def __init__(self, model, tokenizer, name: str, device: torch.device, *, folder: Path | None = None,
                 config: dict | None = None):
        c = model.config
        self.model = model
        self.folder, self._config = folder, config or {}  # the folder's config.json, for scratch()
        self._scratch, self._scratch_lock = None, threading.Lock()
        self.encoder_decoder = bool(getattr(c, "is_encoder_decoder", False))
        decoder_only = c.model_type in DECODER_ONLY_TYPES or bool(getattr(c, "is_decoder", False))
        n_layers = _first_attr(c, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
        n_heads = _first_attr(c, "num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads")
        max_positions = _first_attr(c, "max_position_embeddings", "n_positions")
        if max_positions and c.model_type in OFFSET_POSITION_TYPES:
            max_positions -= (c.pad_token_id or 0) + 1
        super().__init__(tokenizer, name, device, n_layers, n_heads, max_positions, causal=decoder_only,
                         parts=3 if self.encoder_decoder else 1)
        self.windows = config_windows(c, n_layers) if decoder_only else None

    def page_in(self) -> None:
        page_in(self.model)

    def _on_scratch(self, what: str) -> AttentionModel:
        """The same weights on the from-scratch engine, loaded from the model's folder the first time it is
        asked for and kept; a sentence for an architecture that engine does not implement."""
        if self.folder is None or for_model_type(self._config.get("model_type")) is None:
            return super()._on_scratch(what)
        with self._scratch_lock:
            if self._scratch is None:
                scratch = open_scratch(self.folder, self._config, self.name, self.device)
                scratch.embed_max_tokens = self.embed_max_tokens
                self._scratch = scratch
        return self._scratch

    def attend(self, texts, *, head_mask=None, head_means=None, causal: bool = False, **options):
        """``AttentionModel.attend``; with heads switched off or a causal mask added, on ``scratch()``."""
        if head_mask is not None or head_means is not None or (causal and not self.causal) or options.get("edits"):
            return self.scratch("Switching heads off and adding a causal mask happen").attend(
                texts, head_mask=head_mask, head_means=head_means, causal=causal, **options)
        return super().attend(texts, **options)

    def embed(self, texts, *, head_mask=None, head_means=None, **options):
        """``AttentionModel.embed``; with heads switched off, on ``scratch()``."""
        if head_mask is not None or head_means is not None:
            return self.scratch("Switching heads off happens").embed(texts, head_mask=head_mask,
                                                                  head_means=head_means, **options)
        return super().embed(texts, **options)

    def _attend_batch(self, texts, targets, head_mask, causal, head_fill=None, layers=None):
        if causal:
            raise HeadLensError("A causal mask can be added to the from-scratch engine only; "
                                "a transformers model attends as it was trained.")
        enc, lengths, originals = self._encode(texts)
        inputs = self._inputs(enc)
        if not self.encoder_decoder:
            if targets is not None:
                raise HeadLensError("A target text is for encoder-decoder models such as T5 or BART.")
            out = self._forward(inputs)
            attentions = out.attentions if layers is None or out.attentions is None else \
                [out.attentions[i] for i in layers]  # transformers computes every layer's; these are kept
            return self._results(texts, enc, lengths, originals, self._stack(attentions),
                                 causal=self.causal, layers=layers)
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


def _with_parts(encoder: Attention, decoder: Attention, cross: Attention) -> Attention:
    return replace(encoder, decoder=decoder, cross=cross)


def _first_attr(config, *names):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return None
