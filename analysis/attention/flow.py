"""Across layers: which input tokens an output position draws on (Abnar & Zuidema, 2020).

One head's weights say where a layer looks, not which *input* tokens reach a position once several
layers have mixed them. Both answers here model each layer as ``A_l = r I + (1 - r) W_l`` (``W_l``
the mean of the layer's heads, or one chosen head; ``r`` the residual connection's share), each
row renormalised:

- **rollout** multiplies them: ``R_0 = A_0``, ``R_l = A_l @ R_{l-1}``;
- **flow** treats them as capacities of a graph with a node per (layer boundary, token) and an
  edge from ``(l + 1, i)`` down to ``(l, j)`` of capacity ``A_l[i, j]``, and takes the maximum flow
  from the last layer's token ``i`` to input token ``j``, each row normalised to sum 1.

Both take an ``Attention`` or a ``View`` (hidden special tokens, merged words): anything with
square ``weights`` of shape ``(layers, heads, n, n)``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow

from models.errors import HeadLensError

from .views import set_aside

FLOW_MAX_TOKENS = 64  # flow solves n² max-flow problems on a graph of layers x n² edges
FLOW_SCALE = 1_000_000  # scipy's solver takes whole-number capacities: weights in millionths


def layer_matrices(att, *, residual: float = 0.5, heads: Sequence[int] | None = None) -> np.ndarray:
    """``(layers, n, n)``: each layer's ``r I + (1 - r) W``, rows renormalised.

    Args:
        att: an ``Attention`` or a ``View`` with weights ``(layers, heads, n, n)``.
        residual: the share ``r`` of the skip connection, in [0, 1].
        heads: one head per layer to use instead of the mean of the layer's heads.
    """
    weights = att.weights  # float32; only the (layers, n, n) it comes down to is made float64
    n_layers, n_heads, n_q, n_k = weights.shape
    if n_q != n_k:
        raise HeadLensError("Rollout and flow follow a token through the layers of one stack of "
                            "self-attention; cross-attention has other tokens on its key side.")
    if not 0 <= residual <= 1:
        raise HeadLensError(f"The residual share must lie between 0 and 1; it is {residual}.")
    if heads is None:
        mixed = weights.mean(axis=1, dtype=np.float64)
    else:
        heads = list(heads)
        if len(heads) != n_layers or not all(0 <= h < n_heads for h in heads):
            raise HeadLensError(f"Give one head per layer, {n_layers} in all, each from 0 to {n_heads - 1}.")
        mixed = np.asarray(weights[np.arange(n_layers), heads], dtype=np.float64)
    a = residual * np.eye(n_q) + (1 - residual) * mixed
    sums = a.sum(axis=-1, keepdims=True)
    return a / np.where(sums > 0, sums, 1.0)


def rollout(att, *, residual: float = 0.5, heads: Sequence[int] | None = None) -> np.ndarray:
    """``(layers, n, n)``: entry ``[l, i, j]`` is how much input token ``j`` reaches position ``i``
    after layer ``l``; every row sums to 1."""
    a = layer_matrices(att, residual=residual, heads=heads)
    out = np.empty_like(a)
    out[0] = a[0]
    for layer in range(1, len(a)):
        out[layer] = a[layer] @ out[layer - 1]
    return out.astype(np.float32)


def flow(att, *, residual: float = 0.5, heads: Sequence[int] | None = None,
         max_tokens: int = FLOW_MAX_TOKENS) -> np.ndarray:
    """``(n, n)``: the maximum flow from the last layer's token ``i`` to input token ``j``, rows
    normalised to sum 1. Texts over ``max_tokens`` tokens get a sentence: the cost grows as n⁴."""
    a = layer_matrices(att, residual=residual, heads=heads)
    n_layers, n, _ = a.shape
    if n > max_tokens:
        raise HeadLensError(f"Attention flow solves a max-flow problem for every pair of tokens, so it is "
                            f"limited to {max_tokens} tokens; this text has {n}. Rollout has no such limit.")
    # node (l, i) is l * n + i: layer boundary 0 is the input, n_layers the last layer's output
    rows, cols, caps = [], [], []
    for layer in range(n_layers):
        q, k = np.nonzero(a[layer] > 0)
        rows.append((layer + 1) * n + q)
        cols.append(layer * n + k)
        caps.append(np.rint(a[layer][q, k] * FLOW_SCALE))
    size = (n_layers + 1) * n
    graph = csr_matrix((np.concatenate(caps).astype(np.int32), (np.concatenate(rows), np.concatenate(cols))),
                       shape=(size, size))
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = maximum_flow(graph, n_layers * n + i, j).flow_value
    sums = out.sum(axis=1, keepdims=True)
    return (out / np.where(sums > 0, sums, 1.0)).astype(np.float32)


def token_ablation(model, text: str) -> np.ndarray:
    """``(n, n)``: entry ``[i, j]`` is how far position ``i``'s output moves (L2 distance of the last
    hidden state) when input token ``j`` is blanked: the ground truth rollout and flow approximate."""
    full, blanked = model.blanked_outputs(text)
    return np.linalg.norm(blanked - full[None], axis=-1).T.astype(np.float32)


def raw_attention(att) -> np.ndarray:
    """``(n, n)``: the last layer's weights, mean of its heads; what one looks at without rollout."""
    return np.asarray(att.weights[-1], dtype=np.float32).mean(axis=0)


def agreement(model, sentences: Sequence[str], *, residual: float = 0.5) -> dict[str, float]:
    """Spearman correlation of each answer with token ablation, per content position (over the
    content input tokens), averaged over positions and sentences; sentences with fewer than three
    content tokens are left out.

    Returns ``{"raw attention": ..., "rollout": ..., "flow": ..., "sentences": ..., "flow sentences": ...}``;
    flow only over sentences within ``FLOW_MAX_TOKENS``.
    """
    from scipy.stats import spearmanr

    scores: dict[str, list[float]] = {"raw attention": [], "rollout": [], "flow": []}
    for text in sentences:
        att = model.attend(text)
        # Content tokens only: blanking [CLS], [SEP] or a decoder's sink moves little, while attention
        # parks on them as a no-op (Clark et al., 2019), which would rank them first.
        content = np.flatnonzero(~set_aside(att))
        if len(content) < 3:
            continue
        truth = token_ablation(model, text)
        answers = {"raw attention": raw_attention(att), "rollout": rollout(att, residual=residual)[-1]}
        if len(att.tokens) <= FLOW_MAX_TOKENS:
            answers["flow"] = flow(att, residual=residual)
        for name, answer in answers.items():
            rho = [spearmanr(answer[i, content], truth[i, content]).statistic for i in content]
            scores[name].append(float(np.nanmean(rho)))
    out = {name: float(np.mean(values)) if values else float("nan") for name, values in scores.items()}
    return {**out, "sentences": len(scores["rollout"]), "flow sentences": len(scores["flow"])}
