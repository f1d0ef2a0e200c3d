"""Qwen3 as a family of ``FamilyDecoder``: Llama's blocks with each head's query and key RMS-normed over its own size
(QK-norm) before the rotary rotation, and a sliding window on the layers ``layer_types`` names."""
from __future__ import annotations

from dataclasses import dataclass

from .family import Family, FamilyConfig, FamilyDecoder
from .llama import LLAMA_NAMES, LLAMA_QKV
from .weights import Weights


@dataclass(frozen=True)
class Qwen3Config(FamilyConfig):
    """A transformers Qwen3 ``config.json``'s sizes."""

    model_type: str = "qwen3"

    @classmethod
    def from_dict(cls, d: dict) -> "Qwen3Config":
        return cls.read({k: v for k, v in d.items() if k != "sliding_window" or d.get("use_sliding_window")}, source=d)


class Qwen3(FamilyDecoder):
    config_class = Qwen3Config
    model_types = ("qwen3",)
    description = "Qwen3 decoders"
    family = Family(qk_norm="head")
    weights = Weights(LLAMA_NAMES, LLAMA_QKV, what="the weights of a Qwen3 decoder")
