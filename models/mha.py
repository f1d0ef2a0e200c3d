"""Multi-head attention written from scratch, all heads in one batched computation.

The parameters mirror ``torch.nn.MultiheadAttention`` (``in_proj_weight`` for a fused
q/k/v projection, or ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` when the key
and value sizes differ), so weights copy across directly and the two can be checked
against each other number for number.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``num_heads`` heads, batch-first.

    Args:
        embed_dim: E, the size of queries and of the output.
        num_heads: H; each head has ``Dh = E // H`` (E must be divisible by H) unless ``head_dim``
            is given. A pruned layer keeps fewer heads of the original size, down to none.
        head_dim: Dh, when it is not ``E // H`` (a layer with heads pruned away).
        bias: whether the input and output projections have biases.
        dropout: dropout on the attention weights, active in training mode only.
        kdim, vdim: sizes of keys and values for cross-attention (default E).
    """

    def __init__(self, embed_dim: int, num_heads: int, *, head_dim: int | None = None, bias: bool = True,
                 dropout: float = 0.0, kdim: int | None = None, vdim: int | None = None):
        super().__init__()
        if head_dim is None:
            if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
                raise ValueError(f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})")
            head_dim = embed_dim // num_heads
        elif embed_dim <= 0 or num_heads < 0 or head_dim <= 0:
            raise ValueError(f"embed_dim ({embed_dim}) and head_dim ({head_dim}) must be positive, "
                             f"num_heads ({num_heads}) at least 0")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.inner_dim = num_heads * head_dim                              # H * Dh: E unless heads were pruned
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.dropout = dropout
        self.fused = self.kdim == embed_dim and self.vdim == embed_dim
        inner = self.inner_dim
        if self.fused:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * inner, embed_dim))
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(inner, embed_dim))
            self.k_proj_weight = nn.Parameter(torch.empty(inner, self.kdim))
            self.v_proj_weight = nn.Parameter(torch.empty(inner, self.vdim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * inner)) if bias else None
        with warnings.catch_warnings():  # a layer with every head pruned has an empty projection, on purpose
            warnings.filterwarnings("ignore", "Initializing zero-element tensors", UserWarning)
            self.out_proj = nn.Linear(inner, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters(recurse=False):
            if name.endswith("weight") and p.numel():
                nn.init.xavier_uniform_(p)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadAttention":
        """Our module holding a copy of ``m``'s weights, on ``m``'s device and dtype.

        The result is batch-first whatever ``m.batch_first`` says.
        """
        if m.bias_k is not None or m.bias_v is not None or m.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn have no counterpart in MultiHeadAttention")
        ours = cls(m.embed_dim, m.num_heads, bias=m.in_proj_bias is not None, dropout=m.dropout,
                   kdim=m.kdim, vdim=m.vdim)
        ref = m.in_proj_weight if m.in_proj_weight is not None else m.q_proj_weight
        ours.to(device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            names = ["in_proj_weight"] if ours.fused else ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
            if m.in_proj_bias is not None:
                names.append("in_proj_bias")
            for name in names:
                getattr(ours, name).copy_(getattr(m, name))
            ours.out_proj.load_state_dict(m.out_proj.state_dict())
        return ours

    def project(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        """q, k, v projections, each ``(B, L, E)``; one matrix product for self-attention."""
        E = self.inner_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else b.view(3, E).unbind()
        if self.fused:
            if query is key and key is value:
                return F.linear(query, self.in_proj_weight, b).unflatten(-1, (3, E)).unbind(-2)
            wq, wk, wv = self.in_proj_weight.view(3, E, -1).unbind()
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None, *,
                key_padding_mask: torch.Tensor | None = None, valid_lens: torch.Tensor | None = None,
                causal: bool = False, head_mask: torch.Tensor | None = None,
                head_fill: torch.Tensor | None = None):
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, Lq, E)``.
            key: ``(B, Lk, kdim)``; defaults to ``query`` (self-attention).
            value: ``(B, Lk, vdim)``; defaults to ``key``.
            key_padding_mask: bool ``(B, Lk)``, True marks padding (PyTorch's convention).
            valid_lens: ``(B,)`` or ``(B, Lq)``: keys at positions >= the length are masked.
            causal: query i sees keys 0..i only.
            head_mask: ``(H,)``, 1 keeps a head, 0 drops it; multiplies the weights after softmax.
            head_fill: ``(H, Dh)``: what a head dropped by ``head_mask`` outputs at every position
                instead of zero, such as its mean output over a corpus (mean ablation).

        Returns:
            output ``(B, Lq, E)`` and weights ``(B, H, Lq, Lk)``. A query whose keys are all
            masked gets zero weights and a zero contribution, never NaN.
        """
        key = query if key is None else key
        value = key if value is None else value
        B, Lq, _ = query.shape
        Lk, H, Dh = key.shape[1], self.num_heads, self.head_dim

        q, k, v = self.project(query, key, value)                         # (B, L, E) each
        q = q.view(B, Lq, H, Dh).transpose(1, 2)                           # (B, H, Lq, Dh)
        k = k.view(B, Lk, H, Dh).transpose(1, 2)                           # (B, H, Lk, Dh)
        v = v.view(B, Lk, H, Dh).transpose(1, 2)                           # (B, H, Lk, Dh)

        blocked = attention_block_mask(B, Lq, Lk, key_padding_mask, valid_lens, causal, query.device)
        weights = attention_weights(q, k, blocked)                         # (B, H, Lq, Lk)
        if head_mask is not None:
            weights = weights * head_mask.to(weights.dtype).view(1, H, 1, 1)
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, self.dropout)
        out = torch.matmul(weights, v)                                     # (B, H, Lq, Dh)
        if head_fill is not None and head_mask is not None:
            dropped = (1 - head_mask.to(out.dtype)).view(1, H, 1, 1)
            out = out + dropped * head_fill.to(out.dtype).view(1, H, 1, Dh)
        out = out.transpose(1, 2).reshape(B, Lq, self.inner_dim)           # (B, Lq, H * Dh)
        return self.out_proj(out), weights


def attention_block_mask(B: int, Lq: int, Lk: int, key_padding_mask=None, valid_lens=None,
                         causal: bool = False, device=None) -> torch.Tensor | None:
    """One bool mask, True where a query may not see a key: ``(B, 1 or Lq, Lk)`` or None."""
    blocked = None
    if key_padding_mask is not None:
        blocked = key_padding_mask.to(device=device, dtype=torch.bool).view(B, 1, Lk)
    if valid_lens is not None:
        lens = valid_lens.to(device)
        lens = lens.view(B, 1, 1) if lens.dim() == 1 else lens.view(B, Lq, 1)
        beyond = torch.arange(Lk, device=device).view(1, 1, Lk) >= lens    # (B, 1|Lq, Lk)
        blocked = beyond if blocked is None else blocked | beyond
    if causal:
        later = torch.ones(Lq, Lk, dtype=torch.bool, device=device).triu_(1).view(1, Lq, Lk)
        blocked = later if blocked is None else blocked | later
    return blocked


def attention_weights(q: torch.Tensor, k: torch.Tensor, blocked: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) with blocked pairs at zero.

    Args:
        q: ``(B, H, Lq, Dh)``; k: ``(B, H, Lk, Dh)``; blocked: bool ``(B, 1|Lq, Lk)`` or None.

    Returns:
        ``(B, H, Lq, Lk)``; rows with every key blocked are all zeros.
    """
    # Scaling q costs B*Lq*E multiplies, scaling the scores B*H*Lq*Lk: H*Lk is usually far larger than E.
    scores = torch.matmul(q * (q.shape[-1] ** -0.5), k.transpose(-2, -1))  # (B, H, Lq, Lk)
    if blocked is not None:
        scores.masked_fill_(blocked.unsqueeze(1), float("-inf"))
    weights = _softmax_last(scores)
    if blocked is not None:
        empty = blocked.all(dim=-1)                                         # (B, 1|Lq)
        if empty.any():
            weights = weights.masked_fill(empty.unsqueeze(1).unsqueeze(-1), 0.0)
    return weights


def _softmax_last(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis, in place when no gradient is needed.

    Writing into the scores' own buffer spares a fresh (B, H, Lq, Lk) allocation, whose page
    faults cost more than the softmax itself at 512 tokens. An out= op has no gradient, so
    training takes the ordinary path.
    """
    if torch.is_grad_enabled() and scores.requires_grad:
        return torch.softmax(scores, dim=-1)
    return torch.ops.aten._softmax.out(scores, -1, False, out=scores)
