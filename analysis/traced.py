"""One prompt run once for every analysis of it, as TransformerLens hands a clean cache to its patching.

``traced(model, text)`` runs ``text`` once through the language model on the from-scratch engine and keeps what the Effects
analyses read: the token ids and tokens, every layer's residual stream entering it and every head's
``z`` (``models.patching.Trace``). Logit attribution, head and residual patching (a clean and a corrupted
``Traced``), a head's vocabulary and the routes of a prediction take a ``Traced`` wherever they take a
prompt's text, so that one view runs each prompt once. Its attention weights are read from the kept
residual stream, each layer's attention alone (no MLP, no layer run again), when first asked for.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from models import Attention, AttentionModel, HeadLensError
from models import patching as P

PATCH_MAX_TOKENS = 256  # per-position patching of every head runs heads x tokens copies of the prompt


@dataclass(frozen=True, eq=False)
class Traced:
    """``text`` run once on ``model`` (a language model on the from-scratch engine): ``ids`` ``(n,)``, ``tokens`` and ``trace``."""

    model: AttentionModel
    text: str
    ids: torch.Tensor
    tokens: list[str]
    trace: P.Trace
    word_ids: list[int | None]
    special: np.ndarray
    offsets: list[tuple[int, int]]
    _kept: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __len__(self) -> int:
        return len(self.tokens)

    def weights(self) -> np.ndarray:
        """``(layers, heads, n, n)`` float32: every head's attention, read from the kept residual stream."""
        with self._lock:
            if "weights" not in self._kept:
                found = P.trace_weights(self.model.stack, self.trace).to("cpu", torch.float32).numpy()
                found.flags.writeable = False
                self._kept["weights"] = found
            return self._kept["weights"]

    def attention(self) -> Attention:
        """The prompt's attention as ``model.attend`` gives it, from ``weights``."""
        m = self.model
        return Attention(tokens=self.tokens, weights=self.weights(), word_ids=self.word_ids, special=self.special,
                         offsets=self.offsets, text=self.text, model_name=m.name, backend=m.backend,
                         device=str(m.device), n_tokens_original=len(self.tokens), causal=True,
                         pruned=m.pruned_heads if m.stack.pruned else None, windows=m.windows)


def traced(model: AttentionModel, text: str, noun: str = "prompt") -> Traced:
    """``text`` run once on ``model.scratch()``; a sentence for a text that is empty or longer than
    ``PATCH_MAX_TOKENS``, and for a model that is not a language model."""
    scratch = model.scratch("What a head adds to a prediction is read", language=True)
    scratch.token_counts([text], noun)
    enc = scratch._tokenize(text, return_offsets_mapping=True, return_special_tokens_mask=True, verbose=False)
    ids = enc["input_ids"]
    if len(ids) > PATCH_MAX_TOKENS:
        raise HeadLensError(f"The {noun} has {len(ids)} tokens; effects are computed on prompts of at most "
                            f"{PATCH_MAX_TOKENS}.")
    ids = torch.tensor(ids, dtype=torch.long)
    return Traced(scratch, text, ids, scratch.tokenizer.convert_ids_to_tokens(ids.tolist()), P.trace(scratch, ids),
                  list(enc.word_ids()), np.array(enc["special_tokens_mask"], dtype=bool),
                  [tuple(o) for o in enc["offset_mapping"]])


def _same_weights(a: AttentionModel, b: AttentionModel) -> bool:
    """Whether two models on the from-scratch engine are the same network: the same object, or one loaded again from the
    same folder (a model cache may drop one and load it anew) with the same heads."""
    return a is b or (a.name == b.name and a.stack.config == b.stack.config and str(a.device) == str(b.device))


def as_traced(model: AttentionModel, prompt: "str | Traced", noun: str = "prompt") -> Traced:
    """``prompt`` when it is traced already (on ``model`` or ``model.scratch()``), else ``traced(model, prompt)``."""
    if isinstance(prompt, Traced):
        scratch = model.scratch("What a head adds to a prediction is read", language=True)
        if not _same_weights(prompt.model, scratch):
            raise HeadLensError(f"That {noun} was traced on {prompt.model.name}, not on {model.name}.")
        return prompt
    return traced(model, prompt, noun)
