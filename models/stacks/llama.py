"""Llama-family decoders (Llama, Mistral, Qwen2) as a family of ``FamilyDecoder``.

As transformers' ``modeling_llama.py`` computes it: token embeddings, then pre-norm blocks
``x = x + Attn(RMSNorm(x)); x = x + MLP(RMSNorm(x))`` with rotary positions on the queries and keys, grouped-query
attention and a SwiGLU feed-forward ``down(silu(gate(x)) * up(x))``; a final RMSNorm and the unembedding, tied to
the embeddings when the config says so. Qwen2 has biases on q, k and v, and a sliding window in its upper layers
when its config asks for one; Mistral a sliding window in every layer.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import HeadLensError
from .family import FULL, SLIDING, Family, FamilyConfig, FamilyDecoder
from .weights import Weights, separate_qkv

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
QWEN2_MAX_WINDOW_LAYERS = 28  # transformers' Qwen2Config: the layers below this one attend to every earlier token


@dataclass(frozen=True)
class LlamaConfig(FamilyConfig):
    """A transformers Llama, Mistral or Qwen2 ``config.json``'s sizes, under its own names."""

    model_type: str = "llama"                 # "llama", "mistral" or "qwen2": written back as it came

    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias or self.model_type == "qwen2"

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        d = dict(d)
        if d.get("hidden_act", "silu") != "silu":
            raise HeadLensError(f"The from-scratch engine's Llama has a SiLU feed-forward; this model's is "
                                f"'{d['hidden_act']}'. Choose the transformers engine for it.")
        if d.get("model_type") != "qwen2":  # Llama's and Mistral's windows are the same in every layer
            return cls.read({k: v for k, v in d.items() if k != "layer_types"})
        # Qwen2, as transformers reads it: a window only with use_sliding_window, and then only in the layers from
        # max_window_layers up (what layer_types says, where the file has them)
        if not d.get("use_sliding_window"):
            d["sliding_window"] = None
        elif d.get("sliding_window") is not None and not d.get("layer_types"):
            first = d.get("max_window_layers", QWEN2_MAX_WINDOW_LAYERS)
            d["layer_types"] = [SLIDING if i >= first else FULL for i in range(d.get("num_hidden_layers", cls.num_hidden_layers))]
        return cls.read(d)

    def to_dict(self) -> dict:
        d = super().to_dict()
        if self.model_type == "qwen2" and self.sliding_window is not None:
            d["use_sliding_window"] = True  # transformers' Qwen2 reads the window only with it, layer by layer
        else:
            del d["layer_types"]
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": d.pop("rope_theta")}  # transformers 5's place
        for unused in ("partial_rotary_factor", "mlp_bias"):
            d.pop(unused)
        d["architectures"] = [ARCHITECTURES[self.model_type]]
        return d


# the from-scratch engine's names -> transformers', Llama's and every family that names its weights as Llama does
LLAMA_NAMES = (("embedding.", "model.embed_tokens."), ("norm.", "model.norm."), ("lm_head.", "lm_head."),
               ("layers.{i}.", "model.layers.{i}."), ("layers.{i}.ln_attn.", "model.layers.{i}.input_layernorm."),
               ("layers.{i}.ln_mlp.", "model.layers.{i}.post_attention_layernorm."),
               ("layers.{i}.attn.out_proj.", "model.layers.{i}.self_attn.o_proj."),
               ("layers.{i}.attn.q_norm.", "model.layers.{i}.self_attn.q_norm."),
               ("layers.{i}.attn.k_norm.", "model.layers.{i}.self_attn.k_norm."),
               ("layers.{i}.gate.", "model.layers.{i}.mlp.gate_proj."),
               ("layers.{i}.up.", "model.layers.{i}.mlp.up_proj."),
               ("layers.{i}.down.", "model.layers.{i}.mlp.down_proj."))
LLAMA_QKV = tuple(separate_qkv("model.layers.{i}.self_attn.{p}_proj", kind) for kind in ("weight", "bias"))


class Llama(FamilyDecoder):
    """Token embeddings, causal Llama blocks, a final RMSNorm and the unembedding."""

    config_class = LlamaConfig
    model_types = ("llama", "mistral", "qwen2")
    description = "Llama-family decoders (Llama, Mistral, Qwen2)"
    family = Family()
    weights = Weights(LLAMA_NAMES, LLAMA_QKV, what="the weights of a Llama-family decoder")
