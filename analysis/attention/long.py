"""Views of a long prompt (``models.long.LongAttention``): pooled heatmaps, zooms and per-head figures,
each computed from the weights of the layer and heads shown, never from a whole layer held at once.

A view hides what ``views.set_aside`` names when asked (special tokens, a decoder's first-token
sink) and renormalises each row, as ``make_view`` does; words are not merged (a 4,096-token text
is drawn in blocks of tokens anyway).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.long import LongAttention
from models.long_scan import LayerFigures

from .views import _marked, set_aside

CELLS = 128  # cells along a pooled heatmap's axis, as ``viz.figures.MAX_CELLS``
ZOOM = 128  # tokens along each axis of a zoom: every weight drawn


@dataclass(frozen=True)
class Grid:
    """One layer's heads as pooled heatmaps draw them.

    Attributes:
        weights: ``(len(heads), query blocks, key blocks)``, the largest weight of each block.
        q_starts, k_starts: the first row and column of each block, counted in the view's tokens.
        hidden: bool ``(query blocks, key blocks)``: no query of the block sees any of its keys
            (a causal view); None when every query sees every key.
        figures: per head, from every query row (None for a grid of some rows).
        rows: the view's query rows drawn, ``(start, stop)``.
    """

    weights: np.ndarray
    q_starts: np.ndarray
    k_starts: np.ndarray
    hidden: np.ndarray | None
    figures: LayerFigures | None
    rows: tuple[int, int]


@dataclass(frozen=True, eq=False)
class LongView:
    """A long prompt as the sidebar's "hide special tokens" shows it.

    Attributes:
        attention: the prompt.
        labels: readable tokens of the view, in order (queries and keys are the same tokens).
        keep: the prompt's positions the view shows, in order.
        special: bool per label, the tokens ``set_aside`` names.
        hide: bool per prompt token, those left out (None: nothing hidden).
        causal: a query sees only its own and earlier tokens.
    """

    attention: LongAttention
    labels: list[str]
    keep: np.ndarray
    special: np.ndarray
    hide: np.ndarray | None
    causal: bool

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def cache_key(self) -> tuple:
        """What names this view in a key of something computed from it: its prompt, and whether it hides tokens."""
        return (*self.attention.cache_key, self.hide is not None)

    @property
    def query_labels(self) -> list[str]:  # queries and keys are the same tokens; named as ``View`` names them
        return self.labels

    @property
    def query_special(self) -> np.ndarray:
        return self.special

    def strongest(self, layer: int, heads: list[int], query: int, k: int = 8) -> pd.DataFrame:
        """The ``k`` keys each head gives most weight from the view's ``query``: ``head``, ``rank`` (from 1),
        ``key`` (view position), ``token``, ``weight`` and ``back`` (how many tokens before the query)."""
        w = self.rows(layer, heads, (query, query + 1))[:, 0]                   # (heads, keys)
        k = min(k, w.shape[1])
        order = np.argsort(-w, axis=1, kind="stable")[:, :k]
        return pd.DataFrame([{"head": h, "rank": r + 1, "key": int(j), "token": self.labels[j], "weight": float(w[i, j]),
                              "back": int(self.keep[query] - self.keep[j])}
                             for i, h in enumerate(heads) for r, j in enumerate(order[i])])

    def grid(self, layer: int, heads: list[int], cells: int = CELLS, last: int | None = None) -> Grid:
        """Heads ``heads`` of ``layer`` pooled into at most ``cells`` blocks a side; ``last``: only the last
        this many query rows (drawn one row a cell when they fit), else every row, with per-head figures."""
        m = len(self.labels)
        rows = (0, m) if not last else (max(0, m - int(last)), m)
        q_step = max(1, math.ceil((rows[1] - rows[0]) / cells))
        k_step = max(1, math.ceil(m / cells))
        pooled, figures = self.attention.scan(layer, heads, q_step, k_step, hide=self.hide,
                                              rows=None if rows == (0, m) else rows, aside=self.aside)
        q_starts = np.arange(rows[0], rows[1], q_step)
        k_starts = np.arange(0, m, k_step)
        return Grid(pooled, q_starts, k_starts, self.hidden_blocks(q_starts, k_starts, rows[1], layer), figures, rows)

    @property
    def aside(self) -> np.ndarray:
        return set_aside(self.attention)

    def window(self, layer: int | None) -> int | None:
        """The sliding window of the model's ``layer`` (``Attention.windows``); None when it sees every key."""
        windows = self.attention.windows
        return None if layer is None or windows is None else windows[layer]

    def hidden_blocks(self, q_starts: np.ndarray, k_starts: np.ndarray, q_stop: int | None = None,
                      layer: int | None = None) -> np.ndarray | None:
        """bool per (query block, key block): no query of the block sees a key of it (causal views; in a
        sliding ``layer``, keys a window or more behind every query of the block too)."""
        if not self.causal:
            return None
        q_stop = len(self.labels) if q_stop is None else q_stop
        q_last = np.append(q_starts[1:], q_stop) - 1      # last view row of each block
        hidden = self.keep[q_last][:, None] < self.keep[k_starts][None, :]
        window = self.window(layer)
        if window is not None:
            k_last = np.append(k_starts[1:], len(self.labels)) - 1
            hidden |= self.keep[q_starts][:, None] - self.keep[k_last][None, :] >= window
        return hidden

    def exact(self, layer: int, head: int, queries: tuple[int, int], keys: tuple[int, int]) -> np.ndarray:
        """Every weight of ``head`` for the view's query rows and key columns ``(start, stop)``, as the
        view shows them (hidden tokens left out, rows renormalised): ``(rows, keys)`` float32."""
        q0, q1 = queries
        k0, k1 = keys
        rows = self.keep[q0:q1]
        w = self.attention.weights(layer, [head], queries=(int(rows[0]), int(rows[-1]) + 1))[0]
        w = w[rows - rows[0]]
        if self.hide is not None:
            w = w[:, self.keep]
            total = w.sum(axis=1, keepdims=True)
            w = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
        return np.ascontiguousarray(w[:, k0:k1])

    def rows(self, layer: int, heads: list[int], queries: tuple[int, int]) -> np.ndarray:
        """Every weight of the view's query rows ``queries`` against every key: ``(heads, rows, keys)``."""
        return np.stack([self.exact(layer, h, queries, (0, len(self.labels))) for h in heads])

    def received(self, layer: int, head: int) -> np.ndarray:
        """The mean over the view's queries of the weight each key gets from ``head``: ``(keys,)``."""
        return self.attention.scan(layer, [head], hide=self.hide, aside=self.aside, pool=False, received=True)[1].received[0]

    def rollout(self, query: int, layers: tuple[int, int], residual: float = 0.5, progress=None) -> np.ndarray:
        """Attention rollout (Abnar & Zuidema 2020) to the view's ``query`` through layers ``layers[0]`` to
        ``layers[1]`` (inclusive): how much each token entering the first reaches the query after the last,
        ``(keys,)`` summing to 1. Each layer is ``r I + (1 - r) W``, ``W`` the mean of its heads as the view
        shows them, rows renormalised, as ``analysis.rollout`` takes it; only the query's row is carried
        down, through one pass over each layer's weights. ``progress(done, layers)``."""
        lo, hi = (int(x) for x in layers)
        att = self.attention
        if not 0 <= lo <= hi < att.n_layers:
            raise ValueError(f"layers {layers} outside 0–{att.n_layers - 1}")
        heads = list(range(att.n_heads))
        m = len(self.labels)
        row = np.zeros(m)
        row[query] = 1.0
        for i, layer in enumerate(range(hi, lo - 1, -1)):
            share = sum(att.heads_on(layer, heads)) / att.n_heads   # each row of the mean of heads sums to this
            c = row / (residual + (1 - residual) * share)
            mixed = att.scan(layer, heads, hide=self.hide, aside=self.aside, pool=False, times=c)[1].mixed
            row = residual * c + (1 - residual) * mixed.mean(axis=0)
            if progress is not None:
                progress(i + 1, hi - lo + 1)
        return row.astype(np.float32)

    def visible(self, queries: tuple[int, int], keys: tuple[int, int], layer: int | None = None) -> np.ndarray | None:
        """bool ``(rows, keys)`` of a zoom: which keys each query could see in the model's ``layer``; None when
        it saw them all."""
        if not self.causal:
            return None
        q, k = self.keep[queries[0]:queries[1]][:, None], self.keep[keys[0]:keys[1]][None, :]
        seen = k <= q
        window = self.window(layer)
        return seen if window is None else seen & (q - k < window)


