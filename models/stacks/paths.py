"""A stack's linear path: how what each part writes reaches what each later part reads, and how a head's query and
key read it, each norm's scale frozen at a run's own value (``Stack.path``, ``query_key_sides``).

Levels. A write enters the stream at a level and a read takes it at one: the embeddings and layer ``l``'s attention
write at level ``2 l`` (the embeddings at 0), its feed-forward at ``2 l + 1``; layer ``l``'s attention reads at level
``2 l``, its feed-forward at ``2 l + 1`` and the output at ``2 L`` (``written_level``, ``read_level``). A write at
level ``s`` reaches a read at level ``r`` through whatever the stack puts between them:

- ``Sum``: nothing. The stream a part reads is the plain sum of what was written below it (pre-norm blocks, and
  blocks that norm a part's own output before adding it: Gemma 2 and 3, OLMo-2); each reader's own norm is the
  reader's (``query_key_sides``, the final norm).
- ``PostNorms``: BERT's norms after each write, ``x = LN(x + heads + bias)`` then ``x = LN(x + MLP(x))``: norm ``k``
  sits at level ``k``, and a write at ``s`` reaches a read at ``r`` through norms ``s`` to ``r - 1``. Frozen at a
  run's scales every norm is linear (``FrozenNorms``).

Each path offers the same three things: ``freeze`` (the path at a run's norms: ``through``, ``scores``,
``parts_at``), ``read`` (what a reader reads in a run with some writes switched, the norms as the model applies
them) and ``without`` (a reader's stream with one write taken out, the norms above it recomputed).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .norms import frozen

Level = Callable[[int], torch.Tensor]  # a run's stream (or writes) at a level: (B, n, E)


def written_level(kind: str, layer: int) -> int:
    """Where a part of ``kind`` ("input", "head" or "mlp") of ``layer`` writes into the stream."""
    return 0 if kind == "input" else 2 * layer + (kind == "mlp")


def read_level(kind: str, layer: int) -> int:
    """Where a reader of ``kind`` ("q", "k", "v", "mlp" or the output) of ``layer`` (the output's: the number of
    layers) reads the stream."""
    return 2 * layer + (kind == "mlp")


def part_at(level: int) -> tuple[int, bool]:
    """The layer whose part writes at ``level``, and whether that part is its feed-forward."""
    layer, ffn = divmod(level, 2)
    return layer, bool(ffn)


def _centred(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True)


class Sum:
    """The path of a stack whose stream is the plain sum of what its parts wrote: every write reaches each later
    reader as it is. Frozen, it is itself."""

    def freeze(self, entering: Level, written: Level) -> "Sum":
        return self

    def through(self, part: torch.Tensor, first: int, stop: int | None = None) -> torch.Tensor:
        return part

    def scores(self, delta: torch.Tensor, grads: torch.Tensor, s_levels: np.ndarray,
               r_levels: np.ndarray) -> torch.Tensor:
        """``(writers, readers)``: ``<delta[s], grads[r]>`` summed over everything else, each writer's change
        ``delta`` ``(writers, ...)`` against each reader's gradient ``grads`` ``(readers, ...)``."""
        return delta.reshape(len(delta), -1) @ grads.reshape(len(grads), -1).T

    def parts_at(self, parts: torch.Tensor, s_levels: np.ndarray, level: int) -> torch.Tensor:
        """Each writer's part of the stream at ``level``: its output ``parts`` ``(writers, ...)`` as it is."""
        return parts

    def read(self, mix, level: int) -> torch.Tensor:
        """What readers at ``level`` read: ``mix`` (what their writers wrote, ``summed()`` or by level with
        ``entering()`` and ``written(level)``) summed."""
        return mix.summed()

    def without(self, read: torch.Tensor, entering: Level, written: Level, first: int, level: int,
                change: torch.Tensor) -> torch.Tensor:
        """The stream ``read`` at ``level`` less ``change``, a write at level ``first``."""
        return read - change


SUM = Sum()


