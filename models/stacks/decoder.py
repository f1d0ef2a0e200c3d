"""A small decoder-only transformer built on our MultiHeadAttention, to train and watch heads form: a family of
``family.FamilyDecoder`` with a config of its own.

Pre-LayerNorm blocks, as the seeds describe: layer normalisation is applied to the input of the
multi-head self-attention, and a skip connection adds its output back; an optional feed-forward
block does the same (``attention_only`` leaves it out). Learned positions; causal: token i sees tokens 0..i. One
block equals ``torch.nn.TransformerEncoderLayer(norm_first=True, batch_first=True)`` run with a
causal mask, weights copied by ``DecoderBlock.from_torch``. Its files keep the names it has always saved
(``tok_emb``, ``pos_emb``, ``mlp_in``, ``mlp_out``, ``ln_final``, ``unembed``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..errors import HeadLensError
from ..mha import MultiHeadAttention
from .base import StackConfig, initialised
from .family import Family, FamilyBlock, FamilyConfig, FamilyDecoder
from .weights import Weights

ACTIVATIONS = ("relu", "gelu")


@dataclass(frozen=True)
class DecoderConfig(StackConfig):
    model_type = "headlens_decoder"

    vocab_size: int = 64
    max_len: int = 64                 # positions with a learned embedding: the longest text it reads
    # the blocks
    n_layers: int = 2
    n_heads: int = 2
    d_model: int = 64
    attention_only: bool = True       # no feed-forward block
    d_mlp: int = 256
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    dropout: float = 0.0
    # heads removed by pruning, as ((layer, (head, ...)), ...)
    pruned_heads: tuple = ()

    @classmethod
    def from_dict(cls, d: dict) -> "DecoderConfig":
        config = cls.from_fields(d)
        if config.d_model % config.n_heads or config.activation not in ACTIVATIONS:
            raise HeadLensError("The decoder's config.json has a width that its heads do not divide, "
                                "or an activation HeadLens does not have.")
        return config

    @property
    def max_positions(self) -> int:
        return self.max_len


def _sizes(c: DecoderConfig) -> FamilyConfig:
    """A trained decoder's config under the names the family blocks read: biases everywhere, none tied."""
    return FamilyConfig(model_type=c.model_type, vocab_size=c.vocab_size, hidden_size=c.d_model,
                        intermediate_size=c.d_mlp, num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                        max_position_embeddings=c.max_len, rms_norm_eps=c.layer_norm_eps, attention_bias=True,
                        mlp_bias=True, hidden_act=c.activation, dropout=c.dropout)


FAMILY = Family(norm="layer", positions="learned", gated=False)


class DecoderBlock(FamilyBlock):
    """``x + Attn(LN(x))``, then ``x + MLP(LN(x))`` unless attention-only: a family block of the trained decoder."""

    def __init__(self, c: DecoderConfig, n_heads: int | None = None):
        super().__init__(replace(FAMILY, mlp=not c.attention_only), _sizes(c),
                         list(range(c.n_heads if n_heads is None else n_heads)), 0, {})

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "DecoderBlock":
        """Our block with the weights of a ``norm_first`` PyTorch layer (run it with a causal mask to compare)."""
        if not layer.norm_first or not layer.self_attn.batch_first:
            raise ValueError("Only a norm_first, batch_first TransformerEncoderLayer is a pre-LayerNorm block like the from-scratch engine's")
        act = layer.activation
        name = "gelu" if act is torch.nn.functional.gelu or isinstance(act, nn.GELU) else "relu"
        c = DecoderConfig(n_heads=layer.self_attn.num_heads, d_model=layer.self_attn.embed_dim,
                          attention_only=False, d_mlp=layer.linear1.out_features, activation=name,
                          layer_norm_eps=layer.norm1.eps, dropout=layer.dropout.p)
        block = cls(c).to(layer.linear1.weight)
        block.attn = MultiHeadAttention.from_torch(layer.self_attn)
        with torch.no_grad():
            for scratch, theirs in ((block.ln_attn, layer.norm1), (block.ln_mlp, layer.norm2),
                                    (block.mlp_in, layer.linear1), (block.mlp_out, layer.linear2)):
                scratch.load_state_dict(theirs.state_dict())
        return block


class Decoder(FamilyDecoder):
    """Token and learned position embeddings, causal pre-LN blocks, a final LayerNorm and an unembedding."""

    config_class = DecoderConfig
    model_types = ("headlens_decoder",)
    description = "the decoders HeadLens trains"
    family = FAMILY
    weights = Weights((("embedding.", "tok_emb."), ("positions.", "pos_emb."), ("norm.", "ln_final."),
                       ("lm_head.", "unembed."), ("layers.{i}.", "layers.{i}.")),
                      what="the weights of a decoder HeadLens trained")

    def __init__(self, config: DecoderConfig):
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model ({config.d_model}) must be a multiple of n_heads ({config.n_heads})")
        super().__init__(config)

    @classmethod
    def family_for(cls, config: DecoderConfig) -> Family:
        return replace(FAMILY, mlp=not config.attention_only)

    @classmethod
    def sizes_of(cls, config: DecoderConfig) -> FamilyConfig:
        return _sizes(config)

    @classmethod
    def untrained(cls, config: DecoderConfig, seed: int = 0) -> "Decoder":
        """Initialised reproducibly for ``seed``: normal(0, 0.02) weights (GPT-2's), zero biases."""
        return initialised(cls(config), 0.02, seed)

    # the names it has always had
    tok_emb = property(lambda self: self.embedding)
    pos_emb = property(lambda self: self.positions)
    ln_final = property(lambda self: self.norm)
    unembed = property(lambda self: self.lm_head)