def long_view(att: LongAttention, *, hide_special: bool = False) -> LongView:
    """``att`` as a view shows it: its readable tokens, and with ``hide_special`` without what
    ``set_aside`` names."""
    aside = set_aside(att)
    hide = aside if hide_special and aside.any() else None
    keep = np.arange(len(att.tokens)) if hide is None else np.flatnonzero(~hide)
    labels = [_marked(att, i, i + 1) for i in keep]
    return LongView(att, labels, keep, aside[keep], hide, bool(att.causal))


def zoom_window(n: int, start: int, size: int = ZOOM) -> tuple[int, int]:
    """``(start, stop)`` of a zoom of ``size`` tokens starting near ``start``, kept inside ``n`` tokens."""
    size = min(size, n)
    start = min(max(0, int(start)), n - size)
    return start, start + size


@dataclass(frozen=True)
class Survey:
    """Every head of a long prompt, one layer at a time: thumbnails and per-head figures.

    Attributes:
        pooled: ``(layers, heads, cells, cells)`` the largest weight of each block.
        hidden: bool ``(cells, cells)``: blocks no query sees (causal), or None.
        entropy, max_weight, aside, first, distance: ``(layers, heads)``, as ``LayerFigures`` gives them.
    """

    pooled: np.ndarray
    hidden: np.ndarray | None
    entropy: np.ndarray
    max_weight: np.ndarray
    aside: np.ndarray
    first: np.ndarray
    distance: np.ndarray


