"""Which heads behave alike: the Jensen-Shannon divergence between their patterns over many sentences."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from models.result import Attention

from .views import row_entropy

SIMILARITY_CHUNK_BYTES = 64 * 2**20  # the largest temporary array of head_similarity
SIMILARITY_ROW_KEYS = 4096  # query rows x keys used per sentence: every row up to 64 tokens


def head_similarity(attentions: Sequence[Attention], max_sentences: int = 100) -> np.ndarray:
    """``(layers * heads, layers * heads)`` Jensen-Shannon divergence (nats) between heads' patterns,
    averaged over query rows of up to ``max_sentences`` sentences. 0 means identical patterns.

    JS(a, b) = H((a + b) / 2) - (H(a) + H(b)) / 2, computed a few query rows at a time so that
    memory stays within ``SIMILARITY_CHUNK_BYTES`` whatever the sentence length. A sentence
    longer than 64 tokens contributes evenly spaced query rows, ``SIMILARITY_ROW_KEYS // tokens``
    of them, so that one long text costs no more than a short one (work grows as rows x keys).
    """
    total, rows = None, 0
    for att in list(attentions)[:max_sentences]:
        L, H, n, _ = att.weights.shape
        keep = np.unique(np.linspace(0, n - 1, max(1, min(n, SIMILARITY_ROW_KEYS // n))).round().astype(int))
        P = att.weights.reshape(L * H, n, n)[:, keep].astype(np.float64).transpose(1, 0, 2)  # (rows, LH, n)
        own = row_entropy(P)  # (rows, LH)
        step = max(1, SIMILARITY_CHUNK_BYTES // (8 * (L * H) ** 2 * n))
        js = np.zeros((L * H, L * H))
        for i in range(0, len(keep), step):
            p = P[i:i + step]
            mixed = row_entropy((p[:, :, None, :] + p[:, None, :, :]) / 2)  # (rows, LH, LH)
            h = own[i:i + step]
            js += (mixed - (h[:, :, None] + h[:, None, :]) / 2).sum(0)  # summed over query rows
        total = js if total is None else total + js
        rows += len(keep)
    return np.maximum(total / max(rows, 1), 0.0)


def similar_heads(similarity: np.ndarray, layer: int, head: int, n_heads: int, k: int = 6) -> pd.DataFrame:
    """The ``k`` heads whose patterns are nearest ``(layer, head)``'s in ``head_similarity``'s matrix (or in
    that head's row of it, ``(layers * heads,)``), nearest first: ``layer``, ``head``, ``divergence`` (nats)."""
    row = similarity[layer * n_heads + head] if similarity.ndim == 2 else similarity
    nearest = [i for i in np.argsort(row, kind="stable") if i != layer * n_heads + head][:k]
    layers, heads = np.divmod(np.array(nearest, dtype=int), n_heads)
    return pd.DataFrame({"layer": layers, "head": heads, "divergence": row[nearest]})
