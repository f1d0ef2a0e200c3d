"""What a view of a long prompt reads of a layer in one pass over its weights, a block of query rows at a time:
the largest weight of each display block (``pooled``) and each head's figures (``figures``): entropy, largest
weight, share on the tokens set aside and on the first token, mean distance, what each key receives, and
the step of rollout. ``LongAttention`` computes the blocks; these are its views.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .errors import HeadLensError
from .memory import release_memory


@dataclass(frozen=True)
class LayerFigures:
    """Per head of one layer, from every query row. ``(heads,)`` float32 each.

    Attributes:
        entropy: mean over query rows of each row's entropy (nats), after ``hide``.
        max_weight: the largest weight, after ``hide``.
        aside: mean over query rows of the weight on the tokens ``hide`` names (before hiding them).
        first: mean over query rows after the first of the weight on the first token (a sink's share).
        distance: mean over query rows of ``sum_j a_ij |i - j|``: how far back (or away) a head looks,
            in tokens (Vig & Belinkov 2019).
        received: when asked, ``(heads, keys)``: the mean over query rows of the weight each key gets,
            after ``hide`` (its keys counted among those left).
        mixed: when asked with a row vector ``c`` (one entry per row left), ``(heads, keys)``: ``c``
            times each head's weights after ``hide``, the step of attention rollout.
    """

    entropy: np.ndarray
    max_weight: np.ndarray
    aside: np.ndarray
    first: np.ndarray
    distance: np.ndarray
    received: np.ndarray | None = None
    mixed: np.ndarray | None = None


class Scans:
    """``pooled``, ``figures`` and ``scan`` of a ``LongAttention`` (which gives ``blocks``, ``heads_on`` and the rest)."""

    def pooled(self, layer: int, heads: Sequence[int] | None = None, q_step: int = 1, k_step: int = 1,
               hide: np.ndarray | None = None, rows: tuple[int, int] | None = None) -> np.ndarray:
        """The largest weight in each block of ``q_step`` query rows by ``k_step`` keys, as
        ``viz.figures.pool`` takes it of the exact weights: ``(len(heads), blocks, blocks)`` float32.

        ``hide``: bool per token; those rows and columns are dropped first and each row renormalised
        (a view's "hide special tokens"); blocks then count the tokens left. ``rows``: only these
        query rows (of the tokens left), such as the last k.
        """
        return self.scan(layer, heads, q_step, k_step, hide, rows)[0]

    def figures(self, layer: int, heads: Sequence[int] | None = None, hide: np.ndarray | None = None,
                aside: np.ndarray | None = None) -> LayerFigures:
        """Per-head figures of ``layer`` from every query row (see ``LayerFigures``)."""
        return self.scan(layer, heads, hide=hide, aside=aside, pool=False)[1]

    def scan(self, layer: int, heads: Sequence[int] | None = None, q_step: int = 1, k_step: int = 1,
             hide: np.ndarray | None = None, rows: tuple[int, int] | None = None, aside: np.ndarray | None = None,
             pool: bool = True, received: bool = False,
             times: np.ndarray | None = None) -> tuple[np.ndarray | None, LayerFigures | None]:
        """``pooled`` and ``figures`` in one pass over the layer's weights; figures only when ``rows`` is None.
        ``aside`` (bool per token, default ``hide``): the tokens whose share ``LayerFigures.aside`` is.
        ``received``: figures include what each key receives; ``times`` (one float per row left): figures
        include ``times`` times each head's weights (``LayerFigures.mixed``)."""
        heads = self._heads(heads)
        n, h = len(self.tokens), len(heads)
        dev = self.stack.layers[0].attn.out_proj.weight.device
        hide = None if hide is None or not np.any(hide) else np.asarray(hide, dtype=bool)
        keep = np.arange(n) if hide is None else np.flatnonzero(~hide)
        if not len(keep):
            raise HeadLensError("Every token is hidden; show special tokens to see this text's attention.")
        m = len(keep)
        r0, r1 = self._range(rows, m, "query")
        shown = keep[r0:r1]                                   # prompt positions of the rows drawn
        keep_t = torch.as_tensor(keep, device=dev)
        hidden = None if hide is None else torch.as_tensor(np.flatnonzero(hide), device=dev)
        aside = hide if aside is None else np.asarray(aside, dtype=bool)
        aside_t = None if aside is None or not aside.any() else torch.as_tensor(aside, dtype=torch.float32, device=dev)
        want = rows is None
        nqb, nkb = math.ceil((r1 - r0) / q_step), math.ceil(m / k_step)
        pooled = torch.zeros(h, nqb, nkb, device=dev) if pool else None
        sums = torch.zeros(4, h, dtype=torch.float64, device=dev)  # entropy, aside, first, distance
        top = torch.zeros(h, device=dev)
        taken = torch.zeros(h, m, dtype=torch.float64, device=dev) if received and want else None
        mixed = torch.zeros(h, m, dtype=torch.float64, device=dev) if times is not None and want else None
        times_t = None if mixed is None else torch.as_tensor(np.asarray(times, dtype=np.float32), device=dev)
        on = torch.tensor(self.heads_on(layer, heads), dtype=torch.float32, device=dev).view(-1, 1)
        position = torch.arange(n, device=dev, dtype=torch.float32)
        columns = np.stack([np.arange(n, dtype=np.float32),
                            np.zeros(n, np.float32) if aside is None else aside.astype(np.float32)], axis=1)
        done, carry = 0, None  # rows drawn so far; rows left over from the last block, fewer than q_step
        aligned = hide is None
        with torch.inference_mode():
            for block in self.blocks(layer, heads, rows=(int(shown[0]), int(shown[-1]) + 1),
                                     step=q_step if aligned else 1, with_entropy=want, columns=columns):
                start, stop, w = block[:3]
                seen = w.shape[-1]
                if want:
                    if start == 0 and stop > 1:
                        sums[2] += w[:, 1:, 0].sum(dim=1)
                    elif start > 0:
                        sums[2] += w[:, :, 0].sum(dim=1)
                    weighted = block[4]                                               # (h, rows, 2): w @ [pos, aside]
                    if aside_t is not None:
                        sums[1] += weighted[..., 1].sum(dim=1)
                    if self.causal:  # every key at or before the query: sum_j w_ij (i - j)
                        sums[3] += (position[start:stop] * on - weighted[..., 0]).sum(dim=1)
                    else:
                        gap = (position[start:stop].view(-1, 1) - position[:seen].view(1, -1)).abs_()
                        sums[3] += (w * gap).sum(dim=(1, 2))
                    entropy = block[3]                                                    # (h, rows)
                # rows and keys of the view: hidden ones left out, rows renormalised over what is left
                inside = np.flatnonzero((shown >= start) & (shown < stop))
                row_index = shown[inside] - start
                if hide is not None:
                    gone = w.index_select(2, hidden[hidden < seen])                        # (h, rows, few)
                    left = (1.0 - gone.sum(dim=-1)).clamp_min_(0.0)                        # T, each row's remaining share
                    scale = torch.where(left > 0, 1.0 / left.clamp_min(1e-30), torch.zeros_like(left))
                    if want:  # H' = (H + sum_hidden w log w) / T + log T over what is left
                        entropy = torch.where(left > 0, (entropy + torch.special.xlogy(gone, gone).sum(dim=-1)) * scale
                                              + torch.log(left.clamp_min(1e-30)), torch.zeros_like(left))
                    cols = int(np.searchsorted(keep, seen))                                # kept keys it may see
                    w = _cut(w, 2, keep[:cols], keep_t[:cols])
                    w = _cut(w, 1, row_index, None)
                    w = w.mul_(scale.index_select(1, torch.as_tensor(row_index, device=dev)).unsqueeze(-1))
                elif len(row_index) < w.shape[1]:
                    w = _cut(w, 1, row_index, None)
                if taken is not None:
                    taken[:, :w.shape[-1]] += w.sum(dim=1).double()
                if mixed is not None:
                    c = times_t[torch.as_tensor(r0 + inside, device=dev)]
                    mixed[:, :w.shape[-1]] += torch.matmul(c.view(1, 1, -1), w)[:, 0].double()
                if want:
                    sums[0] += entropy.index_select(1, torch.as_tensor(row_index, device=dev)).sum(dim=1).double()
                    if not pool:
                        top = torch.maximum(top, w.amax(dim=(1, 2)))
                if pool and w.shape[1]:
                    if carry is not None:
                        w = torch.cat([torch.nn.functional.pad(carry, (0, w.shape[-1] - carry.shape[-1])), w], dim=1)
                        carry = None
                    whole = w.shape[1] // q_step * q_step
                    if done + w.shape[1] < r1 - r0 and whole < w.shape[1]:
                        carry, w = w[:, whole:], w[:, :whole]
                    if w.shape[1]:
                        part = torch.nn.functional.max_pool2d(w.unsqueeze(1), (q_step, k_step), ceil_mode=True)[:, 0]
                        b0 = done // q_step
                        pooled[:, b0:b0 + part.shape[1], :part.shape[2]] = part
                        done += w.shape[1]
        release_memory()
        figures = None
        if want:
            if pool:
                top = pooled.amax(dim=(1, 2))
            sums = sums.float().cpu().numpy()
            figures = LayerFigures(entropy=sums[0] / m, max_weight=top.cpu().numpy(), aside=sums[1] / n,
                                   first=sums[2] / max(1, n - 1), distance=sums[3] / n,
                                   received=None if taken is None else (taken / m).float().cpu().numpy(),
                                   mixed=None if mixed is None else mixed.cpu().numpy())
        return (None if pooled is None else pooled.cpu().numpy()), figures


def _cut(w: torch.Tensor, dim: int, index: np.ndarray, index_t: torch.Tensor | None) -> torch.Tensor:
    """``w`` along ``dim`` at ``index`` (sorted): a slice, which copies nothing, when the index is a run."""
    if len(index) == w.shape[dim] and (not len(index) or index[0] == 0):
        return w
    if len(index) and index[-1] - index[0] == len(index) - 1:
        return w.narrow(dim, int(index[0]), len(index))
    return w.index_select(dim, index_t if index_t is not None else torch.as_tensor(index, device=w.device))
