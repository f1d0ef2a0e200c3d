"""A small decoder-only transformer built on our MultiHeadAttention, to train and watch heads form.

Pre-LayerNorm blocks, as the seeds describe: layer normalisation is applied to the input of the
multi-head self-attention, and a skip connection adds its output back; an optional feed-forward
block does the same (``attention_only`` leaves it out). Causal: token i sees tokens 0..i. One
block equals ``torch.nn.TransformerEncoderLayer(norm_first=True, batch_first=True)`` run with a
causal mask, weights copied by ``DecoderBlock.from_torch``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .encoder import initialised
from .errors import HeadLensError
from .mha import (MultiHeadAttention, kept_heads, place_heads, pruned_heads_json, read_pruned_heads, select_heads,
                  with_pruned)

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 64
    n_layers: int = 2
    n_heads: int = 2
    d_model: int = 64
    max_len: int = 64
    attention_only: bool = True
    d_mlp: int = 256
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    dropout: float = 0.0
    # heads removed by pruning, as ((layer, (head, ...)), ...)
    pruned_heads: tuple = ()

    def kept_heads(self, layer: int) -> list[int]:
        return kept_heads(self.pruned_heads, layer, self.n_heads)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["pruned_heads"] = pruned_heads_json(self.pruned_heads)
        return {"model_type": "headlens_decoder", **d}

    @classmethod
    def from_dict(cls, d: dict) -> "DecoderConfig":
        names = {f.name for f in fields(cls)} - {"pruned_heads"}
        try:
            config = cls(**{k: v for k, v in d.items() if k in names})
        except TypeError as err:
            raise HeadLensError(f"The decoder's config.json could not be read: {err}") from err
        if config.d_model % config.n_heads or config.activation not in ACTIVATIONS:
            raise HeadLensError("The decoder's config.json has a width that its heads do not divide, "
                                "or an activation HeadLens does not have.")
        return replace(config, pruned_heads=read_pruned_heads(d.get("pruned_heads") or {}, config.n_layers,
                                                              config.n_heads))


class DecoderBlock(nn.Module):
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

    def forward(self, x: torch.Tensor, *, key_padding_mask=None, need_weights: bool = False, head_mask=None,
                head_fill=None):
        """``x`` ``(B, L, d)`` -> ``(B, L, d)`` and the weights ``(B, H, L, L)`` (None unless asked for)."""
        a, weights = self.attn(self.ln_attn(x), key_padding_mask=key_padding_mask, need_weights=need_weights,
                               average_attn_weights=False, causal=True, head_mask=head_mask, head_fill=head_fill)
        x = x + F.dropout(a, self.dropout, self.training)
        if not self.attention_only:
            h = self.mlp_out(F.dropout(self.act(self.mlp_in(self.ln_mlp(x))), self.dropout, self.training))
            x = x + F.dropout(h, self.dropout, self.training)
        return x, weights

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "DecoderBlock":
        """Our block with the weights of a ``norm_first`` PyTorch layer (run it with a causal mask to compare)."""
        if not layer.norm_first or not layer.self_attn.batch_first:
            raise ValueError("Only a norm_first, batch_first TransformerEncoderLayer is a pre-LayerNorm block like ours")
        act = layer.activation
        name = "gelu" if act is F.gelu or isinstance(act, nn.GELU) else "relu"
        c = DecoderConfig(n_heads=layer.self_attn.num_heads, d_model=layer.self_attn.embed_dim,
                          attention_only=False, d_mlp=layer.linear1.out_features, activation=name,
                          layer_norm_eps=layer.norm1.eps, dropout=layer.dropout.p)
        block = cls(c).to(layer.linear1.weight)
        block.attn = MultiHeadAttention.from_torch(layer.self_attn)
        with torch.no_grad():
            for ours, theirs in ((block.ln_attn, layer.norm1), (block.ln_mlp, layer.norm2),
                                 (block.mlp_in, layer.linear1), (block.mlp_out, layer.linear2)):
                ours.load_state_dict(theirs.state_dict())
        return block


@dataclass(frozen=True)
class DecoderOutput:
    logits: torch.Tensor             # (B, L, vocab)
    last_hidden_state: torch.Tensor  # (B, L, d), after the final LayerNorm
    attentions: tuple | None         # per layer (B, heads, L, L), when asked for


class Decoder(nn.Module):
    """Token and learned position embeddings, causal pre-LN blocks, a final LayerNorm and an unembedding.

    Its methods mirror ``BertEncoder``'s (``embed_tokens``, ``run_layers``, ``finish``), so the
    from-scratch engine attends, embeds, ablates and prunes either.
    """

    def __init__(self, config: DecoderConfig):
        super().__init__()
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model ({config.d_model}) must be a multiple of n_heads ({config.n_heads})")
        self.config = config
        self.kept = [config.kept_heads(i) for i in range(config.n_layers)]
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.layers = nn.ModuleList(DecoderBlock(config, len(kept)) for kept in self.kept)
        self.ln_final = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)

    @property
    def pruned(self) -> bool:
        return bool(self.config.pruned_heads)

    @classmethod
    def untrained(cls, config: DecoderConfig, seed: int = 0) -> "Decoder":
        """Initialised reproducibly for ``seed``: normal(0, 0.02) weights (GPT-2's), zero biases."""
        return initialised(cls(config), 0.02, seed)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, *, causal: bool = True, need_weights: bool = True,
                head_mask=None, head_fill=None) -> DecoderOutput:
        """Logits, the final hidden state and, when asked for, per layer the weights ``(B, heads, L, L)``
        with the pruned heads' weights all zero. Always causal. ``head_mask``/``head_fill`` name every
        head of the unpruned model; ``token_type_ids`` is not used."""
        x, padding, packing = self.embed_tokens(input_ids, attention_mask)
        x, attentions = self.run_layers(x, padding, packing, need_weights=need_weights, head_mask=head_mask,
                                        head_fill=head_fill)
        h = self.finish(x)
        return DecoderOutput(self.unembed(h), h, attentions if need_weights else None)

    def embed_tokens(self, input_ids, attention_mask=None, token_type_ids=None):
        L = input_ids.shape[1]
        if L > self.config.max_len:
            raise HeadLensError(f"This model reads at most {self.config.max_len} tokens; the text has {L}.")
        x = self.tok_emb(input_ids) + self.pos_emb.weight[:L]
        padding = None if attention_mask is None or bool(attention_mask.all()) else attention_mask == 0
        return x, padding, None

    def run_layers(self, x, padding=None, packing=None, *, start: int = 0, stop: int | None = None,
                   causal: bool = True, need_weights: bool = True, head_mask=None, head_fill=None):
        H = self.config.n_heads
        attentions = []
        for i in range(start, len(self.layers) if stop is None else stop):
            mask = None if head_mask is None else select_heads(head_mask[i], self.kept[i], H)
            fill = None if head_fill is None else select_heads(head_fill[i], self.kept[i], H)
            x, w = self.layers[i](x, key_padding_mask=padding, need_weights=need_weights, head_mask=mask,
                                  head_fill=fill)
            if need_weights:
                attentions.append(place_heads(w, self.kept[i], H))
        return x, tuple(attentions)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_final(x)

    def save_pretrained(self, folder) -> None:
        """``config.json`` and ``model.safetensors`` (our names), pruned heads recorded."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n", encoding="utf-8")
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, folder) -> "Decoder":
        folder = Path(folder)
        config = DecoderConfig.from_dict(json.loads((folder / "config.json").read_text(encoding="utf-8")))
        try:
            state = load_file(str(folder / "model.safetensors"))
        except (OSError, SafetensorError) as err:
            raise HeadLensError(f"The weights in {folder / 'model.safetensors'} could not be read: {err}") from err
        with torch.device("meta"):
            model = cls(config)
        try:
            model.load_state_dict(state, assign=True)
        except RuntimeError as err:
            raise HeadLensError(f"The weights in {folder} do not fit its config.json: "
                                f"{str(err).splitlines()[-1].strip()}") from err
        return model.eval()

    def pruned_copy(self, heads, head_fill=None) -> "Decoder":
        """A new decoder without ``heads`` (``(layer, head)`` of the unpruned numbering); this one untouched."""
        config = replace(self.config, pruned_heads=with_pruned(self.config.pruned_heads, heads))
        copy = type(self)(config).to(self.tok_emb.weight.device)
        state = {k: v.detach().clone() for k, v in self.state_dict().items()}
        for i, block in enumerate(self.layers):
            old, new = self.kept[i], copy.kept[i]
            if old != new:
                fill = None if head_fill is None else head_fill[i, old]
                smaller = block.attn.pruned([old.index(h) for h in new], fill)
                state.update({f"layers.{i}.attn.{k}": v for k, v in smaller.state_dict().items()})
        copy.load_state_dict(state)
        return copy.train(self.training)

