"""Which heads behave alike: the Jensen-Shannon divergence between their patterns over many sentences."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from models.result import Attention

SIMILARITY_CHUNK_BYTES = 64 * 2**20  # the largest temporary array of head_similarity
SIMILARITY_ROW_KEYS = 4096  # query rows x keys used per sentence: every row up to 64 tokens


def head_similarity(attentions: Sequence[Attention], max_sentences: int = 100) -> np.ndarray:
    """``(layers * heads, layers * heads)`` Jensen-Shannon divergence (nats) between heads' patterns,
    averaged over query rows of up to ``max_sentences`` sentences. 0 means identical patterns.

    JS(a, b) = H((a + b) / 2) - (H(a) + H(b)) / 2, one query row at a time, each pair of heads once (the
    divergence is symmetric), over the keys some head attends to in that row (a decoder's row q reads q + 1
    of them), a block of pairs at a time so that memory stays within ``SIMILARITY_CHUNK_BYTES`` whatever the
    sentence length. A sentence longer than 64 tokens contributes evenly spaced query rows,
    ``SIMILARITY_ROW_KEYS // tokens`` of them, so that one long text costs no more than a short one.
    """
    total, rows = None, 0
    for att in list(attentions)[:max_sentences]:
        L, H, n, _ = att.weights.shape
        keep = np.unique(np.linspace(0, n - 1, max(1, min(n, SIMILARITY_ROW_KEYS // n))).round().astype(int))
        P = torch.from_numpy(att.weights.reshape(L * H, n, n)[:, keep]).to(torch.float64).transpose(0, 1)  # (rows, LH, n)
        first, second = torch.triu_indices(L * H, L * H, offset=1)  # each pair of heads once
        js = torch.zeros(len(first), dtype=torch.float64)
        for p in P:
            p = p[:, p.any(dim=0)]  # (LH, keys read in this row)
            own = _entropy(p)
            step = max(1, SIMILARITY_CHUNK_BYTES // (8 * p.shape[1]))
            for i in range(0, len(first), step):
                a, b = first[i:i + step], second[i:i + step]
                js[i:i + step] += _entropy((p[a] + p[b]) * 0.5) - (own[a] + own[b]) * 0.5
        pairs = torch.zeros(L * H, L * H, dtype=torch.float64)
        pairs[first, second] = js
        total = (pairs + pairs.T) if total is None else total + pairs + pairs.T
        rows += len(keep)
    return np.maximum(total.numpy() / max(rows, 1), 0.0)


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row of ``p``; 0 log 0 counts as 0."""
    return -torch.special.xlogy(p, p).sum(dim=-1)


def similar_heads(similarity: np.ndarray, layer: int, head: int, n_heads: int, k: int = 6) -> pd.DataFrame:
    """The ``k`` heads whose patterns are nearest ``(layer, head)``'s in ``head_similarity``'s matrix (or in
    that head's row of it, ``(layers * heads,)``), nearest first: ``layer``, ``head``, ``divergence`` (nats)."""
    row = similarity[layer * n_heads + head] if similarity.ndim == 2 else similarity
    nearest = [i for i in np.argsort(row, kind="stable") if i != layer * n_heads + head][:k]
    layers, heads = np.divmod(np.array(nearest, dtype=int), n_heads)
    return pd.DataFrame({"layer": layers, "head": heads, "divergence": row[nearest]})
