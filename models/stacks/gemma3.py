"""A Gemma 3 decoder (text) on our MultiHeadAttention.

As transformers' ``modeling_gemma3.py`` computes it: token embeddings times ``sqrt(hidden_size)``,
then blocks ``x = x + norm(Attn(norm(x))); x = x + norm(MLP(norm(x)))`` (a norm before and after each
part), RMSNorms that scale by ``1 + weight``, each head's query and key normed over its own size
(QK-norm) before rotary positions, scores multiplied by ``query_pre_attn_scalar ** -0.5``, grouped
key/value heads, and a GeGLU feed-forward ``down(gelu_tanh(gate(x)) * up(x))``. Most layers see only
the last ``sliding_window`` keys and rotate by a local base; the others ("full_attention") see every
earlier key and rotate by the global base. A final norm and the unembedding, tied to the embeddings.
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

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Gemma3Config(TransformersSizes, StackConfig):
    """A transformers ``gemma3_text`` config.json's sizes, under its own names."""

    model_type: str = "gemma3_text"
    vocab_size: int = 262144
    hidden_size: int = 640
    intermediate_size: int = 2048
    num_hidden_layers: int = 18
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    head_dim: int = 256
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0           # the global layers' base
    rope_local_base_freq: float = 10_000.0    # the sliding layers' base
    sliding_window: int = 512
    layer_types: tuple = ()                   # per layer: "sliding_attention" or "full_attention"
    query_pre_attn_scalar: float = 256.0
    final_logit_softcapping: float | None = None
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    pruned_heads: tuple = ()

    @classmethod
    def from_dict(cls, d: dict) -> "Gemma3Config":
        d = dict(d)
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
        n = d.get("num_hidden_layers", cls.num_hidden_layers)
        types = d.get("layer_types")
        if not types:
            pattern = d.get("sliding_window_pattern") or 6
            types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
        if len(types) != n or any(t not in (SLIDING, FULL) for t in types):
            raise HeadLensError(f"The model's layer_types must name {n} layers, each sliding_attention or "
                                "full_attention.")
        d["layer_types"] = tuple(types)
        config = cls.from_fields(d)
        if config.num_attention_heads % config.num_key_value_heads:
            raise HeadLensError(f"The model's {config.num_attention_heads} query heads do not share its "
                                f"{config.num_key_value_heads} key/value heads evenly.")
        return config

    def to_dict(self) -> dict:
        d = {k: v for k, v in super().to_dict().items() if v is not None}
        d["layer_types"] = list(self.layer_types)
        d["rope_parameters"] = {FULL: {"rope_type": "default", "rope_theta": d.pop("rope_theta")},
                                SLIDING: {"rope_type": "default", "rope_theta": d.pop("rope_local_base_freq")}}
        d.update(hidden_activation="gelu_pytorch_tanh", architectures=["Gemma3ForCausalLM"])
        return d


class GemmaRMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) * (1 + weight)``, in float32 (float64 stays float64), as transformers' Gemma 3."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def inverse_rms(self, x: torch.Tensor) -> torch.Tensor:
        h = x if x.dtype == torch.float64 else x.float()
        return torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)

    def gain(self) -> torch.Tensor:
        """What a normalised vector is multiplied by: ``1 + weight``."""
        return 1.0 + self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if x.dtype == torch.float64 else x.float()
        return (h * self.inverse_rms(h) * (1.0 + self.weight.to(h.dtype))).to(x.dtype)


