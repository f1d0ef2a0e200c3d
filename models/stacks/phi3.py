"""Phi-3 as a family of ``FamilyDecoder``: Llama's blocks with q, k and v in one projection (``qkv_proj``, q's rows
then k's then v's) and the feed-forward's gate and up in one (``gate_up_proj``), rotary positions on the first
``partial_rotary_factor`` of each head, and a sliding window on every layer when the config gives one."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .family import Family, FamilyConfig, FamilyDecoder
from .llama import LLAMA_NAMES
from .weights import Weights, stacked


@dataclass(frozen=True)
class Phi3Config(FamilyConfig):
    """A transformers Phi-3 ``config.json``'s sizes."""

    model_type: str = "phi3"
    ignored: ClassVar = ("layer_types", "attention_bias")


class Phi3(FamilyDecoder):
    config_class = Phi3Config
    model_types = ("phi3",)
    description = "Phi-3 decoders"
    family = Family()
    weights = Weights(LLAMA_NAMES + (("layers.{i}.attn.in_proj_weight", "model.layers.{i}.self_attn.qkv_proj.weight"),),
                      (stacked(("layers.{i}.gate.weight", "layers.{i}.up.weight"), "model.layers.{i}.mlp.gate_up_proj.weight"),),
                      what="the weights of a Phi-3 decoder")
