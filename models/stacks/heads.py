"""Pruned heads: configs hold them as ``((layer, (head, ...)), ...)``; config.json as ``{"layer": [head, ...]}``."""
from __future__ import annotations

import copy

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


def pruned_attention(attn, keep: list[int], head_fill: torch.Tensor | None = None):
    """A new ``MultiHeadAttention`` with only the heads ``keep`` of ``attn`` (indices into its heads, in order); ``attn``
    untouched.

    The other heads take their rows of the q projection and their columns of the output
    projection with them, as transformers 4's ``prune_heads`` did; a key/value head goes with
    its rows of k and v once no kept query head reads it. With ``head_fill`` (``(H, Dh)``, ``attn``'s
    heads), a removed head's constant output is folded into the output bias: the new module equals
    ``attn`` with those heads mean-ablated.
    """
    H, Dh, E = attn.num_heads, attn.head_dim, attn.embed_dim
    dropped = [h for h in range(H) if h not in keep]
    if dropped and attn.q_norm is not None and attn.qk_norm_over == "projection":
        raise HeadLensError("This model norms its whole query projection at once (OLMo-2), so each head's query "
                            "depends on every other head's: a head cannot be cut out of it. Switch heads off "
                            "instead (ablation and importance do).")
    if head_fill is not None and dropped and attn.out_proj.bias is None:
        raise ValueError("Mean ablation folds a removed head's output into the output bias, which this "
                         "attention does not have; prune with zero ablation instead.")
    groups = list(range(H)) if attn.kv_heads is None else attn.kv_heads
    kv_keep = sorted({groups[h] for h in keep})
    ref = attn.out_proj.weight
    norms = None if attn.q_norm is None else (copy.deepcopy(attn.q_norm), copy.deepcopy(attn.k_norm))
    with torch.device("meta"):  # built empty, every weight given below: drawing weights to overwrite took
        pruned = type(attn)(E, len(keep), head_dim=Dh, bias=attn.in_proj_bias is not None,  # half of a copy
                            dropout=attn.dropout, kdim=attn.kdim, vdim=attn.vdim, num_kv_heads=len(kv_keep),
                            kv_heads=None if attn.kv_heads is None else [kv_keep.index(groups[h]) for h in keep],
                            out_bias=attn.out_proj.bias is not None, scale=attn.scale, window=attn.window,
                            qk_norm_over=attn.qk_norm_over, softcap=attn.softcap)
    pruned.to_empty(device=ref.device).to(dtype=ref.dtype)
    # the shared rotary module and the norms' copies join after: emptying them would have emptied their weights
    pruned.rotary = attn.rotary
    pruned.q_norm, pruned.k_norm = norms if norms is not None else (None, None)

    def rows(heads: list[int]) -> torch.Tensor:
        return (torch.tensor(heads, dtype=torch.long).view(-1, 1) * Dh + torch.arange(Dh)).reshape(-1).to(ref.device)

    q_rows, kv_rows = rows(keep), rows(kv_keep)
    with torch.no_grad():
        if attn.fused:
            wq, wk, wv = attn.in_proj_weight.split(attn.sizes)
            pruned.in_proj_weight.copy_(torch.cat([wq[q_rows], wk[kv_rows], wv[kv_rows]]))
        else:
            for name, picked in (("q_proj_weight", q_rows), ("k_proj_weight", kv_rows), ("v_proj_weight", kv_rows)):
                getattr(pruned, name).copy_(getattr(attn, name)[picked])
        if attn.in_proj_bias is not None:
            bq, bk, bv = attn.in_proj_bias.split(attn.sizes)
            pruned.in_proj_bias.copy_(torch.cat([bq[q_rows], bk[kv_rows], bv[kv_rows]]))
        pruned.out_proj.weight.copy_(ref[:, q_rows])
        if attn.out_proj.bias is not None:
            bias = attn.out_proj.bias.clone()
            if head_fill is not None and dropped:
                bias += ref[:, rows(dropped)] @ head_fill[dropped].to(ref).reshape(-1)
            pruned.out_proj.bias.copy_(bias)
    return pruned.train(attn.training)
