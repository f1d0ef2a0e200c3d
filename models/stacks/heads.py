"""Pruned heads: configs hold them as ``((layer, (head, ...)), ...)``; config.json as ``{"layer": [head, ...]}``."""
from __future__ import annotations

import torch

from ..errors import HeadLensError


def kept_heads(pruned_heads: tuple, layer: int, n_heads: int) -> list[int]:
    """The original indices of the heads ``layer`` still has, in order."""
    gone = dict(pruned_heads).get(layer, ())
    return [h for h in range(n_heads) if h not in gone]


def with_pruned(pruned_heads: tuple, heads) -> tuple:
    """``pruned_heads`` with ``heads`` (``(layer, head)`` pairs) added, sorted, as configs hold them."""
    gone = {layer: set(hs) for layer, hs in pruned_heads}
    for layer, head in heads:
        gone.setdefault(layer, set()).add(head)
    return tuple(sorted((layer, tuple(sorted(hs))) for layer, hs in gone.items() if hs))


def pruned_heads_json(pruned_heads: tuple) -> dict:
    return {str(layer): list(heads) for layer, heads in pruned_heads}


def read_pruned_heads(given, n_layers: int, n_heads: int) -> tuple:
    """``{"layer": [head, ...]}`` from a config.json, checked against the model's sizes, as a sorted tuple."""
    if not isinstance(given, dict):
        raise HeadLensError("The config.json's pruned_heads must map each layer to a list of heads.")
    out = {}
    for layer, heads in given.items():
        try:
            layer = int(layer)
            heads = tuple(sorted({int(h) for h in heads}))
        except (TypeError, ValueError) as err:
            raise HeadLensError(f"The config.json's pruned_heads has a layer or head that is not a number: {err}") from err
        if not 0 <= layer < n_layers or any(not 0 <= h < n_heads for h in heads):
            raise HeadLensError(f"The config.json prunes heads {list(heads)} of layer {layer}; the model has "
                                f"{n_layers} layers of {n_heads} heads.")
        if heads:
            out[layer] = heads
    return tuple(sorted(out.items()))


def select_heads(per_head: torch.Tensor, kept: list[int], n_heads: int) -> torch.Tensor:
    """The entries of ``per_head`` (one per head of the unpruned layer) for the heads ``kept``."""
    if len(kept) == n_heads:
        return per_head
    return per_head[torch.tensor(kept, dtype=torch.long, device=per_head.device)]


def place_heads(weights: torch.Tensor, kept: list[int], n_heads: int) -> torch.Tensor:
    """``(B, kept, Lq, Lk)`` weights placed among zeros for the pruned heads: ``(B, n_heads, Lq, Lk)``."""
    if len(kept) == n_heads:
        return weights
    B, _, Lq, Lk = weights.shape
    index = torch.tensor(kept, dtype=torch.long, device=weights.device)
    return weights.new_zeros(B, n_heads, Lq, Lk).index_copy_(1, index, weights)
