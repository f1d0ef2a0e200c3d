"""One prompt run once for every analysis of it, as TransformerLens hands a clean cache to its patching.

``traced(model, text)`` runs ``text`` once (``models.run.trace``) and keeps what the Effects analyses read: the
token ids and tokens, every layer's residual stream entering it and every head's ``z`` (``models.run.Trace``).
Logit attribution, head and residual patching (a clean and a corrupted ``Traced``), a head's vocabulary and the
routes of a prediction take a ``Traced`` wherever they take a prompt's text, so that one view runs each prompt once.
Its attention weights are read from the kept residual stream, each layer's attention alone (no MLP, no layer run
again), when first asked for.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from models import Attention, AttentionModel, HeadLensError
from models.run import Trace, patching_stack, trace, trace_weights

PATCH_MAX_TOKENS = 256  # per-position patching of every head runs heads x tokens copies of the prompt
WHAT = "What a head adds to a prediction is read"


@dataclass(frozen=True, eq=False)
class Traced:
    """``text`` run once on ``model`` (a language model or an encoder; ``stack``: what the run went up): ``ids``
    ``(n,)``, ``tokens`` and ``trace``."""

    model: AttentionModel
    stack: object
    text: str
    ids: torch.Tensor
    tokens: list[str]
    trace: Trace
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
                found = trace_weights(self.stack, self.trace).to("cpu", torch.float32).numpy()
                found.flags.writeable = False
                self._kept["weights"] = found
            return self._kept["weights"]

    def attention(self) -> Attention:
        """The prompt's attention as the model's run gives it (on the from-scratch engine), from ``weights``."""
        m, stack = self.model, self.stack
        return Attention(tokens=self.tokens, weights=self.weights(), word_ids=self.word_ids, special=self.special,
                         offsets=self.offsets, text=self.text, model_name=m.name, backend="scratch",
                         device=str(m.device), n_tokens_original=len(self.tokens), causal=bool(stack.causal),
                         pruned=stack.pruned_mask() if stack.pruned else None, windows=stack.windows)


def traced(model: AttentionModel, text: str, noun: str = "prompt", stack=None) -> Traced:
    """``text`` run once on ``model`` (a language model or an encoder; its ``stack``, where the caller holds it); a
    sentence for a text that is empty or longer than ``PATCH_MAX_TOKENS``, and for a model the from-scratch engine
    does not implement."""
    stack = stack if stack is not None else patching_stack(model, WHAT)
    model.token_counts([text], noun)
    enc = model.tokenize(text, return_offsets_mapping=True, return_special_tokens_mask=True, verbose=False)
    ids = enc["input_ids"]
    if len(ids) > PATCH_MAX_TOKENS:
        raise HeadLensError(f"The {noun} has {len(ids)} tokens; effects are computed on prompts of at most "
                            f"{PATCH_MAX_TOKENS}.")
    ids = torch.tensor(ids, dtype=torch.long)
    return Traced(model, stack, text, ids, model.tokenizer.convert_ids_to_tokens(ids.tolist()),
                  trace(model, ids, stack),
                  list(enc.word_ids()), np.array(enc["special_tokens_mask"], dtype=bool),
                  [tuple(o) for o in enc["offset_mapping"]])


def _same_weights(a: Traced, model: AttentionModel, stack) -> bool:
    """Whether ``a`` was traced on the network ``model`` runs: the same stack, or one loaded again from the same
    folder (a model cache may drop one and load it anew) with the same heads."""
    return a.stack is stack or (a.model.name == model.name and a.stack.config == stack.config
                                and str(a.model.device) == str(model.device))


def as_traced(model: AttentionModel, prompt: "str | Traced", noun: str = "prompt", stack=None) -> Traced:
    """``prompt`` when it is traced already (on ``model``, on either engine), else ``traced(model, prompt)``;
    ``stack``: ``model``'s, where the caller holds it."""
    stack = stack if stack is not None else patching_stack(model, WHAT)
    if isinstance(prompt, Traced):
        if not _same_weights(prompt, model, stack):
            raise HeadLensError(f"That {noun} was traced on {prompt.model.name}, not on {model.name}.")
        return prompt
    return traced(model, prompt, noun, stack)
