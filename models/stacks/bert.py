"""The BERT-family encoder built on our MultiHeadAttention: BERT here, RoBERTa and DistilBERT as declarations on it
(``encoders.py``).

Embeddings (word + position + token type, LayerNorm), then post-LayerNorm blocks:
``x = LN(x + Attn(x)); x = LN(x + FFN(x))`` with a GELU feed-forward. Loads a transformers
BERT checkpoint (safetensors) and reproduces ``transformers.BertModel`` number for number. A family differs in
where its positions start (RoBERTa's after the padding index), whether it has token types (DistilBERT has none),
its config.json's names and its weights'.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HeadLensError
from ..mha import MultiHeadAttention
from ..run import BY_HEAD, Given
from .base import Packing, Stack, StackConfig, TransformersSizes, initialised
from .blocks import NO_EDITS
from .norms import ACTIVATIONS
from .paths import FrozenNorms, PostNorms
from .weights import Weights, separate_qkv



@dataclass(frozen=True)
class EncoderConfig(TransformersSizes, StackConfig):
    """A transformers BERT ``config.json``'s sizes, with the pruned heads where transformers 4 kept them."""

    model_type = "bert"
    title: ClassVar[str] = "BERT encoders"   # what the engine says it implements when a config is another's
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
    masked_lm: bool = False                   # its files hold the masked-LM head (a ``...ForMaskedLM``)
    source: str = ""                          # the config.json a family read its sizes from, written back

    @property
    def position_offset(self) -> int:
        """The row of the position table the first token reads (RoBERTa's: after the padding index)."""
        return 0

    @classmethod
    def checked(cls, d: dict) -> dict:
        """``d`` once the checks every encoder family shares have passed: its own model_type, absolute positions, an
        activation the engine has (``hidden_act``, DistilBERT's ``activation``)."""
        model_type = d.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise HeadLensError(
                f"The from-scratch engine implements {cls.title}; this model is '{model_type}'. "
                "Choose the transformers engine for it.")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise HeadLensError("The from-scratch engine supports absolute position embeddings only; "
                                "choose the transformers engine for this model.")
        act = d.get("hidden_act", d.get("activation", "gelu"))
        if act not in ACTIVATIONS:
            raise HeadLensError(f"The from-scratch engine has no activation '{act}'.")
        return d

    @staticmethod
    def masked(d: dict) -> bool:
        """Whether a config.json names a model with its masked-LM head (``BertForMaskedLM``, ``...ForPreTraining``)."""
        return bool(d.get("masked_lm")) or any("MaskedLM" in a or a.endswith("ForPreTraining")
                                               for a in d.get("architectures") or ())

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderConfig":
        """From a transformers ``config.json`` of a BERT model; unknown keys are ignored."""
        return cls.from_fields({**cls.checked(d), "masked_lm": cls.masked(d)})


