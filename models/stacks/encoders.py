"""RoBERTa and DistilBERT as declarations on the BERT encoder (``bert.BertEncoder``): the same post-LayerNorm
blocks; RoBERTa's positions start after its padding index and its files prefix ``roberta.``; DistilBERT has no token
types, its own config.json names (``dim``, ``n_layers``, ...) and its own weight names."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from .bert import BERT_LAYER, BertEncoder, EncoderConfig, encoder_weights


@dataclass(frozen=True)
class RobertaConfig(EncoderConfig):
    """A transformers RoBERTa ``config.json``: BERT's names, one token type, positions after the padding index."""

    model_type: ClassVar[str] = "roberta"
    title: ClassVar[str] = "RoBERTa encoders"
    vocab_size: int = 50265
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1

    @property
    def position_offset(self) -> int:
        return self.pad_token_id + 1

    @classmethod
    def from_dict(cls, d: dict) -> "RobertaConfig":
        return cls.from_fields({**cls.checked(d), "source": json.dumps(d), "masked_lm": cls.masked(d)})


class Roberta(BertEncoder):
    config_class = RobertaConfig
    model_types = ("roberta",)
    description = "RoBERTa encoders"
    weights = encoder_weights(*BERT_LAYER, "RoBERTa encoder weights", "roberta",
                              ("lm_head.dense.", "lm_head.layer_norm.", "lm_head.bias"))


@dataclass(frozen=True)
class DistilBertConfig(EncoderConfig):
    """A transformers DistilBERT ``config.json``, its ``dim``, ``n_layers``, ``n_heads``, ``hidden_dim`` read into
    BERT's names; no token types."""

    model_type: ClassVar[str] = "distilbert"
    title: ClassVar[str] = "DistilBERT encoders"
    type_vocab_size: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> "DistilBertConfig":
        cls.checked(d)
        return cls.from_fields({
            "vocab_size": d.get("vocab_size", 30522), "hidden_size": d.get("dim", 768),
            "num_hidden_layers": d.get("n_layers", 6), "num_attention_heads": d.get("n_heads", 12),
            "intermediate_size": d.get("hidden_dim", 3072), "max_position_embeddings": d.get("max_position_embeddings", 512),
            "hidden_act": d.get("activation", "gelu"), "hidden_dropout_prob": d.get("dropout", 0.1),
            "attention_probs_dropout_prob": d.get("attention_dropout", 0.1), "pad_token_id": d.get("pad_token_id", 0),
            "initializer_range": d.get("initializer_range", 0.02), "pruned_heads": d.get("pruned_heads"),
            "masked_lm": cls.masked(d), "source": json.dumps(d)})


class DistilBert(BertEncoder):
    config_class = DistilBertConfig
    model_types = ("distilbert",)
    description = "DistilBERT encoders"
    input_names = ("input_ids", "attention_mask")
    weights = encoder_weights(
        "transformer.layer.{i}.", {"attn.out_proj": "attention.out_lin", "ln_attn": "sa_layer_norm",
                                   "ffn_in": "ffn.lin1", "ffn_out": "ffn.lin2", "ln_ffn": "output_layer_norm"},
        ("attention.{p}", "q_lin,k_lin,v_lin"), "DistilBERT encoder weights", "distilbert",
        ("vocab_transform.", "vocab_layer_norm.", "vocab_projector.bias"))
