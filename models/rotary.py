"""Rotary position embeddings, as transformers' Llama applies them."""
from __future__ import annotations

import torch
from torch import nn


class Rotary(nn.Module):
    """Rotary position embeddings as transformers' Llama applies them: the two halves of each head's
    vector rotated together, position ``p`` by ``p * base ** (-2i / Dh)`` (``rotate_half``).

    With ``dims`` below the head's size only the first ``dims`` of each vector turn and the rest pass as they are
    (GPT-NeoX's and Phi-3's partial rotary), the angles over ``dims``. One module serves every layer of a model;
    the angles of the last length asked for are kept, so they are computed once per forward pass, not twice in
    each layer.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, dims: int | None = None):
        super().__init__()
        self.head_dim, self.base = head_dim, base  # no buffer: a model built on the meta device needs none filled
        self.dims = head_dim if dims is None else dims
        self._angles = (None, None, None)          # (key, cos, sin), replaced whole: sessions share the module

    def angles(self, L: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every position's angles, ``(L, dims)`` each, on ``like``'s device and dtype."""
        key = (L, like.device, like.dtype, torch.is_inference_mode_enabled())  # inference tensors never reach autograd
        cached, cos, sin = self._angles
        if cached != key:
            Dh = self.dims
            inv_freq = 1.0 / (self.base ** (torch.arange(0, Dh, 2, dtype=torch.int64).float() / Dh))  # (Dh / 2,)
            freqs = torch.outer(torch.arange(L, dtype=torch.float32), inv_freq)                     # (L, Dh / 2)
            angles = torch.cat((freqs, freqs), dim=-1).to(like.device)                              # (L, Dh)
            cos, sin = angles.cos().to(like.dtype), angles.sin().to(like.dtype)
            self._angles = (key, cos, sin)
        return cos, sin

    def forward(self, *xs: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, ...]:
        """Each ``x`` ``(B, heads, L, Dh)`` at positions ``offset`` .. ``offset + L - 1``, rotated."""
        cos, sin = self.angles(offset + xs[0].shape[-2], xs[0])
        cos, sin = cos[offset:], sin[offset:]
        d = self.dims
        if d == xs[0].shape[-1]:
            return tuple(_turned(x, cos, sin) for x in xs)
        return tuple(torch.cat((_turned(x[..., :d], cos, sin), x[..., d:]), dim=-1) for x in xs)


def _turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., d)`` rotated by the angles whose cos and sin are given (``rotate_half``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
