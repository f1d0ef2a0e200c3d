"""A small decoder-only transformer built on our MultiHeadAttention, to train and watch heads form.

Pre-LayerNorm blocks, as the seeds describe: layer normalisation is applied to the input of the
multi-head self-attention, and a skip connection adds its output back; an optional feed-forward
block does the same (``attention_only`` leaves it out). Causal: token i sees tokens 0..i. One
block equals ``torch.nn.TransformerEncoderLayer(norm_first=True, batch_first=True)`` run with a
causal mask, weights copied by ``DecoderBlock.from_torch``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HeadLensError
from ..mha import MultiHeadAttention
from .base import Packing, Stack, StackConfig, initialised
from .blocks import PreNormBlock

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


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


class DecoderBlock(PreNormBlock):
    """``x + Attn(LN(x))``, then ``x + MLP(LN(x))`` unless attention-only."""

    def __init__(self, c: DecoderConfig, n_heads: int | None = None):
        super().__init__()
        d = c.d_model
        self.ln_attn = nn.LayerNorm(d, eps=c.layer_norm_eps)
        self.attn = MultiHeadAttention(d, c.n_heads if n_heads is None else n_heads, head_dim=d // c.n_heads,
                                       dropout=c.dropout)
        self.attention_only = c.attention_only
        if not c.attention_only:
            self.ln_mlp = nn.LayerNorm(d, eps=c.layer_norm_eps)
            self.mlp_in = nn.Linear(d, c.d_mlp)
            self.mlp_out = nn.Linear(c.d_mlp, d)
        self.act = ACTIVATIONS[c.activation]
        self.dropout = c.dropout


    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention reads of the block's input ``x``: its LayerNorm."""
        return self.ln_attn(x)

    def forward(self, x: torch.Tensor, *, key_padding_mask=None, packing: Packing | None = None, causal: bool = True,
                need_weights: bool = False, head_mask=None, head_fill=None, hook_in=None, hook_z=None,
                weights_into=None, prefix=None):
        """``x`` ``(B, L, d)``, or ``(N, d)`` real tokens only when ``packing`` is given, and the weights
        ``(B, H, L, L)`` (None unless asked for); ``prefix`` as ``MultiHeadAttention.forward``'s."""
        h = self.ln_attn(x)
        padded = h if packing is None else packing.unpack(h)
        padded = padded if hook_in is None else hook_in(padded)                  # (B, L, d)
        a, weights = self.attn(padded, key_padding_mask=key_padding_mask, need_weights=need_weights,
                               average_attn_weights=False, causal=causal, head_mask=head_mask, head_fill=head_fill,
                               hook_z=hook_z, into=weights_into, prefix=prefix)
        a = a if packing is None else packing.pack(a)                          # like x
        x = x + F.dropout(a, self.dropout, self.training)
        if not self.attention_only:
            x = x + self.mlp_write(x)
        return x, weights

    def mlp_write(self, x: torch.Tensor) -> torch.Tensor:
        """What the feed-forward part writes into the stream ``x`` it reads (not called when attention-only)."""
        h = self.mlp_out(F.dropout(self.act(self.mlp_in(self.ln_mlp(x))), self.dropout, self.training))
        return F.dropout(h, self.dropout, self.training)

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "DecoderBlock":
        """Our block with the weights of a ``norm_first`` PyTorch layer (run it with a causal mask to compare)."""
        if not layer.norm_first or not layer.self_attn.batch_first:
            raise ValueError("Only a norm_first, batch_first TransformerEncoderLayer is a pre-LayerNorm block like the from-scratch engine's")
        act = layer.activation
        name = "gelu" if act is F.gelu or isinstance(act, nn.GELU) else "relu"
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


class Decoder(Stack):
    """Token and learned position embeddings, causal pre-LN blocks, a final LayerNorm and an unembedding."""

    config_class = DecoderConfig
    model_types = ("headlens_decoder",)
    description = "the decoders HeadLens trains"
    causal = True
    language_model = True

    def __init__(self, config: DecoderConfig):
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model ({config.d_model}) must be a multiple of n_heads ({config.n_heads})")
        super().__init__(config)
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.layers = nn.ModuleList(DecoderBlock(config, len(kept)) for kept in self.kept)
        self.ln_final = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)

    @classmethod
    def untrained(cls, config: DecoderConfig, seed: int = 0) -> "Decoder":
        """Initialised reproducibly for ``seed``: normal(0, 0.02) weights (GPT-2's), zero biases."""
        return initialised(cls(config), 0.02, seed)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is not None:
            raise ValueError("A decoder reads no token types (see input_names).")
        L = input_ids.shape[1]
        if L > self.config.max_len:
            raise HeadLensError(f"This model reads at most {self.config.max_len} tokens; the text has {L}.")
        return self.tok_emb(input_ids) + self.pos_emb.weight[:L]               # (B, L, d)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_final(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.unembed(h)                                                 # (B, L, vocab)

    def unembedding(self) -> torch.Tensor:
        return self.unembed.weight

    def token_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok_emb(ids.to(self.tok_emb.weight.device))

    def norm_alone(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_final(x) - self.ln_final.bias

    def norm_linear(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(-1, keepdim=True)) * self.ln_final.weight

    def frozen_finish(self, x: torch.Tensor):
        norm = self.ln_final
        scale = norm.weight / torch.sqrt(x.var(-1, unbiased=False) + norm.eps)            # (E,)
        return (lambda part: (part - part.mean(-1, keepdim=True)) * scale), norm.bias.clone()
