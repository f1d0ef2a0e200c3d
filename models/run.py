"""One run up a stack, with edits at named points: how every analysis on the from-scratch engine reads or changes a
run, as TransformerLens's hooks serve all of its analyses.

An edit is a function at a point of a layer, keyed ``(point, layer)``: given what flows there, it returns what
flows on (what it was given, to read it; something else, to replace it). The points, in the order a layer
reaches them (TransformerLens's names in brackets):

- ``resid_pre``: the residual stream entering the layer, ``(B, n, E)`` (``(N, E)`` packed). An edit may return
  more rows than it was given: copies of a prompt joining the run at this layer (``analysis.effects.batched``).
- ``kv``: the keys and values ``(B, H, P, Dh)`` of ``P`` tokens before these, for a causal language model's
  attention; called with None, it returns the pair.
- ``attn_in``: what the attention reads, the normed stream ``(B, n, E)``.
- ``qkv_in`` (``hook_q_input``, ``hook_k_input``, ``hook_v_input``): the stream each query head, then each
  key/value head's keys, then its values read before the norm, ``(H + 2 G, B, n, E)``; given the residual stream
  repeated (a view). An edit here, or at ``result``, runs the layer's attention head by head, each head reading
  its own stream and writing apart (a language model's, unpadded); it may return ``Given`` to stand in for the
  attention, which then does not run.
- ``pattern`` (``hook_pattern``): the weights ``(B, kept, n, keys)`` after the softmax, before they mix the values;
  an edit here has the attention form them (never the fused path) and may replace them.
- ``z`` (``hook_z``): each kept head's output before the output projection, ``(B, kept, n, Dh)``.
- ``result`` (``hook_result``): each kept head's write into the stream, ``(kept, B, n, E)`` (in a block that
  norms its attention's output, each head's share of the normed write).
- ``mlp_in``, ``mlp_out``: the stream the feed-forward part reads and what it writes into the stream; an edit at
  ``mlp_in`` may return ``Given`` to stand in for the part.
- ``resid_post``: the stream leaving the layer.

``Stack.run_layers(x, edits=...)`` is the run; ``Stack.forward`` and ``Stack.attention_weights`` pass edits on to
it, and switch heads off by edits (``switched_off``). Edits belong to one call: a model shared by every session
holds none. A prompt's trace (``trace_batch``: every ``resid_pre`` and ``z``), patching and circuits
(``analysis.effects``, ``analysis.circuits``), the QK split, long prompts (``models.long``), head means and value
norms (``models.scratch``) are all runs with edits.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .errors import HeadLensError

POINTS = ("resid_pre", "kv", "attn_in", "qkv_in", "pattern", "z", "result", "mlp_in", "mlp_out", "resid_post")
BY_HEAD = ("qkv_in", "result")  # the points that run a layer's attention head by head
ROWS_PER_CHUNK = 4096  # token rows of edited copies run at once (SmolLM2: about 100 MB of feed-forward)

Edit = Callable[[object], object]


@dataclass(frozen=True)
class Given:
    """What an edit at ``qkv_in`` or ``mlp_in`` returns to stand in for the part it feeds, which then does not run:
    the part's ``writes`` (``(kept, B, n, E)`` for an attention, its heads' writes; ``(B, n, E)`` for a feed-forward)
    and an attention's ``constant`` write (its output bias, through a norm on the output; None without)."""

    writes: torch.Tensor
    constant: torch.Tensor | None = None


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

    def then(self, other: "Edits | None") -> "Edits":
        """These edits and ``other``'s, one after the other where both edit a point."""
        if not other:
            return self
        out = Edits(self)
        for key, second in other.items():
            first = out.get(key)
            out[key] = second if first is None else _chained(first, second)
        return out

    def at(self, layer: int) -> dict[str, Edit]:
        """``{point: edit}`` of ``layer``: what its block is handed."""
        return {point: edit for (point, at), edit in self.items() if at == layer}


def _chained(first: Edit, second: Edit) -> Edit:
    return lambda value: second(first(value))


def reading(into: list) -> Edit:
    """An edit that reads: what flows there is appended to ``into`` and goes on as it is."""
    def read(value):
        into.append(value)
        return value
    return read


def switched_off(layers: Iterable[tuple[int, torch.Tensor, torch.Tensor | None]]) -> Edits:
    """Heads switched off: for each ``(layer, mask, fill)`` (``mask`` ``(kept,)`` 1 keeps a head, 0 switches it
    off; ``fill`` ``(kept, Dh)`` what a switched-off head outputs instead of zero, such as its mean: mean
    ablation), a ``z`` edit."""
    def make(mask: torch.Tensor, fill: torch.Tensor | None) -> Edit:
        def off(z):                                                            # (B, kept, n, Dh)
            H = z.shape[1]
            z = z * mask.to(z.dtype).view(1, H, 1, 1)
            if fill is not None:
                z = z + (1 - mask.to(z.dtype)).view(1, H, 1, 1) * fill.to(z.dtype).view(1, H, 1, -1)
            return z
        return off
    return Edits((("z", layer), make(mask, fill)) for layer, mask, fill in layers)


