"""Gemma 3 decoders (text) as a family of ``FamilyDecoder``.

As transformers' ``modeling_gemma3.py`` computes it: token embeddings times ``sqrt(hidden_size)``, then blocks
``x = x + norm(Attn(norm(x))); x = x + norm(MLP(norm(x)))`` (a norm before and after each part), RMSNorms that scale
by ``1 + weight``, each head's query and key normed over its own size (QK-norm) before rotary positions, scores
multiplied by ``query_pre_attn_scalar ** -0.5``, grouped key/value heads, and a GeGLU feed-forward. Most layers
see only the last ``sliding_window`` keys and rotate by a local base; the others ("full_attention") see every
earlier key and rotate by the global base. A final norm and the unembedding, tied to the embeddings.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import HeadLensError
from .family import FULL, SLIDING, Family, FamilyConfig, FamilyDecoder
from .llama import LLAMA_NAMES, LLAMA_QKV
from .weights import Weights

# Gemma's norms around each part, on top of Llama's names (the longest prefix wins)
GEMMA_NAMES = LLAMA_NAMES + (
    ("layers.{i}.ln_attn_out.", "model.layers.{i}.post_attention_layernorm."),
    ("layers.{i}.ln_mlp.", "model.layers.{i}.pre_feedforward_layernorm."),
    ("layers.{i}.ln_mlp_out.", "model.layers.{i}.post_feedforward_layernorm."))


def gemma_layer_types(d: dict, pattern: int) -> dict:
    """``d`` with ``layer_types`` named, from ``sliding_window_pattern`` (every ``pattern``-th layer full) when absent."""
    if d.get("layer_types"):
        return d
    n = d.get("num_hidden_layers", 0)
    pattern = d.get("sliding_window_pattern") or pattern
    return {**d, "layer_types": [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]}


@dataclass(frozen=True)
class Gemma3Config(FamilyConfig):
    """A transformers ``gemma3_text`` config.json's sizes, under its own names."""

    model_type: str = "gemma3_text"
    defaults: ClassVar[dict] = dict(  # transformers' Gemma 3 270M values, for a config.json that leaves one out
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0, sliding_window=512, query_pre_attn_scalar=256.0, tie_word_embeddings=True)
    hidden_act: str = "gelu_pytorch_tanh"

    @classmethod
    def from_dict(cls, d: dict) -> "Gemma3Config":
        d = {**cls.defaults, **d}
        rope = d.get("rope_parameters") or {}
        for kind, key in ((FULL, "rope_theta"), (SLIDING, "rope_local_base_freq")):
            params = rope.get(kind) or {}
            if params.get("rope_type", "default") != "default":
                raise HeadLensError(f"The from-scratch engine has plain rotary positions only; this model scales "
                                    f"its {kind.split('_')[0]} layers' ('{params['rope_type']}'). Choose the "
                                    "transformers engine for it.")
            if "rope_theta" in params:
                d[key] = params["rope_theta"]
        for key, allowed in (("hidden_activation", "gelu_pytorch_tanh"), ("attn_logit_softcapping", None),
                             ("attention_bias", False), ("use_bidirectional_attention", False)):
            if d.get(key, allowed) != allowed:
                raise HeadLensError(f"The from-scratch engine's Gemma 3 has {key} = {allowed!r}; this model's is "
                                    f"{d[key]!r}. Choose the transformers engine for it.")
        d.pop("hidden_act", None)
        return cls.read(gemma_layer_types(d, 6), rope_parameters=None)

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["rope_parameters"] = {FULL: {"rope_type": "default", "rope_theta": d.pop("rope_theta")},
                                SLIDING: {"rope_type": "default", "rope_theta": d.pop("rope_local_base_freq")}}
        for unused in ("hidden_act", "partial_rotary_factor", "mlp_bias", "attention_bias"):
            d.pop(unused, None)
        d.update(hidden_activation="gelu_pytorch_tanh", architectures=["Gemma3ForCausalLM"])
        return d


class Gemma3(FamilyDecoder):
    """Scaled token embeddings, causal Gemma 3 blocks, a final norm and the tied unembedding."""

    config_class = Gemma3Config
    model_types = ("gemma3_text",)
    description = "Gemma 3 decoders (text)"
    family = Family(norm="gemma_rms", post_norms=True, qk_norm="head", embed_scale=True)
    weights = Weights(GEMMA_NAMES, LLAMA_QKV[:1], what="the weights of a Gemma 3 decoder")
