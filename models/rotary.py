"""Rotary position embeddings, as transformers' Llama applies them."""
from __future__ import annotations

import torch
from torch import nn


class Rotary(nn.Module):
    """Rotary position embeddings as transformers' Llama applies them: the two halves of each head's
    vector rotated together, position ``p`` by ``p * base ** (-2i / Dh)`` (``rotate_half``).

    One module serves every layer of a model; the angles of the last length asked for are kept, so
    they are computed once per forward pass, not twice in each layer.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.base = head_dim, base  # no buffer: a model built on the meta device needs none filled
        self._angles = (None, None, None)          # (key, cos, sin), replaced whole: sessions share the module

    def angles(self, L: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every position's angles, ``(L, Dh)`` each, on ``like``'s device and dtype."""
        key = (L, like.device, like.dtype, torch.is_inference_mode_enabled())  # inference tensors never reach autograd
        cached, cos, sin = self._angles
        if cached != key:
            Dh = self.head_dim
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
        half = xs[0].shape[-1] // 2
        return tuple(x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin for x in xs)  # rotate_half
