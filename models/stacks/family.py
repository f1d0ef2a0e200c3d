"""A decoder family as a declaration: what its blocks compute (``Family``), its sizes as config.json gives them
(``FamilyConfig``) and where its weights lie (``weights.Weights``). ``FamilyDecoder`` builds any of them.

A family file says only what is its own, in a few dozen lines: for Llama, RMSNorm before each part, rotary
positions and a SiLU-gated feed-forward; for GPT-2, LayerNorm with a bias, learned positions and a GELU
feed-forward in transposed Conv1D weights; for GPT-NeoX, attention and feed-forward side by side reading the
same stream, a quarter of each head rotated; for Gemma 2, ``1 + weight`` norms before and after each part and
soft-capped scores. The block (``FamilyBlock``) and the stack are written here once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HeadLensError
from ..mha import MultiHeadAttention
from ..rotary import Rotary
from .base import Stack, StackConfig, TransformersSizes
from ..run import BY_HEAD, Given
from .blocks import NO_EDITS, PreNormBlock
from .norms import ACTIVATIONS, NORMS
from .weights import Weights

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Family:
    """How a family's blocks compute, whatever its sizes.

    ``norm``: "rms" (``weight``), "gemma_rms" (``1 + weight``) or "layer" (LayerNorm with a bias), for every norm;
    ``pre_norms``: a norm before each part (OLMo-2 has none); ``post_norms``: a norm after each part (Gemma 2 and
    3, OLMo-2); ``parallel``: attention and feed-forward read the same stream and add their writes (GPT-NeoX);
    ``positions``: "rotary" or "learned" (absolute, added to the token embeddings: GPT-2); ``qk_norm``: None,
    "head" (each head's query and key, Qwen3 and Gemma 3) or "projection" (the whole projections, OLMo-2);
    ``gated``: ``down(act(gate(x)) * up(x))``, else ``down(act(up(x)))``; ``embed_scale``: embeddings times
    ``sqrt(hidden_size)`` (Gemma); ``mlp``: a feed-forward part at all (a decoder trained attention-only has none)."""

    norm: str = "rms"
    pre_norms: bool = True
    post_norms: bool = False
    parallel: bool = False
    positions: str = "rotary"
    qk_norm: str | None = None
    gated: bool = True
    embed_scale: bool = False
    mlp: bool = True


@dataclass(frozen=True)
class FamilyConfig(TransformersSizes, StackConfig):
    """A decoder's sizes under transformers' Llama names, which each family's ``from_dict`` reads its own into.

    ``layer_types`` (per layer, "sliding_attention" or "full_attention"; none: every layer as ``sliding_window``
    says) give each layer its window and rotary base (``rope_local_base_freq`` in a sliding layer, when given).
    ``source`` is the config.json it was read from (written back on saving, pruned heads updated), or empty.
    """

    model_type: str = ""
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None    # None: one per query head
    head_dim: int | None = None               # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6                # every norm's eps, a LayerNorm's too
    rope_theta: float = 10000.0
    rope_local_base_freq: float | None = None
    partial_rotary_factor: float = 1.0
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    layer_types: tuple = ()
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    dropout: float = 0.0                      # on the attention weights and each part's write, in training
    pruned_heads: tuple = ()
    source: str = ""
    ignored: ClassVar[tuple[str, ...]] = ()   # config.json keys a family does not read (``from_dict``)
    defaults: ClassVar[dict] = {}             # a family's values for keys its config.json may leave out

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias

    @property
    def out_bias(self) -> bool:
        return self.attention_bias

    def window(self, layer: int) -> int | None:
        """How many keys a query of ``layer`` sees (None: every earlier one)."""
        return self.sliding_window if not self.layer_types or self.layer_types[layer] == SLIDING else None

    def rope_base(self, layer: int) -> float:
        sliding = self.layer_types and self.layer_types[layer] == SLIDING
        return self.rope_local_base_freq if sliding and self.rope_local_base_freq else self.rope_theta

    @classmethod
    def from_dict(cls, d: dict):
        """A family whose config.json names its sizes as Llama's does: read as it is, but for the keys the family's
        stack does not read (``ignored``)."""
        return cls.read({k: v for k, v in d.items() if k not in cls.ignored}, source=d)

    @classmethod
    def read(cls, d: dict, source: dict | None = None, **fixed):
        """The config from ``d`` (config.json's keys under these names; ``defaults`` for those it lacks), with the
        checks every family shares: plain rotary positions, a known activation, layer types naming every layer,
        heads sharing key/value heads evenly. ``source``: the config.json to write back."""
        d = {**cls.defaults, **d, **fixed}
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope = rope.get(FULL, rope)  # Gemma 3 gives each kind of layer its own
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise HeadLensError(f"The from-scratch engine has plain rotary positions only; this model scales them "
                                f"('{rope.get('rope_type', rope.get('type'))}'). Choose the transformers engine for it.")
        d.setdefault("rope_theta", rope.get("rope_theta", cls.rope_theta))
        d.setdefault("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
        if d.get("hidden_act", cls.hidden_act) not in ACTIVATIONS:
            raise HeadLensError(f"The from-scratch engine has no activation '{d['hidden_act']}'. Choose the "
                                "transformers engine for this model.")
        n = d.get("num_hidden_layers", cls.num_hidden_layers)
        types = tuple(d.get("layer_types") or ())
        if types and (len(types) != n or any(t not in (SLIDING, FULL) for t in types)):
            raise HeadLensError(f"The model's layer_types must name {n} layers, each sliding_attention or "
                                "full_attention.")
        d["layer_types"] = types
        if source is not None:
            d["source"] = json.dumps(source)
        config = cls.from_fields(d)
        if config.num_attention_heads % config.kv_heads:
            raise HeadLensError(f"The model's {config.num_attention_heads} query heads do not share its "
                                f"{config.kv_heads} key/value heads evenly.")
        return config

    def to_dict(self) -> dict:
        d = super().to_dict()
        if self.source:  # the file it came from, as it was
            return d
        d = {k: v for k, v in d.items() if v is not None}  # transformers reads null as a value
        d["layer_types"] = list(self.layer_types)
        return d


class FamilyBlock(PreNormBlock):
    """``x + post(Attn(pre(x)))``, then ``x + post(MLP(pre(x)))``, or both parts on ``x`` side by side; each norm
    as the family has it (None where it has none), with the query heads ``kept`` of the config's."""

    def __init__(self, family: Family, c: FamilyConfig, kept: list[int], layer: int, rotary: dict[float, Rotary]):
        super().__init__()
        E, Dh = c.hidden_size, c.dim_per_head
        norm = NORMS[family.norm]
        group = c.num_attention_heads // c.kv_heads
        kv_kept = sorted({h // group for h in kept})
        qk_norm = None
        if family.qk_norm == "head":
            qk_norm = (norm(Dh, c.rms_norm_eps), norm(Dh, c.rms_norm_eps))
        elif family.qk_norm == "projection":
            qk_norm = (norm(c.num_attention_heads * Dh, c.rms_norm_eps), norm(c.kv_heads * Dh, c.rms_norm_eps))
        self.ln_attn = norm(E, c.rms_norm_eps) if family.pre_norms else None
        self.attn = MultiHeadAttention(
            E, len(kept), head_dim=Dh, bias=c.qkv_bias, out_bias=c.out_bias, dropout=c.dropout,
            num_kv_heads=len(kv_kept), kv_heads=None if group == 1 else [kv_kept.index(h // group) for h in kept],
            rotary=rotary.get(c.rope_base(layer)) if family.positions == "rotary" else None, qk_norm=qk_norm,
            qk_norm_over=family.qk_norm or "head",
            scale=None if c.query_pre_attn_scalar is None else c.query_pre_attn_scalar ** -0.5,
            window=c.window(layer), softcap=c.attn_logit_softcapping)
        self.ln_attn_out = norm(E, c.rms_norm_eps) if family.post_norms else None
        self.attention_only = not family.mlp
        if family.mlp:
            self.ln_mlp = norm(E, c.rms_norm_eps) if family.pre_norms else None
            if family.gated:  # Llama's gate, up and down
                self.gate = nn.Linear(E, c.intermediate_size, bias=c.mlp_bias)
                self.up = nn.Linear(E, c.intermediate_size, bias=c.mlp_bias)
                self.down = nn.Linear(c.intermediate_size, E, bias=c.mlp_bias)
            else:  # an ungated feed-forward's in and out (GPT-2's c_fc and c_proj)
                self.mlp_in = nn.Linear(E, c.intermediate_size, bias=c.mlp_bias)
                self.mlp_out = nn.Linear(c.intermediate_size, E, bias=c.mlp_bias)
            self.ln_mlp_out = norm(E, c.rms_norm_eps) if family.post_norms else None
        self.act = ACTIVATIONS[c.hidden_act]
        self.gated, self.parallel, self.dropout = family.gated, family.parallel, c.dropout

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention reads of the block's input ``x``: its norm (``x`` itself without one)."""
        return x if self.ln_attn is None else self.ln_attn(x)

    def forward(self, x: torch.Tensor, *, key_padding_mask=None, packing=None, causal: bool = True,
                need_weights: bool = False, head_mask=None, head_fill=None, weights_into=None, edits=NO_EDITS):
        """``x`` ``(B, L, E)``, or ``(N, E)`` real tokens when ``packing`` is given; and the weights or None.
        ``edits``: this layer's (``models.run``), by point; its ``kv`` edit gives the keys and values of the tokens
        before ``x`` (``MultiHeadAttention.forward``'s ``prefix``)."""
        if any(point in edits for point in BY_HEAD):
            return self.by_head(x, edits), None
        a, weights = self.attend(x, packing=packing, edits=edits, key_padding_mask=key_padding_mask, causal=causal,
                                 need_weights=need_weights, head_mask=head_mask, head_fill=head_fill,
                                 weights_into=weights_into)
        written = F.dropout(self.write_alone(a if packing is None else packing.pack(a)), self.dropout, self.training)
        if self.attention_only:
            return x + written, weights
        if self.parallel:
            return x + (self.mlp_part(x, edits) + written), weights
        x = x + written
        return x + self.mlp_part(x, edits), weights

    def attend(self, x: torch.Tensor, *, packing=None, edits=NO_EDITS, weights_into=None, **options):
        """The attention of the block's input ``x``, as ``forward`` runs it: its output ``(B, L, E)`` (padded) and its
        weights or None; ``options``: ``MultiHeadAttention.forward``'s."""
        h = self.attention_input(x)
        padded = h if packing is None else packing.unpack(h)
        if (edit := edits.get("attn_in")) is not None:
            padded = edit(padded)                                                  # (B, L, E)
        kv = edits.get("kv")
        return self.attn(padded, average_attn_weights=False, hook_z=edits.get("z"), hook_pattern=edits.get("pattern"),
                         into=weights_into, prefix=None if kv is None else kv(None), **options)

    def mlp_part(self, x: torch.Tensor, edits=NO_EDITS) -> torch.Tensor:
        """What the feed-forward part writes into the stream ``x`` it reads, through this layer's ``mlp_in`` and
        ``mlp_out`` edits."""
        if (edit := edits.get("mlp_in")) is not None:
            x = edit(x)
        m = x.writes if isinstance(x, Given) else self.mlp_write(x)
        return m if (edit := edits.get("mlp_out")) is None else edit(m)

    def mlp_write(self, x: torch.Tensor) -> torch.Tensor:
        """What the feed-forward part writes into the stream ``x`` it reads (its norms included)."""
        h = x if self.ln_mlp is None else self.ln_mlp(x)
        if self.gated:
            m = self.down(F.dropout(self.act(self.gate(h)) * self.up(h), self.dropout, self.training))
        else:
            m = self.mlp_out(F.dropout(self.act(self.mlp_in(h)), self.dropout, self.training))
        m = m if self.ln_mlp_out is None else self.ln_mlp_out(m)
        return F.dropout(m, self.dropout, self.training)


class FamilyDecoder(Stack):
    """Token embeddings (and learned positions), the family's causal blocks, a final norm and the unembedding,
    tied to the embeddings when the config says so. A family subclasses it with its ``family``, ``config_class``,
    ``weights`` and ``model_types``."""

    family: ClassVar[Family]
    weights: ClassVar[Weights]
    causal = True
    language_model = True

    def __init__(self, config):
        super().__init__(config)
        self.family = f = self.family_for(config)
        self.sizes = c = self.sizes_of(config)
        E = c.hidden_size
        rotary = {}
        if f.positions == "rotary":
            dims = int(c.dim_per_head * c.partial_rotary_factor)
            for base in sorted({c.rope_base(i) for i in range(c.num_hidden_layers)}):
                rotary[base] = Rotary(c.dim_per_head, base, dims)
        self.embedding = nn.Embedding(c.vocab_size, E)
        if f.positions == "learned":
            self.positions = nn.Embedding(c.max_position_embeddings, E)
        self.layers = nn.ModuleList(FamilyBlock(f, c, kept, i, rotary) for i, kept in enumerate(self.kept))
        self.norm = NORMS[f.norm](E, c.rms_norm_eps)
        if not c.tie_word_embeddings:
            self.lm_head = nn.Linear(E, c.vocab_size, bias=False)

    @classmethod
    def family_for(cls, config) -> Family:
        """The family's description for ``config`` (a family whose config.json switches a part on or off)."""
        return cls.family

    @classmethod
    def sizes_of(cls, config) -> FamilyConfig:
        """``config`` under the shared names the blocks read (a family whose config is not a ``FamilyConfig``
        gives it here)."""
        return config

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is not None:
            raise ValueError("A decoder reads no token types (see input_names).")
        x = self.token_vectors(input_ids)                                      # (B, L, E)
        if self.family.positions == "learned":
            L = input_ids.shape[1]
            if L > self.max_positions:
                raise HeadLensError(f"This model reads at most {self.max_positions} tokens; the text has {L}.")
            x = x + self.positions.weight[:L]
        return x

    def token_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.embedding.weight
        x = self.embedding(ids.to(w.device))
        if self.family.embed_scale:  # sqrt(hidden_size) in the weights' dtype, as transformers multiplies by it
            x = x * torch.tensor(self.sizes.hidden_size ** 0.5, dtype=w.dtype, device=w.device)
        return x

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def logits(self, h: torch.Tensor, tokens: slice = slice(None)) -> torch.Tensor:
        logits = F.linear(h, self.unembedding()[tokens])                        # (B, L, vocab)
        cap = self.logit_cap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    @property
    def logit_cap(self) -> float | None:
        return self.sizes.final_logit_softcapping

    def unembedding(self) -> torch.Tensor:
        return self.embedding.weight if self.sizes.tie_word_embeddings else self.lm_head.weight

    @property
    def _layer_norm(self) -> bool:
        return isinstance(self.norm, nn.LayerNorm)

    def norm_alone(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) - self.norm.bias if self._layer_norm else self.norm(x)

    def norm_linear(self, x: torch.Tensor) -> torch.Tensor:
        if self._layer_norm:
            return (x - x.mean(-1, keepdim=True)) * self.norm.weight
        return x * self.norm.gain().to(x.dtype)

    def frozen_finish(self, x: torch.Tensor):
        norm = self.norm
        if self._layer_norm:
            scale = norm.weight / torch.sqrt(x.var(-1, unbiased=False) + norm.eps)             # (E,)
            return (lambda part: (part - part.mean(-1, keepdim=True)) * scale), norm.bias.clone()
        scale = norm.gain().to(x.dtype) * norm.inverse_rms(x).to(x.dtype)                        # (E,)
        return (lambda part: part * scale), torch.zeros_like(x)

    @classmethod
    def untrained(cls, config: FamilyConfig, seed: int = 0) -> "FamilyDecoder":
        """Weights drawn from normal(0, 0.02) reproducibly for ``seed`` (transformers' initializer_range), biases
        at 0, norms as they start (a gain of 1)."""
        gen = torch.Generator().manual_seed(seed)
        model = cls(config)
        gemma = cls.family.norm == "gemma_rms"
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1:
                    p.fill_(0.0 if gemma else 1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        return model.eval()