class PostNorms:
    """The path of a post-LayerNorm stack (BERT, RoBERTa, DistilBERT): norm ``k`` follows the part writing at level
    ``k`` (``ln_attn`` of layer ``k // 2``, its attention's output bias added first; ``ln_ffn``)."""

    def __init__(self, stack):
        self.stack = stack

    def norm(self, k: int):
        layer, ffn = part_at(k)
        block = self.stack.layers[layer]
        return block.ln_ffn if ffn else block.ln_attn

    def _written(self, written: Level, k: int) -> torch.Tensor:
        """What the part at level ``k`` wrote, its attention's output bias with it."""
        layer, ffn = part_at(k)
        out = written(k)
        return out if ffn else out + self._bias(layer, out)

    def freeze(self, entering: Level, written: Level) -> "FrozenNorms":
        """Every norm with its scale frozen at a run's: ``entering(k)`` the stream the part at level ``k`` read,
        ``written(k)`` what its nodes wrote (its heads', or its feed-forward's)."""
        scales, biases = [], []
        with torch.no_grad():
            for k in range(2 * self.stack.n_layers):
                gain, bias, scale = frozen(self.norm(k), entering(k) + self._written(written, k))
                scales.append(gain * scale)
                biases.append(bias)
        return FrozenNorms(scales, biases, [])

    def read(self, mix, level: int) -> torch.Tensor:
        """What readers at ``level`` read, rebuilt from ``mix``'s input up through the norms as the model applies
        them, each level's writes ``mix.written(k)``."""
        u = mix.entering()
        for k in range(level):
            layer, ffn = part_at(k)
            w = mix.written(k)
            u = self.norm(k)(u + w if ffn else u + w + self._bias(layer, u))
        return u

    def _bias(self, layer: int, like: torch.Tensor) -> torch.Tensor | float:
        bias = self.stack.layers[layer].attn.out_proj.bias
        return 0.0 if bias is None else bias.to(like.dtype)

    def without(self, read: torch.Tensor, entering: Level, written: Level, first: int, level: int,
                change: torch.Tensor) -> torch.Tensor:
        """The stream at ``level`` with ``change`` taken out of what was written at level ``first``, each norm from
        there up recomputed as the model computes it."""
        x = entering(first)
        for k in range(first, level):
            u = x + self._written(written, k)
            if k == first:
                u = u - change
            x = self.norm(k)(u)
        return x


@dataclass(frozen=True)
class FrozenNorms:
    """A post-LayerNorm run's norms, each scale frozen at the run's value: norm ``k`` maps a part ``p`` of what it
    reads to ``(p - mean(p)) * weight / sigma_k``, per token, and adds its bias once. With the scales frozen every
    norm is linear, so the last layer's output is exactly the sum over the writers of each one's part passed through
    the norms above where it writes (``through``), and norm ``k``'s bias after it (``constant``)."""

    scales: list[torch.Tensor]   # per norm, (..., n, E): weight / sigma of each token
    biases: list[torch.Tensor]   # per norm, (E,)
    mlp: list[torch.Tensor]      # per layer, (..., n, E): what its feed-forward wrote (a trace's; empty for a graph's)

    def through(self, part: torch.Tensor, first: int, stop: int | None = None) -> torch.Tensor:
        """``part`` ``(..., n, E)`` (a trace's leading axes, then any, then tokens) passed through norms ``first``
        to ``stop`` (exclusive; all above by default), frozen, without their biases."""
        stop = len(self.scales) if stop is None else stop
        for k in range(first, stop):
            s = self.scales[k]
            s = s.view(*s.shape[:-2], *[1] * (part.dim() - s.dim()), *s.shape[-2:])
            part = _centred(part) * s
        return part

    def constant(self, like: torch.Tensor, stop: int | None = None) -> torch.Tensor:
        """``(..., n, E)``: what the norms' biases below ``stop`` add to the output there (each passed through the
        norms above it), shaped like the trace's residual ``like``."""
        stop = len(self.scales) if stop is None else stop
        out = torch.zeros_like(like)
        for k in range(stop):
            out = out + self.through(self.biases[k].expand_as(like), k + 1, stop)
        return out

    def scores(self, delta: torch.Tensor, grads: torch.Tensor, s_levels: np.ndarray,
               r_levels: np.ndarray) -> torch.Tensor:
        """``(writers, readers)``: ``<through(delta[s]), grads[r]>`` summed over the batch, each writer's change
        ``delta`` ``(writers, B, n, E)`` passed through the norms between its level ``s_levels[s]`` and the reader's
        ``r_levels[r]``, against the reader's gradient ``grads`` ``(readers, B, n, E)``. Computed the other way
        round: each gradient pulled down the norms (a frozen norm's transpose scales, then centres), one level at
        a time."""
        out = delta.new_zeros(len(s_levels), len(r_levels))
        pulled = grads.clone()
        for k in range(int(r_levels.max()), -1, -1):
            active = np.nonzero(r_levels >= k)[0]
            rows = torch.as_tensor(active, device=grads.device)
            writers = np.nonzero(s_levels == k)[0]
            if len(writers):
                d = delta[torch.as_tensor(writers, device=delta.device)].reshape(len(writers), -1)
                out[np.ix_(writers, active)] = d @ pulled[rows].reshape(len(active), -1).T
            if k:
                pulled[rows] = _centred(pulled[rows] * self.scales[k - 1])
        return out

    def parts_at(self, parts: torch.Tensor, s_levels: np.ndarray, level: int) -> torch.Tensor:
        """``(m, B, n, E)``: each writer's part of the stream at ``level``, its output ``parts`` ``(m, B, n, E)``
        (written at ``s_levels``, each below ``level``) passed through the norms between, frozen: the parts sum to
        that stream less what the norms' and the output projections' biases add."""
        parts = parts.clone()
        for k in range(level):
            below = torch.as_tensor(np.nonzero(s_levels <= k)[0], device=parts.device)
            parts[below] = _centred(parts[below]) * self.scales[k]
        return parts