@dataclass(frozen=True)
class Trace:
    """One prompt's run: ``ids`` ``(n,)``; ``resid[l]`` ``(n, E)`` entering layer ``l``, ``resid[-1]`` the
    last layer's output; ``z[l]`` ``(kept heads, n, Dh)`` of layer ``l``. A batch's: each with a first axis ``B``."""

    ids: torch.Tensor
    resid: list[torch.Tensor]
    z: list[torch.Tensor]


def editable(model, what: str = "This"):
    """``model`` (any loaded model) as its runs take edits, head masks and pruning: itself on the from-scratch engine,
    or a transformers model's twin with the same weights; the one place an analysis is handed to that engine.
    ``what`` starts the sentence for an architecture the engine does not implement."""
    return model.scratch(what)


def stack_of(model, what: str = "This"):
    """The stack every run of ``model`` (any loaded model) goes up (``editable``'s)."""
    return editable(model, what).stack


def offers(model) -> frozenset[str]:
    """What ``model`` (any loaded model) offers beyond attention, as its stack declares it (``Stack.offers``:
    ``detector``, ``vocabulary``, ``embedding``); nothing for an architecture the from-scratch engine does not
    implement or an encoder-decoder."""
    if getattr(model, "encoder_decoder", False):
        return frozenset()
    try:
        return stack_of(model).offers
    except HeadLensError:
        return frozenset()


def language_stack(model, what: str = "What a head adds to a prediction is read"):
    """``stack_of(model)`` when it is a pre-norm language model's (logits, a next-token prediction); a sentence
    otherwise."""
    stack = stack_of(model, what)
    if not stack.language_model:
        raise HeadLensError(f"{what} on a language model; {model.name} is an encoder, not a language model. Choose "
                            "SmolLM2, Gemma 3 or a decoder trained here.")
    return stack


def patching_stack(model, what: str = "Patching replaces a head's output"):
    """``stack_of(model)`` for a run that patches and measures: a language model's (logits at the last token) or an
    encoder's (a sentence embedding, a masked token's logits); a sentence for an architecture the engine does not
    implement."""
    return stack_of(model, what)


def device_of(stack) -> torch.device:
    """Where a stack's weights are."""
    return next(stack.parameters()).device


@torch.inference_mode()
def trace_batch(model, ids: torch.Tensor, stack=None) -> Trace:
    """Run ``ids`` ``(B, n)`` through ``model``'s stack (``stack``, where the caller holds it) once, keeping every
    layer's ``resid_pre`` ``(B, n, E)`` and every head's ``z`` ``(B, kept heads, n, Dh)``: a language model's run or
    an encoder's."""
    stack = stack if stack is not None else patching_stack(model)
    resid, zs = [], []
    layers = range(stack.n_layers)
    edits = Edits({**Edits.every_layer("resid_pre", lambda _: reading(resid), layers),
                   **Edits.every_layer("z", lambda _: reading(zs), layers)})
    x, _ = stack.run_layers(stack.embed(ids.to(device_of(stack))), need_weights=False, edits=edits)
    resid.append(x)
    return Trace(ids, resid, zs)


def trace(model, ids: torch.Tensor, stack=None) -> Trace:
    """Run ``ids`` ``(n,)`` through ``model``'s stack (``stack``) once, keeping every layer's ``resid_pre`` and
    ``z``."""
    t = trace_batch(model, ids.view(1, -1), stack)
    return Trace(t.ids[0], [r[0] for r in t.resid], [z[0] for z in t.z])


def as_batch(t: Trace) -> Trace:
    """One prompt's trace as a batch of one."""
    return Trace(t.ids.view(1, -1), [r.unsqueeze(0) for r in t.resid], [z.unsqueeze(0) for z in t.z])


@torch.inference_mode()
def trace_weights(stack, t: Trace) -> torch.Tensor:
    """``(layers, heads, n, n)`` (``(B, layers, heads, n, n)`` for a batch's trace): every head's attention weights
    (zero for a pruned head), each layer's read from the residual stream the trace kept entering it, that layer run
    as far as its attention alone."""
    single = t.resid[0].dim() == 2
    out = []
    for layer in range(stack.n_layers):
        resid = t.resid[layer]
        _, (weights,) = stack.run_layers(resid.unsqueeze(0) if single else resid, start=layer, stop=layer + 1,
                                         last="attention")
        out.append(weights)
    weights = torch.stack(out, 1)                                                    # (B, L, H, n, n)
    return weights[0] if single else weights
