"""A Llama-family decoder (Llama, Mistral, Qwen2) on our MultiHeadAttention.

As transformers' ``modeling_llama.py`` computes it: token embeddings, then pre-norm blocks
``x = x + Attn(RMSNorm(x)); x = x + MLP(RMSNorm(x))`` with rotary positions on the queries and
keys, grouped-query attention (``num_key_value_heads`` key/value heads, each read by a group of
query heads) and a SwiGLU feed-forward ``down(silu(gate(x)) * up(x))``; a final RMSNorm and the
unembedding, tied to the embeddings when the config says so. Weights load from a transformers
folder (config.json and safetensors, ``model.``-prefixed names) and save back to one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HeadLensError
from ..mha import MultiHeadAttention
from ..rotary import Rotary
from .base import Stack, StackConfig, TransformersSizes
from .blocks import GatedBlock


@dataclass(frozen=True)
class LlamaConfig(TransformersSizes, StackConfig):
    """A transformers Llama, Mistral or Qwen2 ``config.json``'s sizes, under its own names."""

    model_type: str = "llama"                 # "llama", "mistral" or "qwen2": written back as it came
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None    # None: one per query head
    head_dim: int | None = None               # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False              # Llama: biases on q, k, v and o; Qwen2 has them on q, k, v always
    sliding_window: int | None = None         # Mistral: a query sees the last this many keys
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pruned_heads: tuple = ()

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        d = dict(d)
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise HeadLensError(f"The from-scratch engine has plain rotary positions only; this model scales them "
                                f"('{rope.get('rope_type', rope.get('type'))}'). Choose the transformers engine for it.")
        d.setdefault("rope_theta", rope.get("rope_theta", cls.rope_theta))
        if d.get("hidden_act", "silu") != "silu":
            raise HeadLensError(f"The from-scratch engine's Llama has a SiLU feed-forward; this model's is "
                                f"'{d['hidden_act']}'. Choose the transformers engine for it.")
        if d.get("model_type") == "qwen2" and not d.get("use_sliding_window"):
            d["sliding_window"] = None
        config = cls.from_fields(d)
        if config.num_attention_heads % config.kv_heads:
            raise HeadLensError(f"The model's {config.num_attention_heads} query heads do not share its "
                                f"{config.kv_heads} key/value heads evenly.")
        return config

    def to_dict(self) -> dict:
        d = {k: v for k, v in super().to_dict().items() if v is not None}  # transformers reads null as a value
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": d.pop("rope_theta")}  # transformers 5's place
        d["architectures"] = [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                               "qwen2": "Qwen2ForCausalLM"}[self.model_type]]
        return d


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


def llama_block(c: LlamaConfig, kept: list[int], rotary: Rotary) -> GatedBlock:
    """``x + Attn(RMSNorm(x))``, then ``x + MLP(RMSNorm(x))`` (SwiGLU), with the query heads ``kept`` of the config's."""
    group = c.num_attention_heads // c.kv_heads
    kv_kept = sorted({h // group for h in kept})
    attn = MultiHeadAttention(c.hidden_size, len(kept), head_dim=c.dim_per_head,
                              bias=c.attention_bias or c.model_type == "qwen2", out_bias=c.attention_bias,
                              num_kv_heads=len(kv_kept), kv_heads=[kv_kept.index(h // group) for h in kept],
                              rotary=rotary, window=c.sliding_window)
    return GatedBlock(attn, lambda: RMSNorm(c.hidden_size, c.rms_norm_eps), c.intermediate_size, F.silu,
                      post_norms=False)


class Llama(Stack):
    """Token embeddings, causal Llama blocks, a final RMSNorm and the unembedding."""

    config_class = LlamaConfig
    model_types = ("llama", "mistral", "qwen2")
    description = "Llama-family decoders (Llama, Mistral, Qwen2)"
    causal = True
    language_model = True

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        rotary = Rotary(config.dim_per_head, config.rope_theta)
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(llama_block(config, kept, rotary) for kept in self.kept)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is not None:
            raise ValueError("A decoder reads no token types (see input_names).")
        return self.embedding(input_ids)                                    # (B, L, E)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.unembedding())                                 # (B, L, vocab)

    def unembedding(self) -> torch.Tensor:
        return self.embedding.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def token_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids.to(self.embedding.weight.device))

    def norm_alone(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def norm_linear(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.norm.weight

    def frozen_finish(self, x: torch.Tensor):
        scale = self.norm.weight * self.norm.inverse_rms(x).to(x.dtype)                        # (E,)
        return (lambda part: part * scale), torch.zeros_like(x)

    @classmethod
    def untrained(cls, config: LlamaConfig, seed: int = 0) -> "Llama":
        """Weights drawn from normal(0, 0.02) reproducibly for ``seed`` (transformers' initializer_range),
        norms at 1, biases at 0."""
        gen = torch.Generator().manual_seed(seed)
        model = cls(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        return model.eval()

    def to_file(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for name, tensor in state.items():
            fused = re.fullmatch(r"layers\.(\d+)\.attn\.in_proj_(weight|bias)", name)
            if fused:
                i, kind = fused.groups()
                attn = self.layers[int(i)].attn
                for part, chunk in zip("qkv", tensor.split(attn.sizes)):
                    out[f"model.layers.{i}.self_attn.{part}_proj.{kind}"] = chunk
            else:
                out[_to_hf(name)] = tensor
        return out

    @classmethod
    def from_file(cls, weights: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
        scratch, missing = {}, []

        def take(name: str) -> torch.Tensor | None:
            if name not in weights:
                missing.append(name)
            return weights.get(name)

        for i in range(config.num_hidden_layers):
            for kind in ("weight", "bias"):
                qkv = [weights.get(f"model.layers.{i}.self_attn.{p}_proj.{kind}") for p in "qkv"]
                if all(t is not None for t in qkv):
                    scratch[f"layers.{i}.attn.in_proj_{kind}"] = torch.cat(qkv)
                elif kind == "weight":
                    missing.append(f"model.layers.{i}.self_attn.q_proj.weight")
        with torch.device("meta"):  # the names only: nothing is allocated
            expected = [n for n in cls(config).state_dict() if ".attn.in_proj_" not in n]
        for name in expected:
            scratch[name] = take(_to_hf(name))
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise HeadLensError(f"These are not the weights of a Llama-family decoder: missing {shown}.")
        return scratch


_RENAMES = [  # the from-scratch engine's -> transformers', on names without the "model." prefix
    ("embedding.", "embed_tokens."), ("norm.", "norm."), ("ln_attn.", "input_layernorm."),
    ("ln_mlp.", "post_attention_layernorm."), ("attn.out_proj.", "self_attn.o_proj."), ("gate.", "mlp.gate_proj."),
    ("up.", "mlp.up_proj."), ("down.", "mlp.down_proj."),
]


def _to_hf(name: str) -> str:
    if name.startswith("lm_head."):
        return name
    layer = re.fullmatch(r"(layers\.\d+\.)(.+)", name)
    prefix, rest = layer.groups() if layer else ("", name)
    for scratch, theirs in _RENAMES:
        if rest.startswith(scratch):
            return f"model.{prefix}{theirs}{rest[len(scratch):]}"
    return f"model.{name}"

