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

    def pruned(self, keep: list[int], head_fill: torch.Tensor | None = None) -> "MultiHeadAttention":
        """A new module with only the heads ``keep`` (indices into this one's heads, in order); this one untouched.

        The other heads take their rows of the q, k and v projections and their columns of the
        output projection with them, as transformers 4's ``prune_heads`` did. With ``head_fill``
        (``(H, Dh)``, this module's heads), a removed head's constant output is folded into the
        output bias: the new module equals this one with those heads mean-ablated.
        """
        H, Dh, E = self.num_heads, self.head_dim, self.embed_dim
        ref = self.out_proj.weight
        copy = type(self)(E, len(keep), head_dim=Dh, bias=self.in_proj_bias is not None, dropout=self.dropout,
                          kdim=self.kdim, vdim=self.vdim).to(device=ref.device, dtype=ref.dtype)
        rows = (torch.tensor(keep, dtype=torch.long).view(-1, 1) * Dh + torch.arange(Dh)).reshape(-1).to(ref.device)
        dropped = [h for h in range(H) if h not in keep]
        with torch.no_grad():
            if self.fused:
                w = self.in_proj_weight.view(3, self.inner_dim, E)
                copy.in_proj_weight.copy_(w[:, rows].reshape(3 * len(rows), E))
            else:
                for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                    getattr(copy, name).copy_(getattr(self, name)[rows])
            if self.in_proj_bias is not None:
                copy.in_proj_bias.copy_(self.in_proj_bias.view(3, self.inner_dim)[:, rows].reshape(-1))
            copy.out_proj.weight.copy_(ref[:, rows])
            if self.out_proj.bias is not None:
                bias = self.out_proj.bias.clone()
                if head_fill is not None and dropped:
                    cols = (torch.tensor(dropped).view(-1, 1) * Dh + torch.arange(Dh)).reshape(-1).to(ref.device)
                    bias += ref[:, cols] @ head_fill[dropped].to(ref).reshape(-1)
                copy.out_proj.bias.copy_(bias)
        return copy.train(self.training)

    def project(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        """q, k, v projections, each ``(B, L, E)``; one matrix product for self-attention."""
        E = self.inner_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else b.view(3, E).unbind()
        if self.fused:
            if query is key and key is value:
                return F.linear(query, self.in_proj_weight, b).unflatten(-1, (3, E)).unbind(-2)
            wq, wk, wv = self.in_proj_weight.view(3, E, self.embed_dim).unbind()
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True, *,
                valid_lens: torch.Tensor | None = None, causal: bool = False, head_mask: torch.Tensor | None = None,
                head_fill: torch.Tensor | None = None):
        """Attend from ``query`` to ``key``/``value``; the arguments PyTorch's module takes mean what they mean there.

        Args:
            query: ``(B, Lq, E)``.
            key: ``(B, Lk, kdim)``; defaults to ``query`` (self-attention).
            value: ``(B, Lk, vdim)``; defaults to ``key``.
            key_padding_mask: ``(B, Lk)``: bool, True marks padding; or float, added to the scores.
            need_weights: return the weights. Without them the output comes from
                ``scaled_dot_product_attention`` (PyTorch's fused kernels, flash attention on CUDA).
            attn_mask: ``(Lq, Lk)`` or ``(B * H, Lq, Lk)``: bool, True where a query may not see a
                key; or float, added to the scores.
            average_attn_weights: return the weights averaged over heads, ``(B, Lq, Lk)``, as PyTorch
                does by default; else per head, ``(B, H, Lq, Lk)``.
            valid_lens: ``(B,)`` or ``(B, Lq)``: keys at positions >= the length are masked.
            causal: query i sees keys 0..i only.
            head_mask: ``(H,)``, 1 keeps a head, 0 drops it; multiplies the weights after softmax.
            head_fill: ``(H, Dh)``: what a head dropped by ``head_mask`` outputs at every position
                instead of zero, such as its mean output over a corpus (mean ablation).

        Returns:
            output ``(B, Lq, E)`` and the weights (or None). A query whose keys are all masked gets
            zero weights and a zero contribution, never NaN (PyTorch gives NaN there).
        """
        key = query if key is None else key
        value = key if value is None else value
        B, Lq, _ = query.shape
        Lk, H, Dh = key.shape[1], self.num_heads, self.head_dim

        q, k, v = self.project(query, key, value)                         # (B, L, E) each
        q = q.view(B, Lq, H, Dh).transpose(1, 2)                           # (B, H, Lq, Dh)
        k = k.view(B, Lk, H, Dh).transpose(1, 2)                           # (B, H, Lk, Dh)
        v = v.view(B, Lk, H, Dh).transpose(1, 2)                           # (B, H, Lk, Dh)

        blocked, bias = attention_masks(B, H, Lq, Lk, key_padding_mask, attn_mask, valid_lens, causal, query)
        dropout = self.dropout if self.training else 0.0
        if need_weights:
            weights = attention_weights(q, k, blocked, bias)               # (B, H, Lq, Lk)
            if head_mask is not None:
                weights = weights * head_mask.to(weights.dtype).view(1, H, 1, 1)
            if dropout > 0:
                weights = F.dropout(weights, dropout)
            out = torch.matmul(weights, v)                                 # (B, H, Lq, Dh)
        else:
            weights = None
            out = fused_attention(q, k, v, blocked, bias, dropout, only_causal=causal and blocked is not None
                                  and bias is None and key_padding_mask is None and attn_mask is None
                                  and valid_lens is None)
            if head_mask is not None:
                out = out * head_mask.to(out.dtype).view(1, H, 1, 1)
        if head_fill is not None and head_mask is not None:
            dropped = (1 - head_mask.to(out.dtype)).view(1, H, 1, 1)
            out = out + dropped * head_fill.to(out.dtype).view(1, H, 1, Dh)
        out = out.transpose(1, 2).reshape(B, Lq, self.inner_dim)           # (B, Lq, H * Dh)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)                                  # (B, Lq, Lk)
        return self.out_proj(out), weights


def attention_masks(B: int, H: int, Lq: int, Lk: int, key_padding_mask=None, attn_mask=None, valid_lens=None,
                    causal: bool = False, like: torch.Tensor | None = None):
    """What a query may not see, as one bool mask (True: blocked) and one float bias added to the scores.

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
    return blocked, bias


def attention_weights(q: torch.Tensor, k: torch.Tensor, blocked: torch.Tensor | None,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh) + bias) with blocked pairs at zero.

    Args:
        q: ``(B, H, Lq, Dh)``; k: ``(B, H, Lk, Dh)``; blocked (bool) and bias (float): each None
        or broadcasting to ``(B, H, Lq, Lk)``.

    Returns:
        ``(B, H, Lq, Lk)``; rows with every key blocked (or at -inf) are all zeros.
    """
    # Scaling q costs B*Lq*E multiplies, scaling the scores B*H*Lq*Lk: H*Lk is usually far larger than E.
    scores = torch.matmul(q * (q.shape[-1] ** -0.5), k.transpose(-2, -1))  # (B, H, Lq, Lk)
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