def gemma3_block(c: Gemma3Config, kept: list[int], layer: int, rotary: dict[str, Rotary]) -> GatedBlock:
    """``x + norm(Attn(norm(x)))``, then ``x + norm(MLP(norm(x)))`` (GeGLU), with the query heads ``kept``: QK-norm,
    the query scale, and in a sliding layer the window and the local rotary base."""
    group = c.num_attention_heads // c.num_key_value_heads
    kv_kept = sorted({h // group for h in kept})
    kind = c.layer_types[layer]
    attn = MultiHeadAttention(c.hidden_size, len(kept), head_dim=c.head_dim, bias=False, out_bias=False,
                              num_kv_heads=len(kv_kept), kv_heads=[kv_kept.index(h // group) for h in kept],
                              rotary=rotary[kind],
                              qk_norm=(GemmaRMSNorm(c.head_dim, c.rms_norm_eps), GemmaRMSNorm(c.head_dim, c.rms_norm_eps)),
                              scale=c.query_pre_attn_scalar ** -0.5,
                              window=c.sliding_window if kind == SLIDING else None)
    return GatedBlock(attn, lambda: GemmaRMSNorm(c.hidden_size, c.rms_norm_eps), c.intermediate_size,
                      lambda x: F.gelu(x, approximate="tanh"), post_norms=True)


class Gemma3(Stack):
    """Scaled token embeddings, causal Gemma 3 blocks, a final norm and the tied unembedding."""

    config_class = Gemma3Config
    model_types = ("gemma3_text",)
    description = "Gemma 3 decoders (text)"
    causal = True
    language_model = True

    def __init__(self, config: Gemma3Config):
        super().__init__(config)
        rotary = {FULL: Rotary(config.head_dim, config.rope_theta),
                  SLIDING: Rotary(config.head_dim, config.rope_local_base_freq)}
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(gemma3_block(config, kept, i, rotary) for i, kept in enumerate(self.kept))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def embed_scale(self) -> torch.Tensor:
        """``sqrt(hidden_size)`` in the weights' dtype, as transformers multiplies by it."""
        return torch.tensor(self.config.hidden_size ** 0.5, dtype=self.embedding.weight.dtype)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is not None:
            raise ValueError("A decoder reads no token types (see input_names).")
        return self.token_vectors(input_ids)                                   # (B, L, E)

    def token_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids.to(self.embedding.weight.device)) * self.embed_scale.to(self.embedding.weight.device)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, self.unembedding())                                # (B, L, vocab)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def unembedding(self) -> torch.Tensor:
        return self.embedding.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def norm_alone(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def norm_linear(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.norm.gain().to(x.dtype)

    def frozen_finish(self, x: torch.Tensor):
        scale = self.norm.gain().to(x.dtype) * self.norm.inverse_rms(x).to(x.dtype)               # (E,)
        return (lambda part: part * scale), torch.zeros_like(x)

    @classmethod
    def untrained(cls, config: Gemma3Config, seed: int = 0) -> "Gemma3":
        """Weights drawn from normal(0, 0.02) reproducibly for ``seed``, norms at 0 (a gain of 1)."""
        gen = torch.Generator().manual_seed(seed)
        model = cls(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1:
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        return model.eval()

    def to_file(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for name, tensor in state.items():
            fused = re.fullmatch(r"layers\.(\d+)\.attn\.in_proj_weight", name)
            if fused:
                i = fused.group(1)
                for part, chunk in zip("qkv", tensor.split(self.layers[int(i)].attn.sizes)):
                    out[f"model.layers.{i}.self_attn.{part}_proj.weight"] = chunk
            else:
                out[_to_hf(name)] = tensor
        return out

    @classmethod
    def from_file(cls, weights: dict[str, torch.Tensor], config: Gemma3Config) -> dict[str, torch.Tensor]:
        scratch, missing = {}, []
        for i in range(config.num_hidden_layers):
            qkv = [weights.get(f"model.layers.{i}.self_attn.{p}_proj.weight") for p in "qkv"]
            if all(t is not None for t in qkv):
                scratch[f"layers.{i}.attn.in_proj_weight"] = torch.cat(qkv)
            else:
                missing.append(f"model.layers.{i}.self_attn.q_proj.weight")
        with torch.device("meta"):  # the names only: nothing is allocated
            expected = [n for n in cls(config).state_dict() if ".attn.in_proj_" not in n]
        for name in expected:
            theirs = _to_hf(name)
            if theirs not in weights:
                missing.append(theirs)
            scratch[name] = weights.get(theirs)
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise HeadLensError(f"These are not the weights of a Gemma 3 decoder: missing {shown}.")
        return scratch


_RENAMES = [  # the from-scratch engine's -> transformers', on names without the "model." prefix
    ("embedding.", "embed_tokens."), ("norm.", "norm."), ("ln_attn.", "input_layernorm."),
    ("ln_attn_out.", "post_attention_layernorm."), ("ln_mlp.", "pre_feedforward_layernorm."),
    ("ln_mlp_out.", "post_feedforward_layernorm."), ("attn.out_proj.", "self_attn.o_proj."),
    ("attn.q_norm.", "self_attn.q_norm."), ("attn.k_norm.", "self_attn.k_norm."), ("gate.", "mlp.gate_proj."),
    ("up.", "mlp.up_proj."), ("down.", "mlp.down_proj."),
]


def _to_hf(name: str) -> str:
    if name.startswith("lm_head."):
        return name
    layer = re.fullmatch(r"(layers\.\d+\.)(.+)", name)
    prefix, rest = layer.groups() if layer else ("", name)
    for scratch, theirs in sorted(_RENAMES, key=lambda r: -len(r[0])):  # ln_attn_out. before ln_attn.
        if rest.startswith(scratch):
            return f"model.{prefix}{theirs}{rest[len(scratch):]}"
    return f"model.{name}"
