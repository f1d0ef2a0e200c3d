"""GPT-NeoX (Pythia) as a family of ``FamilyDecoder``: LayerNorm with a bias, attention and feed-forward side by
side on the same stream (``use_parallel_residual``; in sequence without it), rotary positions on the first
``partial_rotary_factor`` of each head, a GELU feed-forward with biases, and q, k and v in one projection with each
head's three together. The unembedding (``embed_out``) is its own."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .family import Family, FamilyConfig, FamilyDecoder
from .weights import Weights, per_head_qkv

L = "gpt_neox.layers.{i}."


@dataclass(frozen=True)
class GPTNeoXConfig(FamilyConfig):
    """A transformers GPT-NeoX ``config.json``'s sizes."""

    model_type: str = "gpt_neox"
    use_parallel_residual: bool = True

    @classmethod
    def from_dict(cls, d: dict) -> "GPTNeoXConfig":
        rope = {"rope_theta": d.get("rotary_emb_base", 10000.0), "partial_rotary_factor": d.get("rotary_pct", 0.25),
                **(d.get("rope_parameters") or d.get("rope_scaling") or {})}
        return cls.read({k: v for k, v in d.items() if k not in ("layer_types", "sliding_window")}, source=d,
                        rope_parameters=rope, rms_norm_eps=d.get("layer_norm_eps", 1e-5),
                        attention_bias=d.get("attention_bias", True), mlp_bias=True, hidden_act=d.get("hidden_act", "gelu"))


class GPTNeoX(FamilyDecoder):
    """Token embeddings, GPT-NeoX's blocks, a final LayerNorm and the unembedding."""

    config_class = GPTNeoXConfig
    model_types = ("gpt_neox",)
    description = "GPT-NeoX decoders (Pythia)"
    family = Family(norm="layer", parallel=True, gated=False)
    weights = Weights(
        (("embedding.", "gpt_neox.embed_in."), ("norm.", "gpt_neox.final_layer_norm."), ("lm_head.", "embed_out."),
         ("layers.{i}.", L), ("layers.{i}.ln_attn.", L + "input_layernorm."),
         ("layers.{i}.ln_mlp.", L + "post_attention_layernorm."), ("layers.{i}.attn.out_proj.", L + "attention.dense."),
         ("layers.{i}.mlp_in.", L + "mlp.dense_h_to_4h."), ("layers.{i}.mlp_out.", L + "mlp.dense_4h_to_h.")),
        tuple(per_head_qkv(L + "attention.query_key_value", kind) for kind in ("weight", "bias")),
        what="the weights of a GPT-NeoX decoder")

    @classmethod
    def family_for(cls, config: GPTNeoXConfig) -> Family:
        return replace(cls.family, parallel=config.use_parallel_residual)
