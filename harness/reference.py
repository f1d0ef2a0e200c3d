"""Reference computations the engine is held to: multi-head attention one head at a time, as a tutorial writes it."""
from __future__ import annotations

import math

import torch

from models.mha import MultiHeadAttention


def per_head_loop(m: MultiHeadAttention, query, key, value, blocked=None):
    """The tutorial formulation, one head at a time: the oracle for the batched module."""
    E, H, Dh = m.embed_dim, m.num_heads, m.head_dim
    if m.fused:
        wq, wk, wv = m.in_proj_weight.split(E)
    else:
        wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    bq, bk, bv = m.in_proj_bias.split(E)
    outs, weights = [], []
    for h in range(H):
        rows = slice(h * Dh, (h + 1) * Dh)
        q = query @ wq[rows].T + bq[rows]
        k = key @ wk[rows].T + bk[rows]
        v = value @ wv[rows].T + bv[rows]
        scores = q @ k.transpose(1, 2) / math.sqrt(Dh)
        if blocked is not None:
            scores = scores.masked_fill(blocked, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        weights.append(w)
        outs.append(w @ v)
    out = torch.cat(outs, dim=-1) @ m.out_proj.weight.T + m.out_proj.bias
    return out, torch.stack(weights, dim=1)
