"""A BERT-family encoder built on our MultiHeadAttention.

Embeddings (word + position + token type, LayerNorm), then post-LayerNorm blocks:
``x = LN(x + Attn(x)); x = LN(x + FFN(x))`` with a GELU feed-forward. Loads a transformers
BERT checkpoint (safetensors) and reproduces ``transformers.BertModel`` number for number.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HeadLensError
from ..mha import MultiHeadAttention
from .base import Packing, Stack, StackConfig, TransformersSizes, initialised

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


@dataclass(frozen=True)
class EncoderConfig(TransformersSizes, StackConfig):
    """A transformers BERT ``config.json``'s sizes, with the pruned heads where transformers 4 kept them."""

    model_type = "bert"
    header = {"architectures": ["BertModel"]}
    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # heads removed by pruning, as ((layer, (head, ...)), ...); config.json writes {"layer": [head, ...]}
    pruned_heads: tuple = ()


    @classmethod
    def from_dict(cls, d: dict) -> "EncoderConfig":
        """From a transformers ``config.json`` of a BERT model; unknown keys are ignored."""
        model_type = d.get("model_type", "bert")
        if model_type != "bert":
            raise HeadLensError(
                f"The from-scratch engine implements BERT encoders; this model is '{model_type}'. "
                "Choose the transformers engine for it.")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise HeadLensError("The from-scratch engine supports absolute position embeddings only; "
                                "choose the transformers engine for this model.")
        if d.get("hidden_act", "gelu") not in ACTIVATIONS:
            raise HeadLensError(f"The from-scratch engine has no activation '{d['hidden_act']}'.")
        return cls.from_fields(d)


class Embeddings(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = c.hidden_dropout_prob

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        L = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.position_embeddings.weight[:L]  # (B, L, E)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return F.dropout(self.LayerNorm(x), self.dropout, self.training)


class Block(nn.Module):
    """One post-LayerNorm transformer block, with ``n_heads`` of the config's heads (fewer once pruned)."""

    def __init__(self, c: EncoderConfig, n_heads: int | None = None):
        super().__init__()
        E = c.hidden_size
        self.attn = MultiHeadAttention(E, c.num_attention_heads if n_heads is None else n_heads,
                                       head_dim=E // c.num_attention_heads, dropout=c.attention_probs_dropout_prob)
        self.ln_attn = nn.LayerNorm(E, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(E, c.intermediate_size)
        self.ffn_out = nn.Linear(c.intermediate_size, E)
        self.ln_ffn = nn.LayerNorm(E, eps=c.layer_norm_eps)
        self.act = ACTIVATIONS[c.hidden_act]
        self.dropout = c.hidden_dropout_prob


    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention reads of the block's input ``x``: ``x`` itself (the norm comes after)."""
        return x

    def forward(self, x, *, key_padding_mask=None, packing: Packing | None = None, causal: bool = False,
                need_weights: bool = True, head_mask=None, head_fill=None, hook_in=None, hook_z=None,
                weights_into=None):
        """``x`` is ``(B, L, E)``, or ``(N, E)`` real tokens only when ``packing`` is given."""
        padded = x if packing is None else packing.unpack(x)                  # (B, L, E)
        padded = padded if hook_in is None else hook_in(padded)
        a, weights = self.attn(padded, key_padding_mask=key_padding_mask, causal=causal, head_mask=head_mask,
                               head_fill=head_fill, need_weights=need_weights, average_attn_weights=False,
                               hook_z=hook_z, into=weights_into)
        a = a if packing is None else packing.pack(a)                          # like x
        x = self.ln_attn(x + F.dropout(a, self.dropout, self.training))
        h = self.ffn_out(self.act(self.ffn_in(x)))
        x = self.ln_ffn(x + F.dropout(h, self.dropout, self.training))
        return x, weights


class BertEncoder(Stack):
    """Embeddings and post-LayerNorm blocks, as ``transformers.BertModel`` computes them."""

    config_class = EncoderConfig
    model_types = ("bert",)
    description = "BERT encoders"
    input_names = ("input_ids", "attention_mask", "token_type_ids")

    def __init__(self, config: EncoderConfig):
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(f"hidden_size ({config.hidden_size}) must be a multiple of num_attention_heads "
                             f"({config.num_attention_heads})")
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Block(config, len(kept)) for kept in self.kept)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.embeddings(input_ids, token_type_ids)                      # (B, L, E)

    @classmethod
    def untrained(cls, config: EncoderConfig, seed: int = 0) -> "BertEncoder":
        """Randomly initialised the way BERT initialises before training, reproducibly for ``seed``."""
        model = initialised(cls(config), config.initializer_range, seed)
        with torch.no_grad():
            model.embeddings.word_embeddings.weight[config.pad_token_id].zero_()
        return model.eval()

    def to_file(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """In transformers BERT names, q, k and v apart, as a BERT checkpoint holds them."""
        return state_dict_to_bert(state)

    @classmethod
    def from_file(cls, weights: dict[str, torch.Tensor], config: EncoderConfig) -> dict[str, torch.Tensor]:
        return state_dict_from_bert(weights, config.num_hidden_layers)


_LAYER_RENAMES = {
    "attention.output.dense": "attn.out_proj",
    "attention.output.LayerNorm": "ln_attn",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "ln_ffn",
}


def state_dict_from_bert(hf: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Rename a transformers BERT state dict to the from-scratch engine's names; q, k, v are concatenated into one projection."""
    hf = {_normalise_key(k): v for k, v in hf.items()}
    scratch: dict[str, torch.Tensor] = {}
    missing: list[str] = []

    def take(name: str) -> torch.Tensor | None:
        if name not in hf:
            missing.append(name)
        return hf.get(name)

    for part in ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight",
                 "LayerNorm.weight", "LayerNorm.bias"):
        scratch[f"embeddings.{part}"] = take(f"embeddings.{part}")
    for i in range(n_layers):
        src, dst = f"encoder.layer.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            qkv = [take(f"{src}attention.self.{p}.{kind}") for p in ("query", "key", "value")]
            if all(t is not None for t in qkv):
                scratch[f"{dst}attn.in_proj_{kind}"] = torch.cat(qkv)
            for old, new in _LAYER_RENAMES.items():
                scratch[f"{dst}{new}.{kind}"] = take(f"{src}{old}.{kind}")
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise HeadLensError(f"These are not BERT encoder weights: missing {shown}.")
    return scratch


def state_dict_to_bert(scratch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict in transformers BERT names, contiguous on the CPU, as safetensors stores it."""
    back = {new: old for old, new in _LAYER_RENAMES.items()}
    hf = {}
    for name, tensor in scratch.items():
        tensor = tensor.detach().to("cpu").contiguous()
        proj = re.fullmatch(r"layers\.(\d+)\.attn\.in_proj_(weight|bias)", name)
        other = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", name)
        if proj is not None:
            i, kind = proj.groups()
            parts = tensor.reshape(3, tensor.shape[0] // 3, *tensor.shape[1:])  # q, k, v: the rows of the kept heads
            for part, chunk in zip(("query", "key", "value"), parts):
                hf[f"encoder.layer.{i}.attention.self.{part}.{kind}"] = chunk.contiguous()
        elif other is not None:
            i, module, kind = other.groups()
            hf[f"encoder.layer.{i}.{back[module]}.{kind}"] = tensor
        else:
            hf[name] = tensor
    return hf


def _normalise_key(key: str) -> str:
    key = re.sub(r"^(bert|model)\.", "", key)
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
