"""OLMo-2 as a family of ``FamilyDecoder``: no norm before either part and an RMSNorm after each
(``x + norm(Attn(x))``, then ``x + norm(MLP(x))``), the whole query projection and the whole key projection
RMS-normed before they are split into heads, rotary positions and a SwiGLU feed-forward."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .family import Family, FamilyConfig, FamilyDecoder
from .llama import LLAMA_NAMES, LLAMA_QKV
from .weights import Weights


@dataclass(frozen=True)
class Olmo2Config(FamilyConfig):
    """A transformers OLMo-2 ``config.json``'s sizes."""

    model_type: str = "olmo2"
    ignored: ClassVar = ("layer_types", "sliding_window")


class Olmo2(FamilyDecoder):
    config_class = Olmo2Config
    model_types = ("olmo2",)
    description = "OLMo-2 decoders"
    family = Family(pre_norms=False, post_norms=True, qk_norm="projection")
    weights = Weights(LLAMA_NAMES + (("layers.{i}.ln_attn_out.", "model.layers.{i}.post_attention_layernorm."),
                                     ("layers.{i}.ln_mlp_out.", "model.layers.{i}.post_feedforward_layernorm.")),
                      LLAMA_QKV, what="the weights of an OLMo-2 decoder")