# --- a head's query and key on the path -----------------------------------------------------------------------------

def _side(norm, weight: torch.Tensor, bias: torch.Tensor | None, parts: torch.Tensor,
          x: torch.Tensor) -> torch.Tensor:
    """``(writers + 1, B, n, Dh)``: a projection ``weight`` ``(Dh, E)`` (``bias`` ``(Dh,)``) of the norm of the stream
    ``x`` ``(B, n, E)`` split over ``parts`` ``(writers, B, n, E)`` (summing to ``x`` less a constant) with the norm's
    scale frozen at ``x``'s; the last row is the constant (the stream's unwritten part, the norm's and the projection's
    biases)."""
    gain, norm_bias, scale = frozen(norm, x)
    w = weight.to(x.dtype) * gain                                                   # (Dh, E)
    if isinstance(norm, torch.nn.LayerNorm):  # centring each part is centring the weight's rows
        w = w - w.mean(-1, keepdim=True)
    rest = x - parts.sum(0)                                                        # (B, n, E): the output biases
    out = torch.cat([torch.einsum("sbne,de->sbnd", parts, w), (rest @ w.T).unsqueeze(0)]) * scale  # (S + 1, B, n, Dh)
    constant = 0
    if norm_bias is not None:
        constant = constant + norm_bias @ weight.to(x.dtype).T
    if bias is not None:
        constant = constant + bias.to(x.dtype)
    out[-1] += constant
    return out


def _qk_norm(norm, side: torch.Tensor) -> torch.Tensor:
    """A head-dimension norm (QK-norm) of a split side, its scale frozen at the whole vector's."""
    if norm is None:
        return side
    gain, _, scale = frozen(norm, side.sum(0))
    return side * scale * gain


def query_key_sides(block, parts: torch.Tensor, x: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query head ``i`` (its index among the block's kept heads) of ``block``'s attention and its key/value head, on
    the stream ``x`` ``(B, n, E)`` they read split over ``parts`` ``(writers, B, n, E)`` (summing to ``x`` less a
    constant): ``(writers + 1, B, n, Dh)`` each, the last row the constant, every norm frozen at its value on ``x``
    (the block's input norm; a QK-norm, over the head or, OLMo-2's, over every head's projection), the query times
    the score's scale, both rotated: ``q[:, b, i].sum(0) · k[:, b, j].sum(0)`` is the head's score."""
    attn = block.attn
    g = i if attn.kv_heads is None else attn.kv_heads[i]
    (wq, bq), (wk, bk), _ = attn.head_projections()
    q = _side(block.attention_norm, wq[i], None if bq is None else bq[i], parts, x)
    k = _side(block.attention_norm, wk[g], None if bk is None else bk[g], parts, x)
    if attn.q_norm is not None and attn.qk_norm_over == "projection":  # OLMo-2: over every head's projection
        h = block.attention_input(x)
        whole_q, whole_k, _ = attn.project(h, h, h)
        Dh = attn.head_dim
        q = q * (attn.q_norm.inverse_rms(whole_q) * attn.q_norm.gain()[i * Dh:(i + 1) * Dh]).to(q.dtype)
        k = k * (attn.k_norm.inverse_rms(whole_k) * attn.k_norm.gain()[g * Dh:(g + 1) * Dh]).to(k.dtype)
    else:
        q, k = _qk_norm(attn.q_norm, q), _qk_norm(attn.k_norm, k)
    q = q * (attn.q_factor * attn.head_dim ** -0.5)
    if attn.rotary is not None:
        q, k = attn.rotary(q, k)
    return q, k
