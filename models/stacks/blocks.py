"""What the blocks of a language model say of how their attention writes into the residual stream (the decoder
families' ``family.FamilyBlock``, the trained decoder's ``decoder.DecoderBlock`` among them)."""
from __future__ import annotations

import torch
from torch import nn


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
