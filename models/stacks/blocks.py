"""What the blocks of a language model say of how their attention writes into the residual stream (the decoder
families' ``family.FamilyBlock``, the trained decoder's ``decoder.DecoderBlock`` among them)."""
from __future__ import annotations

from types import MappingProxyType

import torch
from torch import nn

from ..run import Given

NO_EDITS = MappingProxyType({})  # a block's edits when its layer has none


class PreNormBlock(nn.Module):
    """What a pre-norm language model's block says of how its attention writes into the residual stream: as it
    is, or through the norm ``ln_attn_out`` it puts after the attention (Gemma 3), when it has one."""

    causal = True  # its attention run head by head masks later keys (a compiled program's may not)

    @property
    def attention_norm(self) -> nn.Module | None:
        """The norm the attention reads the stream through (``ln_attn``), or None (OLMo-2 has none there)."""
        return getattr(self, "ln_attn", None)

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

    def input_weights(self, kind: str, index: int = 0) -> torch.Tensor:
        """``(d, E)``: the linear map a reader in this block applies to the stream it reads (after its norm, where it
        has one): head ``index``'s query, key or value projection (``kind`` q, k or v; k and v: its key/value
        head's), or the feed-forward's first layer (``mlp``; a gated one's gate stacked on its up projection)."""
        if kind in ("q", "k", "v"):
            return self.attn.head_projections()["qkv".index(kind)][0][index]
        return torch.cat([self.gate.weight, self.up.weight]) if self.gated else self.mlp_in.weight

    def attention_alone(self, x: torch.Tensor, **options) -> torch.Tensor | None:
        """The weights of the block's attention on its input ``x``, the block run no further (``attend``'s
        arguments)."""
        return self.attend(x, **options)[1]

    def by_head(self, x: torch.Tensor, edits) -> torch.Tensor:
        """The block on ``x`` ``(B, n, E)`` with its attention run head by head: each query head and each key/value
        head's keys and values reading its own stream (``qkv_in``), each head's write apart (``result``), and the
        feed-forward part on its own stream (``mlp_in``): what every receiver of a circuit reads."""
        attn, before = self.attn, x
        H, G = attn.num_heads, attn.num_kv_heads
        if H:
            streams = x.unsqueeze(0).expand(H + 2 * G, *x.shape)                # (H + 2 G, B, n, E)
            if (edit := edits.get("qkv_in")) is not None:
                streams = edit(streams)
            if isinstance(streams, Given):
                writes, constant = streams.writes, streams.constant
            else:
                writes, constant = self.attention_by_head(streams[:H], streams[H:H + G], streams[H + G:], edits)
            if (edit := edits.get("result")) is not None:
                writes = edit(writes)
            x = x + writes.sum(0) + (0 if constant is None else constant)
        elif attn.out_proj.bias is not None:
            x = x + self.write_alone(attn.out_proj.bias.expand_as(x))
        if getattr(self, "attention_only", False):
            return x
        return x + self.mlp_part(before if getattr(self, "parallel", False) else x, edits)

    def attention_by_head(self, xq: torch.Tensor, xk: torch.Tensor, xv: torch.Tensor, edits=NO_EDITS):
        """The attention with each query head reading ``xq[i]`` and each key/value head ``xk[g]``, ``xv[g]``
        (``(heads, B, n, E)``, ``(kv heads, B, n, E)``, before the norm; causal, with its window): each head's
        write ``(heads, B, n, E)`` and the attention's constant write (its output bias, through a norm on the
        output; None without)."""
        attn = self.attn
        z = attn.by_head(self.attention_input(xq), self.attention_input(xk), self.attention_input(xv),
                         hook_pattern=edits.get("pattern"), hook_z=edits.get("z"), causal=self.causal)
        writes = attn.head_writes(z)
        bias = attn.out_proj.bias
        scale = self.attention_scale(writes.sum(0) + (0 if bias is None else bias))
        if scale is None:
            return writes, bias
        return writes * scale, None if bias is None else bias * scale
