"""One run up a stack, with edits at named points: how every analysis on the from-scratch engine reads or changes a
run, as TransformerLens's hooks serve all of its analyses.

An edit is a function at a point of a layer, keyed ``(point, layer)``: given what flows there, it returns what
flows on (what it was given, to read it; something else, to replace it). The points, in the order a layer
reaches them:

- ``resid_pre``: the residual stream entering the layer, ``(B, n, E)`` (``(N, E)`` packed). An edit may return
  more rows than it was given: copies of a prompt joining the run at this layer (``models.pairs``).
- ``kv``: the keys and values ``(B, H, P, Dh)`` of ``P`` tokens before these, for a causal language model's
  attention; called with None, it returns the pair.
- ``attn_in``: what the attention reads, the normed stream ``(B, n, E)``.
- ``z``: each kept head's output before the output projection, ``(B, kept, n, Dh)`` (TransformerLens's ``hook_z``).
- ``resid_post``: the stream leaving the layer.

``Stack.run_layers(x, edits=...)`` is the run; ``Stack.forward`` and ``Stack.attention_weights`` pass edits on to
it. Edits belong to one call: a model shared by every session holds none. ``trace_batch`` (a prompt's every
``resid_pre`` and ``z``), patching (``models.pairs``), long prompts (``models.long``), head means and value norms
(``models.scratch``) are all runs with edits.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .errors import HeadLensError

POINTS = ("resid_pre", "kv", "attn_in", "z", "resid_post")
ROWS_PER_CHUNK = 4096  # token rows of edited copies run at once (SmolLM2: about 100 MB of feed-forward)

Edit = Callable[[object], object]


class Edits(dict):
    """``{(point, layer): edit}``, the points as ``POINTS`` names them."""

    def __init__(self, edits: Iterable = ()):
        super().__init__(edits)
        wrong = sorted({point for point, _ in self if point not in POINTS})
        if wrong:
            raise ValueError(f"No point is named {wrong}; the points are {list(POINTS)}.")

    @classmethod
    def every_layer(cls, point: str, make: Callable[[int], Edit], layers: Iterable[int]) -> "Edits":
        """``make(layer)`` at ``point`` of each of ``layers``."""
        return cls(((point, layer), make(layer)) for layer in layers)

    def block(self, layer: int) -> dict:
        """What a block takes of these edits at ``layer``: ``hook_in``, ``hook_z`` and (when there is one) ``prefix``."""
        kv = self.get(("kv", layer))
        return {"hook_in": self.get(("attn_in", layer)), "hook_z": self.get(("z", layer)),
                **({} if kv is None else {"prefix": kv(None)})}


def reading(into: list) -> Edit:
    """An edit that reads: what flows there is appended to ``into`` and goes on as it is."""
    def read(value):
        into.append(value)
        return value
    return read


@dataclass(frozen=True)
class Trace:
    """One prompt's run: ``ids`` ``(n,)``; ``resid[l]`` ``(n, E)`` entering layer ``l``, ``resid[-1]`` the
    last layer's output; ``z[l]`` ``(kept heads, n, Dh)`` of layer ``l``. A batch's: each with a first axis ``B``."""

    ids: torch.Tensor
    resid: list[torch.Tensor]
    z: list[torch.Tensor]


def language_stack(model):
    """The stack of ``model`` (from-scratch engine) when it is a pre-norm language model; a sentence otherwise."""
    stack = getattr(model, "stack", None)
    if stack is None or not stack.language_model:
        raise HeadLensError(f"What a head adds to a prediction is read through the unembedding, which {model.name} "
                            "lacks: it is an encoder, not a language model. Choose SmolLM2 or a decoder trained "
                            "here.")
    return stack


@torch.inference_mode()
def trace_batch(model, ids: torch.Tensor) -> Trace:
    """Run ``ids`` ``(B, n)`` through ``model``'s stack once, keeping every layer's ``resid_pre`` ``(B, n, E)`` and
    every head's ``z`` ``(B, kept heads, n, Dh)``."""
    stack = language_stack(model)
    resid, zs = [], []
    layers = range(stack.n_layers)
    edits = Edits({**Edits.every_layer("resid_pre", lambda _: reading(resid), layers),
                   **Edits.every_layer("z", lambda _: reading(zs), layers)})
    x, _ = stack.run_layers(stack.embed(ids.to(model.device)), need_weights=False, edits=edits)
    resid.append(x)
    return Trace(ids, resid, zs)


def trace(model, ids: torch.Tensor) -> Trace:
    """Run ``ids`` ``(n,)`` through ``model``'s stack once, keeping every layer's ``resid_pre`` and ``z``."""
    t = trace_batch(model, ids.view(1, -1))
    return Trace(t.ids[0], [r[0] for r in t.resid], [z[0] for z in t.z])


def as_batch(t: Trace) -> Trace:
    """One prompt's trace as a batch of one."""
    return Trace(t.ids.view(1, -1), [r.unsqueeze(0) for r in t.resid], [z.unsqueeze(0) for z in t.z])
