"""A BERT-family encoder built on our MultiHeadAttention.

Embeddings (word + position + token type, LayerNorm), then post-LayerNorm blocks:
``x = LN(x + Attn(x)); x = LN(x + FFN(x))`` with a GELU feed-forward. Loads a transformers
BERT checkpoint (safetensors) and reproduces ``transformers.BertModel`` number for number.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .errors import HeadLensError
from .mha import MultiHeadAttention

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


@dataclass(frozen=True)
class EncoderConfig:
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
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})


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
    """One post-LayerNorm transformer block."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        E = c.hidden_size
        self.attn = MultiHeadAttention(E, c.num_attention_heads, dropout=c.attention_probs_dropout_prob)
        self.ln_attn = nn.LayerNorm(E, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(E, c.intermediate_size)
        self.ffn_out = nn.Linear(c.intermediate_size, E)
        self.ln_ffn = nn.LayerNorm(E, eps=c.layer_norm_eps)
        self.act = ACTIVATIONS[c.hidden_act]
        self.dropout = c.hidden_dropout_prob

    def forward(self, x, key_padding_mask=None, causal=False, head_mask=None, packing: "Packing | None" = None):
        """``x`` is ``(B, L, E)``, or ``(N, E)`` real tokens only when ``packing`` is given."""
        padded = x if packing is None else packing.unpack(x)                  # (B, L, E)
        a, weights = self.attn(padded, key_padding_mask=key_padding_mask, causal=causal, head_mask=head_mask)
        a = a if packing is None else packing.pack(a)                          # like x
        x = self.ln_attn(x + F.dropout(a, self.dropout, self.training))
        h = self.ffn_out(self.act(self.ffn_in(x)))
        x = self.ln_ffn(x + F.dropout(h, self.dropout, self.training))
        return x, weights


class Packing:
    """Where the real tokens of a padded ``(B, L)`` batch sit, to run token-wise layers on them alone.

    Padding costs every linear layer as much as a real token does; the feed-forward, two thirds
    of a block's work, then runs on ``N`` real tokens instead of ``B * L``.
    """

    def __init__(self, attention_mask: torch.Tensor):
        self.B, self.L = attention_mask.shape
        self.index = attention_mask.reshape(-1).nonzero().squeeze(1)           # (N,)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.B * self.L, -1).index_select(0, self.index)      # (N, E)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(self.B * self.L, x.shape[-1])
        return out.index_copy_(0, self.index, x).view(self.B, self.L, -1)      # (B, L, E)


@dataclass(frozen=True)
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, L, E)
    attentions: tuple                # per layer (B, H, L, L)


class BertEncoder(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, *, causal: bool = False,
                head_mask: torch.Tensor | None = None) -> EncoderOutput:
        """Encode a batch.

        Args:
            input_ids: ``(B, L)`` token ids.
            attention_mask: ``(B, L)``, 1 for real tokens, 0 for padding (transformers' convention).
            token_type_ids: ``(B, L)`` segment ids, zeros when None.
            causal: masked self-attention, no token sees a later one.
            head_mask: ``(layers, heads)``, 1 keeps a head, 0 switches it off.

        Returns:
            the last hidden state ``(B, L, E)`` and per layer the weights ``(B, H, L, L)``.
            Padded positions carry no meaning: their hidden state is zero and their query rows
            are not those of a model run without packing.
        """
        x = self.embeddings(input_ids, token_type_ids)                          # (B, L, E)
        padding = packing = None
        if attention_mask is not None and not bool(attention_mask.all()):
            padding = attention_mask == 0
            packing = Packing(attention_mask)
            x = packing.pack(x)                                                # (N, E)
        attentions = []
        for i, block in enumerate(self.layers):
            x, weights = block(x, padding, causal, None if head_mask is None else head_mask[i], packing)
            attentions.append(weights)
        x = x if packing is None else packing.unpack(x)
        return EncoderOutput(x, tuple(attentions))

    @classmethod
    def untrained(cls, config: EncoderConfig, seed: int = 0) -> "BertEncoder":
        """Randomly initialised the way BERT initialises before training, reproducibly for ``seed``."""
        gen = torch.Generator().manual_seed(seed)
        model = cls(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                owner = model.get_submodule(name.rsplit(".", 1)[0])
                if isinstance(owner, nn.LayerNorm):
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, config.initializer_range, generator=gen)
            model.embeddings.word_embeddings.weight[config.pad_token_id].zero_()
        return model.eval()

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str | torch.device = "cpu") -> "BertEncoder":
        """Load a transformers BERT checkpoint (``config.json`` and ``model.safetensors``)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = Path(folder)
        try:
            config = EncoderConfig.from_dict(json.loads((folder / "config.json").read_text()))
        except (OSError, ValueError, TypeError) as err:
            if isinstance(err, HeadLensError):
                raise
            raise HeadLensError(f"The model's config.json in {folder} could not be read: {err}") from err
        try:
            hf = load_file(str(folder / "model.safetensors"), device=str(device))
        except (OSError, SafetensorError) as err:
            raise HeadLensError(f"The weights in {folder / 'model.safetensors'} could not be read: {err}") from err
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict(state_dict_from_bert(hf, config.num_hidden_layers), assign=True)
        return model.eval()


_LAYER_RENAMES = {
    "attention.output.dense": "attn.out_proj",
    "attention.output.LayerNorm": "ln_attn",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "ln_ffn",
}


def state_dict_from_bert(hf: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Rename a transformers BERT state dict to ours; q, k, v are concatenated into one projection."""
    hf = {_normalise_key(k): v for k, v in hf.items()}
    ours: dict[str, torch.Tensor] = {}
    missing: list[str] = []

    def take(name: str) -> torch.Tensor | None:
        if name not in hf:
            missing.append(name)
        return hf.get(name)

    for part in ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight",
                 "LayerNorm.weight", "LayerNorm.bias"):
        ours[f"embeddings.{part}"] = take(f"embeddings.{part}")
    for i in range(n_layers):
        src, dst = f"encoder.layer.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            qkv = [take(f"{src}attention.self.{p}.{kind}") for p in ("query", "key", "value")]
            if all(t is not None for t in qkv):
                ours[f"{dst}attn.in_proj_{kind}"] = torch.cat(qkv)
            for old, new in _LAYER_RENAMES.items():
                ours[f"{dst}{new}.{kind}"] = take(f"{src}{old}.{kind}")
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise HeadLensError(f"These are not BERT encoder weights: missing {shown}.")
    return ours


def _normalise_key(key: str) -> str:
    key = re.sub(r"^(bert|model)\.", "", key)
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