class Embeddings(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        if c.type_vocab_size:
            self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = c.hidden_dropout_prob
        self.offset = c.position_offset

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        L = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.position_embeddings.weight[self.offset:self.offset + L]  # (B, L, E)
        types = getattr(self, "token_type_embeddings", None)  # a family without token types has none (DistilBERT)
        if types is not None:
            x = x + (types.weight[0] if token_type_ids is None else types(token_type_ids))
        return F.dropout(self.LayerNorm(x), self.dropout, self.training)


class MaskedLMHead(nn.Module):
    """The masked-LM head: a dense layer, the activation and a LayerNorm, then the word embeddings (tied) and a
    bias per token: ``logits = LN(act(dense(h))) @ W_emb^T + bias``."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))
        self.act = ACTIVATIONS[c.hidden_act]

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(h)))


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


    attention_norm = None  # the attention reads the stream as it is: the norm comes after it

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention reads of the block's input ``x``: ``x`` itself (the norm comes after)."""
        return x

    def attention_scale(self, a: torch.Tensor) -> None:
        """None: the attention's output is written into the stream as it is; the norm after it passes every write
        (``BertEncoder.frozen_norms``)."""
        return None

    def attend(self, x: torch.Tensor, *, packing: Packing | None = None, edits=NO_EDITS, weights_into=None, **options):
        """The attention of the block's input ``x``, as ``forward`` runs it: its output ``(B, L, E)`` (padded) and its
        weights or None; ``options``: ``MultiHeadAttention.forward``'s."""
        padded = x if packing is None else packing.unpack(x)                  # (B, L, E)
        if (edit := edits.get("attn_in")) is not None:
            padded = edit(padded)
        return self.attn(padded, average_attn_weights=False, hook_z=edits.get("z"), hook_pattern=edits.get("pattern"),
                         into=weights_into, **options)

    def attention_alone(self, x: torch.Tensor, **options) -> torch.Tensor | None:
        """The weights of the block's attention on its input ``x``, the block run no further."""
        return self.attend(x, **options)[1]

    def forward(self, x, *, key_padding_mask=None, packing: Packing | None = None, causal: bool = False,
                need_weights: bool = True, head_mask=None, head_fill=None, weights_into=None, edits=NO_EDITS):
        """``x`` is ``(B, L, E)``, or ``(N, E)`` real tokens only when ``packing`` is given; ``edits``: this layer's
        (``models.run``), by point."""
        if any(point in edits for point in BY_HEAD):
            if packing is not None or key_padding_mask is not None:
                raise HeadLensError("An encoder's attention runs head by head on prompts without padding only.")
            return self.by_head(x, edits), None
        a, weights = self.attend(x, packing=packing, edits=edits, key_padding_mask=key_padding_mask, causal=causal,
                                 head_mask=head_mask, head_fill=head_fill, need_weights=need_weights,
                                 weights_into=weights_into)
        a = a if packing is None else packing.pack(a)                          # like x
        x = self.ln_attn(x + F.dropout(a, self.dropout, self.training))
        return self.ffn_part(x, edits), weights

    def ffn_part(self, x: torch.Tensor, edits) -> torch.Tensor:
        """The block from its attention's norm's output ``x`` on: the feed-forward reading it (``mlp_in``, which
        may hand a ``Given`` write instead), its write (``mlp_out``) and the norm after the sum."""
        read = x if (edit := edits.get("mlp_in")) is None else edit(x)
        h = read.writes if isinstance(read, Given) else self.ffn_out(self.act(self.ffn_in(read)))
        h = h if (edit := edits.get("mlp_out")) is None else edit(h)
        return self.ln_ffn(x + F.dropout(h, self.dropout, self.training))

    def by_head(self, x: torch.Tensor, edits) -> torch.Tensor:
        """The block on ``x`` ``(B, n, E)`` with its attention run head by head: each query head and each head's
        keys and values reading its own stream (``qkv_in``, ``(3 H, B, n, E)``, which may hand a ``Given`` of the
        heads' writes instead), each head's write apart (``result``) and the output bias added once, then the norm;
        the feed-forward as ``ffn_part``. What each receiver of a circuit reads (``analysis.circuits``)."""
        attn = self.attn
        H = attn.num_heads
        streams = x.unsqueeze(0).expand(3 * H, *x.shape)
        if (edit := edits.get("qkv_in")) is not None:
            streams = edit(streams)
        if isinstance(streams, Given):
            writes = streams.writes
        else:
            z = attn.by_head(streams[:H], streams[H:2 * H], streams[2 * H:], hook_pattern=edits.get("pattern"),
                             hook_z=edits.get("z"), causal=False)
            writes = attn.head_writes(z)                                       # (H, B, n, E)
        if (edit := edits.get("result")) is not None:
            writes = edit(writes)
        a = writes.sum(0) if H else torch.zeros_like(x)
        if attn.out_proj.bias is not None:
            a = a + attn.out_proj.bias
        return self.ffn_part(self.ln_attn(x + a), edits)


class BertEncoder(Stack):
    """Embeddings and post-LayerNorm blocks, as ``transformers.BertModel`` computes them; a family of encoders
    subclasses it with its config and its ``weights``."""

    config_class = EncoderConfig
    model_types = ("bert",)
    description = "BERT encoders"
    input_names = ("input_ids", "attention_mask", "token_type_ids")
    weights = None  # set below: BERT's file names (in transformers' names, q, k and v apart)

    def __init__(self, config: EncoderConfig):
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(f"hidden_size ({config.hidden_size}) must be a multiple of num_attention_heads "
                             f"({config.num_attention_heads})")
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Block(config, len(kept)) for kept in self.kept)
        if config.masked_lm:
            self.mlm = MaskedLMHead(config)

    @property
    def path(self) -> PostNorms:
        """Each block norms the stream after it writes: a writer's part passes every norm above it."""
        return PostNorms(self)

    @property
    def masked_lm(self) -> bool:
        """Whether it has its masked-LM head: logits at a ``[MASK]`` (``masked_logits``)."""
        return hasattr(self, "mlm")

    @property
    def readouts(self) -> tuple[str, ...]:
        """A masked-LM encoder's prompt with its mask token is read there, any other as a sentence embedding."""
        return (("masked_token",) if self.masked_lm else ()) + super().readouts

    def masked_logits(self, h: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """The masked-LM head's logits of final hidden states ``h`` ``(..., E)``: of every token ``(..., V)``, or of
        ``ids`` ``(..., K)`` alone (each row of ``h`` its own tokens)."""
        if not self.masked_lm:
            raise HeadLensError("This encoder was opened without its masked-LM head: its files hold the base model "
                                "alone. Open a ...ForMaskedLM folder to read logits at a [MASK].")
        t = self.mlm.transform(h)
        emb = self.embeddings.word_embeddings.weight
        if ids is None:
            return t @ emb.T.to(t.dtype) + self.mlm.bias.to(t.dtype)
        ids = ids.to(emb.device)
        return torch.einsum("...e,...ke->...k", t, emb[ids].to(t.dtype)) + self.mlm.bias[ids].to(t.dtype)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.embeddings(input_ids, token_type_ids)                      # (B, L, E)

    @torch.no_grad()
    def frozen_norms(self, resid: list[torch.Tensor], z: list[torch.Tensor]) -> FrozenNorms:
        """The run's LayerNorms with their scales frozen at its values (``FrozenNorms``), from its trace: ``resid[l]``
        ``(..., n, E)`` entering layer ``l`` and ``z[l]`` ``(..., kept, n, Dh)`` its heads' outputs."""
        entering, written, mlp = [], [], []
        for layer, block in enumerate(self.layers):
            x = resid[layer]
            a = torch.einsum("...hnd,ehd->...ne", z[layer], block.attn.output_columns())
            bias = block.attn.output_bias
            mid = block.ln_attn(x + (a if bias is None else a + bias))
            mlp.append(block.ffn_out(block.act(block.ffn_in(mid))))
            entering += [x, mid]
            written += [a, mlp[-1]]
        path = self.path.freeze(entering.__getitem__, written.__getitem__)
        return FrozenNorms(path.scales, path.biases, mlp)

    @classmethod
    def untrained(cls, config: EncoderConfig, seed: int = 0) -> "BertEncoder":
        """Randomly initialised the way BERT initialises before training, reproducibly for ``seed``."""
        model = initialised(cls(config), config.initializer_range, seed)
        with torch.no_grad():
            model.embeddings.word_embeddings.weight[config.pad_token_id].zero_()
        return model.eval()


def encoder_weights(layer: str, renames: dict[str, str], qkv: tuple[str, str], what: str, prefix: str,
                    mlm: tuple[str, str, str]) -> Weights:
    """An encoder family's file names: ``layer`` a layer's start (``{i}`` its number), ``renames`` our block's
    modules -> theirs within it, ``qkv`` (a template with ``{p}``, the names of q, k and v joined by commas);
    ``prefix`` the model's name some files put first (``bert.``), and TensorFlow's ``gamma`` and ``beta`` read
    as ``weight`` and ``bias``; ``mlm`` the masked-LM head's dense layer, norm and bias."""
    template, parts = qkv
    table = (("embeddings.", "embeddings."),) + tuple((f"layers.{{i}}.{ours}.", f"{layer}{theirs}.")
                                                      for ours, theirs in renames.items()) + \
        tuple(zip(("mlm.dense.", "mlm.norm.", "mlm.bias"), mlm))

    def normalise(key: str) -> str:
        key = re.sub(rf"^({prefix}|model)\.", "", key)
        return re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))

    return Weights(table, tuple(separate_qkv(layer + template, kind, tuple(parts.split(",")))
                                for kind in ("weight", "bias")), what=what, normalise=normalise)


# a BERT layer's names in its files (RoBERTa's too): its start, our modules -> theirs, q, k and v
BERT_LAYER = ("encoder.layer.{i}.", {"attn.out_proj": "attention.output.dense", "ln_attn": "attention.output.LayerNorm",
                                     "ffn_in": "intermediate.dense", "ffn_out": "output.dense",
                                     "ln_ffn": "output.LayerNorm"}, ("attention.self.{p}", "query,key,value"))
BertEncoder.weights = encoder_weights(*BERT_LAYER, "BERT encoder weights", "bert",
                                     ("cls.predictions.transform.dense.", "cls.predictions.transform.LayerNorm.",
                                      "cls.predictions.bias"))
