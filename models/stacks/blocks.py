"""The blocks of a pre-norm language model, and the one block Llama and Gemma 3 share.

``GatedBlock`` is ``x + post(Attn(norm(x)))``, then ``x + post(MLP(norm(x)))`` with a gated feed-forward
``down(act(gate(x)) * up(x))``: Llama's with no norm after each part (``post_norms=False``), SiLU and RMSNorm;
Gemma 3's with norms after both parts, tanh GELU and its ``1 + weight`` RMSNorm. Their attentions differ only
in how ``MultiHeadAttention`` is built (biases, QK-norm, a scale, a sliding window).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..mha import MultiHeadAttention


class PreNormBlock(nn.Module):
    """What a pre-norm language model's block says of how its attention writes into the residual stream: as it
    is, or through the norm ``ln_attn_out`` it puts after the attention (Gemma 3), when it has one."""

    @property
    def post_attention_norm(self) -> nn.Module | None:
        """The norm after the attention (``ln_attn_out``), or None."""
        return getattr(self, "ln_attn_out", None)  # a registered module, or an attribute set to None

    def attention_scale(self, a: torch.Tensor) -> torch.Tensor | None:
        """``(..., E)``: what the attention's output ``a`` (its output projection's, bias included) is multiplied
        by on its way into the stream, frozen at ``a``'s own value, so that a part of ``a`` times it is that
        part's share of the write; None when ``a`` is written as it is."""
        norm = self.post_attention_norm
        return None if norm is None else norm.gain().to(a.dtype) * norm.inverse_rms(a).to(a.dtype)

    def write_alone(self, a: torch.Tensor) -> torch.Tensor:
        """What the block would write of ``a`` were it the attention's whole output."""
        norm = self.post_attention_norm
        return a if norm is None else norm(a)

    def write_linear(self, a: torch.Tensor) -> torch.Tensor:
        """The linear part of ``write_alone``: ``write_alone(a)`` is it times a positive number per vector."""
        norm = self.post_attention_norm
        return a if norm is None else a * norm.gain().to(a.dtype)


class GatedBlock(PreNormBlock):
    """``x + post(Attn(norm(x)))``, then ``x + post(MLP(norm(x)))``; ``norm()`` makes each norm of size E."""

    def __init__(self, attn: MultiHeadAttention, norm: Callable[[], nn.Module], intermediate_size: int,
                 act: Callable[[torch.Tensor], torch.Tensor], post_norms: bool):
        super().__init__()
        E = attn.embed_dim
        self.ln_attn = norm()
        self.attn = attn
        self.ln_attn_out = norm() if post_norms else None
        self.ln_mlp = norm()
        self.gate = nn.Linear(E, intermediate_size, bias=False)
        self.up = nn.Linear(E, intermediate_size, bias=False)
        self.down = nn.Linear(intermediate_size, E, bias=False)
        self.ln_mlp_out = norm() if post_norms else None
        self.act = act

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention reads of the block's input ``x``: its norm."""
        return self.ln_attn(x)

    def forward(self, x: torch.Tensor, *, key_padding_mask=None, packing=None, causal: bool = True,
                need_weights: bool = False, head_mask=None, head_fill=None, hook_in=None, hook_z=None,
                weights_into=None, prefix=None):
        """``x`` ``(B, L, E)``, or ``(N, E)`` real tokens when ``packing`` is given; and the weights or None.
        ``prefix``: the keys and values of the tokens before ``x`` (``MultiHeadAttention.forward``)."""
        h = self.ln_attn(x)
        padded = h if packing is None else packing.unpack(h)
        padded = padded if hook_in is None else hook_in(padded)                  # (B, L, E)
        a, weights = self.attn(padded, key_padding_mask=key_padding_mask, causal=causal,
                               need_weights=need_weights, average_attn_weights=False, head_mask=head_mask,
                               head_fill=head_fill, hook_z=hook_z, into=weights_into, prefix=prefix)
        x = x + self.write_alone(a if packing is None else packing.pack(a))
        return x + self.mlp_write(x), weights

    def mlp_write(self, x: torch.Tensor) -> torch.Tensor:
        """What the feed-forward part writes into the stream ``x`` it reads (its norms included)."""
        h = self.ln_mlp(x)
        m = self.down(self.act(self.gate(h)) * self.up(h))
        return m if self.ln_mlp_out is None else self.ln_mlp_out(m)
