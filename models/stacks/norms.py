"""The norms and activations a family names in its blocks: RMSNorm (Llama's), Gemma's ``1 + weight`` RMSNorm, and
LayerNorm with a bias (GPT-2's, GPT-NeoX's, BERT's); the feed-forwards' activations by their config.json names.
Each RMSNorm says its ``gain`` and ``inverse_rms``, so that an analysis can freeze its scale."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu,
               "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
               "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) * weight``, computed in float32 as transformers does (float64 stays float64)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def inverse_rms(self, x: torch.Tensor) -> torch.Tensor:
        """``1 / sqrt(mean(x²) + eps)`` over the last axis (kept), in float32 or float64."""
        h = x if x.dtype == torch.float64 else x.float()
        return torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)

    def gain(self) -> torch.Tensor:
        """What a normalised vector is multiplied by."""
        return self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if x.dtype == torch.float64 else x.float()
        return self.weight * (h * self.inverse_rms(h)).to(x.dtype)


class GemmaRMSNorm(RMSNorm):
    """``x / sqrt(mean(x²) + eps) * (1 + weight)``, in float32 (float64 stays float64), as transformers' Gemma."""

    def __init__(self, size: int, eps: float):
        super().__init__(size, eps)
        nn.init.zeros_(self.weight)

    def gain(self) -> torch.Tensor:
        """What a normalised vector is multiplied by: ``1 + weight``."""
        return 1.0 + self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if x.dtype == torch.float64 else x.float()
        return (h * self.inverse_rms(h) * (1.0 + self.weight.to(h.dtype))).to(x.dtype)


NORMS = {"rms": RMSNorm, "gemma_rms": GemmaRMSNorm,
         "layer": lambda size, eps: nn.LayerNorm(size, eps=eps)}


def frozen(norm, x: torch.Tensor) -> tuple[torch.Tensor | float, torch.Tensor | None, torch.Tensor | float]:
    """A norm of ``x`` ``(..., E)`` with its scale frozen at ``x``'s: ``(gain, bias, per-vector scale (..., 1))`` such
    that ``norm(x) = (x, centred for a LayerNorm) * scale * gain + bias``, a linear map of any part of ``x`` plus the
    bias (None for an RMSNorm). ``norm`` None (no norm, as OLMo-2 has before its attention): the stream as it is."""
    if norm is None:
        return 1.0, None, 1.0
    if hasattr(norm, "inverse_rms"):  # RMSNorm: Llama's weight, Gemma's 1 + weight
        return norm.gain().to(x.dtype), None, norm.inverse_rms(x).to(x.dtype)
    if isinstance(norm, nn.LayerNorm):
        scale = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
        return norm.weight.to(x.dtype), (None if norm.bias is None else norm.bias.to(x.dtype)), scale
    raise TypeError(f"HeadLens cannot freeze a {type(norm).__name__}.")