def survey(v: LongView, cells: int = 96, progress=None) -> Survey:
    """Every layer of ``v``'s prompt pooled to ``cells`` blocks a side, with each head's figures: the
    forward pass and then each layer's weights, one layer at a time. ``progress(done, layers)``."""
    att = v.attention
    m = len(v)
    step = max(1, math.ceil(m / cells))
    heads = list(range(att.n_heads))
    pooled, figures = [], []
    for layer in range(att.n_layers):
        grid, fig = att.scan(layer, heads, step, step, hide=v.hide, aside=v.aside)
        pooled.append(grid)
        figures.append(fig)
        if progress is not None:
            progress(layer + 1, att.n_layers)
    starts = np.arange(0, m, step)
    stacked = {name: np.stack([getattr(f, name) for f in figures]) for name in
               ("entropy", "max_weight", "aside", "first", "distance")}
    return Survey(np.stack(pooled), v.hidden_blocks(starts, starts), **stacked)


def reach(att) -> tuple[np.ndarray, np.ndarray]:
    """For a whole ``Attention``: each head's mean attention distance (tokens, Vig & Belinkov 2019) and
    the mean weight the queries after the first put on the first token, ``(layers, heads)`` each."""
    w = att.weights
    n = w.shape[-1]
    position = np.arange(n, dtype=np.float32)
    if att.causal and att.keys is None:  # keys at or before each query: sum_j w_ij (i - j)
        distance = (position * w.sum(-1) - w @ position).mean(-1)
    else:
        distance = (w * np.abs(position[:, None] - position[None, :])).sum(-1).mean(-1)
    first = w[..., 1:, 0].mean(-1) if w.shape[-2] > 1 else np.zeros(w.shape[:2], dtype=np.float32)
    return distance.astype(np.float32), first.astype(np.float32)
