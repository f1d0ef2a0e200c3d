"""What attention computes once q, k and v are ready: the masks of what a query may not see, the weights, and the
fused path without them. ``MultiHeadAttention`` and a long prompt's blockwise weights (``models.long``) share them."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def outside_window(queries: torch.Tensor, keys: torch.Tensor, window: int) -> torch.Tensor:
    """``(len(queries), len(keys))`` bool: True where a key lies ``window`` or more positions before the query,
    beyond what a sliding-window layer's query sees (positions given as 1-D tensors)."""
    return (queries.view(-1, 1) - keys.view(1, -1)) >= window


def attention_masks(B: int, H: int, Lq: int, Lk: int, key_padding_mask=None, attn_mask=None, valid_lens=None,
                    causal: bool = False, like: torch.Tensor | None = None, window: int | None = None):
    """What a query may not see, as one bool mask (True: blocked) and one float bias added to the scores;
    ``window``: with ``causal``, keys beyond a sliding window are blocked too.

    Each is None or broadcasts to ``(B, H, Lq, Lk)``: ``(B | 1, H | 1, Lq | 1, Lk)``.
    """
    device = None if like is None else like.device
    blocked = bias = None

    def block(mask):
        nonlocal blocked
        blocked = mask if blocked is None else blocked | mask

    def add(extra):
        nonlocal bias
        extra = extra.to(like.dtype if like is not None else torch.float32)
        bias = extra if bias is None else bias + extra

    if key_padding_mask is not None:
        kpm = key_padding_mask.to(device).view(B, 1, 1, Lk)
        block(kpm) if kpm.dtype == torch.bool else add(kpm)
    if attn_mask is not None:
        am = attn_mask.to(device)
        if am.dim() == 2:
            am = am.view(1, 1, Lq, Lk)
        elif am.dim() == 3 and am.shape[0] == B * H:
            am = am.view(B, H, Lq, Lk)
        else:
            raise ValueError(f"attn_mask must be (Lq, Lk) or (B * H, Lq, Lk) = ({B * H}, {Lq}, {Lk}); "
                             f"it is {tuple(attn_mask.shape)}")
        block(am) if am.dtype == torch.bool else add(am)
    if valid_lens is not None:
        lens = valid_lens.to(device)
        lens = lens.view(B, 1, 1, 1) if lens.dim() == 1 else lens.view(B, 1, Lq, 1)
        block(torch.arange(Lk, device=device).view(1, 1, 1, Lk) >= lens)
    if causal:
        block(torch.ones(Lq, Lk, dtype=torch.bool, device=device).triu_(1).view(1, 1, Lq, Lk))
        if window is not None:
            block(outside_window(torch.arange(Lq, device=device), torch.arange(Lk, device=device), window)
                  .view(1, 1, Lq, Lk))
    return blocked, bias


BLOCK_ROWS = 128  # query rows of one block of ``causal_attention``
BLOCKED_FROM = 256  # the fewest tokens ``causal_attention`` is used for: below, the whole matrix costs less


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                     rows: int = BLOCK_ROWS, into: torch.Tensor | None = None,
                     softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal self-attention with its weights, a block of ``rows`` query rows at a time, each block scored only
    against the keys one of its queries sees: none after the block, none beyond a sliding ``window``. No score
    outside them is formed; the weights there are zero, as the masked softmax gives them.

    Args:
        q, k, v: ``(B, H, L, Dh)``, q not yet scaled by ``1 / sqrt(Dh)``.
        into: ``(B, H, L, L)`` zeros the weights are written into (a slice of a larger buffer), or None.
        softcap: the scores squashed to ``softcap * tanh(score / softcap)`` (``capped``).

    Returns:
        the weights ``(B, H, L, L)`` and the output ``(B, H, L, Dh)``. For inference (no gradient).
    """
    B, H, L, Dh = q.shape
    weights = q.new_zeros(B, H, L, L) if into is None else into
    out = q.new_empty(B, H, L, Dh)
    q = q * Dh ** -0.5
    for start in range(0, L, rows):
        stop = min(L, start + rows)
        first = 0 if window is None else max(0, start - window + 1)
        scores = capped(torch.matmul(q[:, :, start:stop], k[:, :, first:stop].transpose(-2, -1)), softcap)
        query = torch.arange(start, stop, device=q.device)
        key = torch.arange(first, stop, device=q.device)
        blocked = key.view(1, -1) > query.view(-1, 1)
        if window is not None:
            blocked |= outside_window(query, key, window)
        scores.masked_fill_(blocked, float("-inf"))                      # a query always sees itself
        w = _softmax_last(scores)
        weights[:, :, start:stop, first:stop] = w
        out[:, :, start:stop] = torch.matmul(w, v[:, :, first:stop])
    return weights, out


def capped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``softcap * tanh(scores / softcap)``: Gemma 2's soft cap on the attention scores, before any mask; the scores
    as they are without one."""
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def attention_weights(q: torch.Tensor, k: torch.Tensor, blocked: torch.Tensor | None,
                      bias: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh) + bias) with blocked pairs at zero, the scores ``capped`` first with a ``softcap``.

    Args:
        q: ``(B, H, Lq, Dh)``; k: ``(B, H, Lk, Dh)``; blocked (bool) and bias (float): each None
        or broadcasting to ``(B, H, Lq, Lk)``.

    Returns:
        ``(B, H, Lq, Lk)``; rows with every key blocked (or at -inf) are all zeros.
    """
    # Scaling q costs B*Lq*E multiplies, scaling the scores B*H*Lq*Lk: H*Lk is usually far larger than E.
    scores = capped(torch.matmul(q * (q.shape[-1] ** -0.5), k.transpose(-2, -1)), softcap)  # (B, H, Lq, Lk)
    if bias is not None:
        scores = scores + bias
    if blocked is not None:
        scores.masked_fill_(blocked, float("-inf"))
    # rows that may see no key, found before the softmax (which may write into the scores' buffer)
    if bias is not None:
        empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    else:
        empty = None if blocked is None else blocked.all(dim=-1, keepdim=True)
    weights = _softmax_last(scores)
    if empty is not None and empty.any():
        weights = weights.masked_fill(empty, 0.0)
    return weights


def fused_attention(q, k, v, blocked, bias, dropout: float, only_causal: bool) -> torch.Tensor:
    """``softmax(q k^T / sqrt(Dh) + mask) v`` through ``scaled_dot_product_attention``, ``(B, H, Lq, Dh)``:
    PyTorch picks a fused kernel (flash or memory-efficient attention on CUDA). Rows with no key
    to see come out zero, as on the weights path."""
    if only_causal:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    mask = None
    if bias is not None:
        mask = bias if blocked is None else bias.masked_fill(blocked, float("-inf"))
    elif blocked is not None:
        mask = ~blocked                                                    # SDPA's bool: True may attend
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    empty = None
    if bias is not None:
        empty = torch.isneginf(mask).all(dim=-1, keepdim=True)
    elif blocked is not None:
        empty = blocked.all(dim=-1, keepdim=True)
    if empty is not None and empty.any():
        out = out.masked_fill(empty, 0.0)
    return out


def _softmax_last(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis, in place when no gradient is needed.

    Writing into the scores' own buffer spares a fresh (B, H, Lq, Lk) allocation, whose page
    faults cost more than the softmax itself at 512 tokens. An out= op has no gradient, so
    training takes the ordinary path.
    """
    if torch.is_grad_enabled() and scores.requires_grad:
        return torch.softmax(scores, dim=-1)
    return torch.ops.aten._softmax.out(scores, -1, False, out=scores)
