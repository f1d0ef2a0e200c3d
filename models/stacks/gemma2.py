"""Gemma 2 as a family of ``FamilyDecoder``: Gemma 3's blocks without QK-norm, its attention scores and final
logits soft-capped (``cap * tanh(x / cap)``), sliding and full layers as ``layer_types`` names them (every other
layer by default), one rotary base for both."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import HeadLensError
from .family import Family, FamilyConfig, FamilyDecoder
from .gemma3 import GEMMA_NAMES, gemma_layer_types
from .llama import LLAMA_QKV
from .weights import Weights


@dataclass(frozen=True)
class Gemma2Config(FamilyConfig):
    """A transformers Gemma 2 ``config.json``'s sizes."""

    model_type: str = "gemma2"
    hidden_act: str = "gelu_pytorch_tanh"

    @classmethod
    def from_dict(cls, d: dict) -> "Gemma2Config":
        if d.get("use_bidirectional_attention"):
            raise HeadLensError("The from-scratch engine's Gemma 2 is causal; this model attends both ways. Choose "
                                "the transformers engine for it.")
        return cls.read(gemma_layer_types(d, 2), source=d, hidden_act=d.get("hidden_activation", "gelu_pytorch_tanh"))


class Gemma2(FamilyDecoder):
    config_class = Gemma2Config
    model_types = ("gemma2",)
    description = "Gemma 2 decoders"
    family = Family(norm="gemma_rms", post_norms=True, embed_scale=True)
    weights = Weights(GEMMA_NAMES, LLAMA_QKV, what="the weights of a Gemma 2 decoder")
