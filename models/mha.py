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

from .kernels import (BLOCKED_FROM, attention_masks, attention_weights, causal_attention, fused_attention,
                      outside_window)
from .rotary import Rotary


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
        qk_norm: a norm of each head's query and one of each head's key, applied over ``Dh`` before the
            rotary rotation (Gemma 3's and Qwen3's QK-norm), one module each for every head; with
            ``qk_norm_over="projection"``, a norm of the whole query projection and one of the whole key projection
            (OLMo-2's), which ties the heads of a layer together.
        scale: what the scores are multiplied by, ``1 / sqrt(Dh)`` unless given (Gemma 3's
            ``query_pre_attn_scalar ** -0.5``).
        window: in causal self-attention, a query sees only the last ``window`` keys, itself included (a
            sliding-window layer: Mistral's, Gemma 3's local layers); None sees every earlier key.
        softcap: the scores squashed to ``softcap * tanh(score / softcap)`` before the softmax (Gemma 2's
            attention-logit soft-capping); the weights are then formed on every path.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, head_dim: int | None = None, bias: bool = True,
                 dropout: float = 0.0, kdim: int | None = None, vdim: int | None = None,
                 num_kv_heads: int | None = None, kv_heads: list[int] | None = None, out_bias: bool | None = None,
                 rotary: Rotary | None = None, qk_norm: "tuple[nn.Module, nn.Module] | None" = None,
                 scale: float | None = None, window: int | None = None, qk_norm_over: str = "head",
                 softcap: float | None = None):
        super().__init__()
        if head_dim is None:
            if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
                raise ValueError(f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})")
            head_dim = embed_dim // num_heads
        elif embed_dim <= 0 or num_heads < 0 or head_dim <= 0:
            raise ValueError(f"embed_dim ({embed_dim}) and head_dim ({head_dim}) must be positive, "
                             f"num_heads ({num_heads}) at least 0")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if kv_heads is None and self.num_kv_heads != num_heads:
            if not self.num_kv_heads or num_heads % self.num_kv_heads:
                raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
            kv_heads = [h // (num_heads // self.num_kv_heads) for h in range(num_heads)]
        if kv_heads is not None and (len(kv_heads) != num_heads or any(not 0 <= g < self.num_kv_heads for g in kv_heads)):
            raise ValueError(f"kv_heads must name one of the {self.num_kv_heads} key/value heads for each of the "
                             f"{num_heads} query heads")
        self.kv_heads = kv_heads  # the key/value head of each query head; None: each has its own
        self.inner_dim = num_heads * head_dim                              # H * Dh: E unless heads were pruned
        self.kv_dim = self.num_kv_heads * head_dim                         # Hkv * Dh: fewer with grouped queries
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.dropout = dropout
        self.rotary = rotary
        self.q_norm, self.k_norm = qk_norm if qk_norm is not None else (None, None)
        if qk_norm_over not in ("head", "projection"):
            raise ValueError(f"qk_norm_over is 'head' or 'projection', not {qk_norm_over!r}")
        self.qk_norm_over = qk_norm_over
        self.scale, self.window, self.softcap = scale, window, softcap
        # the softmax's own 1 / sqrt(Dh) turned into ``scale`` by the queries: 1 unless a scale is given
        self.q_factor = 1.0 if scale is None else scale * head_dim ** 0.5
        self.fused = self.kdim == embed_dim and self.vdim == embed_dim
        inner, kv = self.inner_dim, self.kv_dim
        if self.fused:
            self.in_proj_weight = nn.Parameter(torch.empty(inner + 2 * kv, embed_dim))
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(inner, embed_dim))
            self.k_proj_weight = nn.Parameter(torch.empty(kv, self.kdim))
            self.v_proj_weight = nn.Parameter(torch.empty(kv, self.vdim))
        self.in_proj_bias = nn.Parameter(torch.zeros(inner + 2 * kv)) if bias else None
        with warnings.catch_warnings():  # a layer with every head pruned has an empty projection, on purpose
            warnings.filterwarnings("ignore", "Initializing zero-element tensors", UserWarning)
            self.out_proj = nn.Linear(inner, embed_dim, bias=bias if out_bias is None else out_bias)
        self.reset_parameters()

    @property
    def sizes(self) -> list[int]:
        """The rows of the fused projection that are q, k and v: ``[H * Dh, Hkv * Dh, Hkv * Dh]``."""
        return [self.inner_dim, self.kv_dim, self.kv_dim]

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters(recurse=False):
            if name.endswith("weight") and p.numel():
                nn.init.xavier_uniform_(p)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadAttention":
        """Our module holding a copy of ``m``'s weights, on ``m``'s device and dtype.

        The result is batch-first whatever ``m.batch_first`` says.
        """
        if m.bias_k is not None or m.bias_v is not None or m.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn have no counterpart in MultiHeadAttention")
        scratch = cls(m.embed_dim, m.num_heads, bias=m.in_proj_bias is not None, dropout=m.dropout,
                   kdim=m.kdim, vdim=m.vdim)
        ref = m.in_proj_weight if m.in_proj_weight is not None else m.q_proj_weight
        scratch.to(device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            names = ["in_proj_weight"] if scratch.fused else ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
            if m.in_proj_bias is not None:
                names.append("in_proj_bias")
            for name in names:
                getattr(scratch, name).copy_(getattr(m, name))
            scratch.out_proj.load_state_dict(m.out_proj.state_dict())
        return scratch

    def project(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        """q ``(B, Lq, H * Dh)``, k and v ``(B, Lk, Hkv * Dh)``; one matrix product for self-attention."""
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else b.split(self.sizes)
        if self.fused:
            if query is key and key is value:
                return F.linear(query, self.in_proj_weight, b).split(self.sizes, dim=-1)
            wq, wk, wv = self.in_proj_weight.split(self.sizes)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def heads_qkv(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, offset: int = 0):
        """Each head's queries, keys and values as its scores read them, ``(B, H, L, Dh)`` each: normed (with a
        ``qk_norm``), after the rotary rotation (the first vector at position ``offset``), and with each query
        head given its group's key and value; q not yet multiplied by ``1 / sqrt(Dh)`` (but by
        ``scale * sqrt(Dh)`` when a ``scale`` is given)."""
        return self.shape_heads(*self.project(query, key, value), offset)

    def shape_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int = 0):
        """``heads_qkv`` from the projections ``(B, L, H * Dh)``, ``(B, L, Hkv * Dh)`` x 2 on: split by head, normed,
        rotated and each query head given its group's key and value."""
        B, Lq, _ = q.shape
        Lk, H, Dh = k.shape[1], self.num_heads, self.head_dim
        whole = self.q_norm is not None and self.qk_norm_over == "projection"
        if whole:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(B, Lq, H, Dh).transpose(1, 2)                        # (B, H, Lq, Dh)
        k = k.reshape(B, Lk, self.num_kv_heads, Dh).transpose(1, 2)        # (B, Hkv, Lk, Dh)
        v = v.reshape(B, Lk, self.num_kv_heads, Dh).transpose(1, 2)        # (B, Hkv, Lk, Dh)
        if self.q_norm is not None and not whole:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.q_factor != 1.0:
            q = q * self.q_factor
        if self.rotary is not None:
            q, k = self.rotary(q, k, offset=offset)
        if self.kv_heads is not None:                                      # each query head reads its group's k, v
            index = torch.tensor(self.kv_heads, dtype=torch.long, device=k.device)
            k, v = k.index_select(1, index), v.index_select(1, index)      # (B, H, Lk, Dh)
        return q, k, v

    def queries_keys(self, query: torch.Tensor, key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's queries and keys exactly as the softmax sees them, ``(B, H, L, Dh)`` each: the
        queries scaled by ``1 / sqrt(Dh)``, so that a score is ``q · k`` plus the masks."""
        key = query if key is None else key
        q, k, _ = self.heads_qkv(query, key, key)
        return q * (self.head_dim ** -0.5), k

    def value_norms(self, value: torch.Tensor) -> torch.Tensor:
        """``(B, H, Lk)``: the length of what each head would move from each key, ``||W_O^h (W_V^h x_j + b_V^h)||``
        (Kobayashi et al. 2020), for ``value`` ``(B, Lk, vdim)`` as ``forward`` receives it. A head's output
        at query i is the sum over keys j of its weight times this vector, so weight x length is how much
        of key j reaches the query through the head."""
        B, Lk, _ = value.shape
        H, Dh = self.num_heads, self.head_dim
        v = self.project(value, value, value)[2].view(B, Lk, self.num_kv_heads, Dh)   # (B, Lk, Hkv, Dh)
        if self.kv_heads is not None:
            v = v.index_select(2, torch.tensor(self.kv_heads, dtype=torch.long, device=v.device))
        w_out = self.out_proj.weight.view(-1, H, Dh)                       # (E, H, Dh)
        return torch.einsum("blhd,ehd->bhle", v, w_out).norm(dim=-1)       # (B, H, Lk)

    def head_projections(self):
        """The q, k and v projections' weights and biases (None without), split by head: ``((w, b), (w, b), (w, b))``,
        ``w`` ``(heads, Dh, E)`` (q: the query heads; k and v: the key/value heads), ``b`` ``(heads, Dh)``."""
        H, G, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        if self.fused:
            wq, wk, wv = self.in_proj_weight.split(self.sizes)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else b.split(self.sizes)
        shape = lambda w, h: w.view(h, Dh, -1)                                           # noqa: E731
        bias = lambda x, h: None if x is None else x.view(h, Dh)                          # noqa: E731
        return (shape(wq, H), bias(bq, H)), (shape(wk, G), bias(bk, G)), (shape(wv, G), bias(bv, G))

    @property
    def output_bias(self) -> torch.Tensor | None:
        """``(E,)``: what the output projection adds whatever the heads output (None without a bias)."""
        return self.out_proj.bias

    def output_columns(self) -> torch.Tensor:
        """``(E, heads, Dh)``: each head's columns of the output projection."""
        return self.out_proj.weight.view(-1, self.num_heads, self.head_dim)

    def by_head(self, hq: torch.Tensor, hk: torch.Tensor, hv: torch.Tensor, *, hook_pattern=None,
                hook_z=None, causal: bool = True) -> torch.Tensor:
        """Self-attention (causal unless ``causal`` is False: an encoder's) with each query head reading its own
        input ``hq[i]`` and each key/value head its own ``hk[g]``, ``hv[g]`` (``(heads, B, n, E)``, ``(kv heads, B,
        n, E)``, as ``forward``'s ``query``, no padding): each head's output ``z`` ``(B, heads, n, Dh)``.
        ``hook_pattern``, ``hook_z`` as ``forward``'s."""
        H = self.num_heads
        B, n, _ = hq.shape[1:]
        projected = []
        for x, (w, b) in zip((hq, hk, hv), self.head_projections()):
            p = torch.einsum("hbne,hde->bnhd", x, w)
            projected.append((p if b is None else p + b).reshape(B, n, -1))
        q, k, v = self.shape_heads(*projected)                                        # (B, H, n, Dh) each
        window = self.window if self.window is not None and n > self.window else None
        weighed = self.softcap is not None or hook_pattern is not None  # no fused kernel caps or hands the weights
        blocked = None if (window is None and not weighed) or not causal else \
            attention_masks(B, H, n, n, causal=True, like=q, window=window)[0]
        if weighed:
            weights = attention_weights(q, k, blocked, None, self.softcap)
            z = torch.matmul(weights if hook_pattern is None else hook_pattern(weights), v)
        else:
            z = fused_attention(q, k, v, blocked, None, 0.0, only_causal=causal and window is None)  # (B, H, n, Dh)
        return z if hook_z is None else hook_z(z)

    def head_writes(self, z: torch.Tensor) -> torch.Tensor:
        """``(heads, B, n, E)``: each head's output ``z`` ``(B, heads, n, Dh)`` through its slice of the output
        projection (no bias)."""
        return torch.einsum("bhnd,ehd->hbne", z, self.output_columns())

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True, *,
                valid_lens: torch.Tensor | None = None, causal: bool = False, head_mask: torch.Tensor | None = None,
                head_fill: torch.Tensor | None = None, hook_z=None, hook_pattern=None, into: torch.Tensor | None = None,
                prefix: tuple[torch.Tensor, torch.Tensor] | None = None):
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
            hook_z: called with each head's output before the output projection, ``z`` ``(B, H, Lq, Dh)``
                (TransformerLens's ``hook_z``); what it returns goes on in its place: a hook reads ``z``, or
                patches it, for this call alone (the module holds no hook).
            hook_pattern: called with the weights ``(B, H, Lq, Lk)`` after the softmax (TransformerLens's
                ``hook_pattern``), before they mix the values; what it returns mixes them instead and is returned.
                With it the weights are always formed (never the fused path).
            into: ``(B, H, Lq, Lk)`` zeros that the per-head weights are written into and returned as (a
                slice of a buffer holding every layer's), so that they are not copied again; without a
                gradient only.
            prefix: in causal self-attention, the keys and values ``(B, H, P, Dh)`` of ``P`` tokens before
                ``query`` (as ``heads_qkv`` gives them): ``query`` is the text's tokens from position ``P`` on,
                and sees those keys too (the weights are ``(B, H, Lq, P + Lq)``).

        Returns:
            output ``(B, Lq, E)`` and the weights (or None). A query whose keys are all masked gets
            zero weights and a zero contribution, never NaN (PyTorch gives NaN there).
        """
        key = query if key is None else key
        value = key if value is None else value
        B, Lq, _ = query.shape
        Lk, H, Dh = key.shape[1], self.num_heads, self.head_dim

        offset = 0 if prefix is None else prefix[0].shape[2]
        q, k, v = self.heads_qkv(query, key, value, offset)                # (B, H, L, Dh) each
        if prefix is not None:
            k, v = torch.cat([prefix[0], k], 2), torch.cat([prefix[1], v], 2)
            Lk = offset + Lk

        window = self.window if causal and self.window is not None and Lk > self.window else None
        plain = (causal and key_padding_mask is None and attn_mask is None and valid_lens is None
                 and prefix is None)  # causal alone
        only_causal = plain and window is None
        dropout = self.dropout if self.training else 0.0
        # no fused kernel caps scores or hands the weights to a hook
        wanted, need_weights = need_weights, need_weights or self.softcap is not None or hook_pattern is not None
        blockwise = (need_weights and plain and Lq == Lk >= BLOCKED_FROM and dropout == 0
                     and not torch.is_grad_enabled() and hook_pattern is None)
        if only_causal and not need_weights or blockwise:  # the fused kernel, or causal_attention, masks by itself
            blocked = bias = None
        else:
            blocked, bias = attention_masks(B, H, Lq, Lk, key_padding_mask, attn_mask, valid_lens,
                                            causal and prefix is None, query, window=window)
            if prefix is not None:
                after = _after_prefix(offset, Lq, window, query.device)
                blocked = after if blocked is None else blocked | after
        if blockwise:  # no score beyond what a query sees is formed: a long text's later keys, a window's older ones
            weights, out = causal_attention(q, k, v, window, into=into, softcap=self.softcap)  # (B, H, L, L), (.., Dh)
            if head_mask is not None:
                weights.mul_(head_mask.to(weights.dtype).view(1, H, 1, 1))
                out = out * head_mask.to(out.dtype).view(1, H, 1, 1)
        elif need_weights:
            weights = attention_weights(q, k, blocked, bias, self.softcap)  # (B, H, Lq, Lk)
            if head_mask is not None:
                weights = weights * head_mask.to(weights.dtype).view(1, H, 1, 1)
            if dropout > 0:
                weights = F.dropout(weights, dropout)
            if hook_pattern is not None:
                weights = hook_pattern(weights)
            out = torch.matmul(weights, v)                                 # (B, H, Lq, Dh)
            if into is not None:
                weights = into.copy_(weights)
        else:
            weights = None
            out = fused_attention(q, k, v, blocked, bias, dropout, only_causal=only_causal)
            if head_mask is not None:
                out = out * head_mask.to(out.dtype).view(1, H, 1, 1)
        if head_fill is not None and head_mask is not None:
            dropped = (1 - head_mask.to(out.dtype)).view(1, H, 1, 1)
            out = out + dropped * head_fill.to(out.dtype).view(1, H, 1, Dh)
        if hook_z is not None:
            out = hook_z(out)
        out = out.transpose(1, 2).reshape(B, Lq, self.inner_dim)           # (B, Lq, H * Dh)
        weights = weights if wanted else None
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)                                  # (B, Lq, Lk)
        return self.out_proj(out), weights


def _after_prefix(offset: int, Lq: int, window: int | None, device) -> torch.Tensor:
    """``(1, 1, Lq, offset + Lq)`` bool, True where query ``i`` (at position ``offset + i``) may not see a key: a
    later one, or one beyond its window."""
    queries = torch.arange(offset, offset + Lq, device=device)
    keys = torch.arange(offset + Lq, device=device)
    blocked = keys.view(1, -1) > queries.view(-1, 1)
    if window is not None:
        blocked |= outside_window(queries, keys, window)
    return blocked.view(1, 1, Lq, offset + Lq)
