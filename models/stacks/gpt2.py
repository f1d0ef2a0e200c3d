"""GPT-2 as a family of ``FamilyDecoder``: LayerNorm with a bias before each part, learned absolute positions, a
GELU (tanh) feed-forward ``down(gelu(up(x)))`` with biases, and every projection a transposed Conv1D in its files
(q, k and v one of them). The unembedding is tied to the token embeddings."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import HeadLensError
from .family import Family, FamilyConfig, FamilyDecoder
from .weights import Weights, transposed

H = "transformer.h.{i}."


@dataclass(frozen=True)
class GPT2Config(FamilyConfig):
    """A transformers GPT-2 ``config.json``, its ``n_embd``, ``n_layer``, ... read into the shared names."""

    model_type: str = "gpt2"

    @classmethod
    def from_dict(cls, d: dict) -> "GPT2Config":
        for key, allowed in (("scale_attn_by_inverse_layer_idx", False), ("scale_attn_weights", True),
                             ("add_cross_attention", False)):
            if d.get(key, allowed) != allowed:
                raise HeadLensError(f"The from-scratch engine's GPT-2 has {key} = {allowed!r}; this model's is "
                                    f"{d[key]!r}. Choose the transformers engine for it.")
        E = d.get("n_embd", 768)
        return cls.read({
            "vocab_size": d.get("vocab_size", 50257), "hidden_size": E, "intermediate_size": d.get("n_inner") or 4 * E,
            "num_hidden_layers": d.get("n_layer", 12), "num_attention_heads": d.get("n_head", 12),
            "max_position_embeddings": d.get("n_positions", 1024), "rms_norm_eps": d.get("layer_norm_epsilon", 1e-5),
            "hidden_act": d.get("activation_function", "gelu_new"), "attention_bias": True, "mlp_bias": True,
            "tie_word_embeddings": d.get("tie_word_embeddings", True), "bos_token_id": d.get("bos_token_id"),
            "eos_token_id": d.get("eos_token_id"), "pruned_heads": d.get("pruned_heads")}, source=d)


class GPT2(FamilyDecoder):
    """Token and position embeddings, GPT-2's blocks, a final LayerNorm and the tied unembedding."""

    config_class = GPT2Config
    model_types = ("gpt2",)
    description = "GPT-2 decoders"
    family = Family(norm="layer", positions="learned", gated=False)
    weights = Weights(
        (("embedding.", "transformer.wte."), ("positions.", "transformer.wpe."), ("norm.", "transformer.ln_f."),
         ("lm_head.", "lm_head."), ("layers.{i}.", H), ("layers.{i}.ln_attn.", H + "ln_1."),
         ("layers.{i}.ln_mlp.", H + "ln_2."), ("layers.{i}.attn.in_proj_bias", H + "attn.c_attn.bias"),
         ("layers.{i}.attn.out_proj.bias", H + "attn.c_proj.bias"), ("layers.{i}.mlp_in.bias", H + "mlp.c_fc.bias"),
         ("layers.{i}.mlp_out.bias", H + "mlp.c_proj.bias")),
        (transposed("layers.{i}.attn.in_proj_weight", H + "attn.c_attn.weight"),
         transposed("layers.{i}.attn.out_proj.weight", H + "attn.c_proj.weight"),
         transposed("layers.{i}.mlp_in.weight", H + "mlp.c_fc.weight"),
         transposed("layers.{i}.mlp_out.weight", H + "mlp.c_proj.weight")), what="the weights of a GPT-2 decoder",
        # a GPT2Model's file names its weights without the "transformer." a GPT2LMHeadModel's has
        normalise=lambda k: k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}")
