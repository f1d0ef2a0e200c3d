"""What the from-scratch engine runs: a stack of blocks on our MultiHeadAttention.

``BertEncoder`` and ``Decoder`` subclass ``Stack``, and so does any architecture added later. The base holds what
they share: the config and the heads each layer still has, the loop over the blocks, the forward pass, pruning,
and reading and writing safetensors. A subclass gives its modules and a few small pieces:

- ``config_class``, a frozen dataclass with ``pruned_heads``, ``from_dict``, ``to_dict`` and the sizes
  ``n_layers``, ``n_heads`` and ``max_positions`` (properties where its own names differ);
- ``embed(input_ids, token_type_ids)``: the input of the first block, ``(B, L, E)``;
- ``finish(x)``: the last hidden state from the last block's output; ``logits(h)`` for a language model;
- ``weights``, a ``weights.Weights`` table, when its file names differ from its own;
- blocks called as ``block(x, key_padding_mask=, packing=, causal=, need_weights=, weights_into=, edits=)``
  (``edits``: the layer's, by point, ``models.run``), returning ``(x, weights or None)``, each with an ``attn``
  (``MultiHeadAttention``), ``attention_input(x)`` (what that attention reads of the block's input) and
  ``attention_alone(x, ...)`` (its weights, the block run no further).
"""
from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, fields, replace
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from ..capabilities import offered
from ..errors import HeadLensError
from ..run import Edits, switched_off
from .blocks import NO_EDITS
from .paths import SUM
from .saved import Saved
from .heads import (kept_heads, place_heads, pruned_attention, pruned_heads_json, read_pruned_heads, select_heads,
                    with_pruned)


@dataclass(frozen=True)
class StackOutput:
    last_hidden_state: torch.Tensor          # (B, L, E)
    attentions: tuple | None                 # per layer (B, heads, L, L), pruned heads all zero; None unless asked
    logits: torch.Tensor | None = None       # (B, L, vocab), for a language model


class StackConfig:
    """What a stack's config (a frozen dataclass with ``pruned_heads``, and a ``source`` where a family read it from
    another config.json than its own fields) shares: its config.json."""

    model_type: ClassVar[str]
    header: ClassVar[dict] = {}                                     # written after model_type, before the fields

    def to_dict(self) -> dict:
        """Its fields under their names, or the config.json it was read from (``source``), with the heads pruned
        since."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        d["pruned_heads"] = pruned_heads_json(self.pruned_heads)
        if getattr(self, "source", ""):
            return {**json.loads(self.source), "pruned_heads": d["pruned_heads"]}
        return {"model_type": self.model_type, **self.header, **d}

    @classmethod
    def from_fields(cls, d: dict):
        """The config from a config.json's keys that name its fields (others are ignored), pruned heads checked."""
        names = {f.name for f in fields(cls)} - {"pruned_heads"}
        try:
            config = cls(**{k: v for k, v in d.items() if k in names and v is not None})
        except TypeError as err:
            raise HeadLensError(f"The model's config.json could not be read: {err}") from err
        return replace(config, pruned_heads=read_pruned_heads(d.get("pruned_heads") or {}, config.n_layers,
                                                              config.n_heads))


class TransformersSizes:
    """The sizes ``Stack`` reads, for a config that keeps transformers' names for them."""

    @property
    def n_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def n_heads(self) -> int:
        return self.num_attention_heads

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings


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


class Stack(Saved, nn.Module):
    """Embeddings, blocks and a finish; a block whose heads were pruned (``config.pruned_heads``) holds fewer."""

    config_class: ClassVar[type]
    model_types: ClassVar[tuple[str, ...]] = ()                    # the config.json model_types it opens
    description: ClassVar[str] = ""                                # what it runs, for a sentence: "BERT encoders"
    language_model: ClassVar[bool] = False                         # gives logits, so a next-token loss
    causal: ClassVar[bool] = False                                  # a decoder masks later keys whatever it is asked
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")
    weights: ClassVar = None  # its files' names (``weights.Weights``); None: the stack's own names
    layers: nn.ModuleList

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.kept = [kept_heads(config.pruned_heads, i, self.n_heads) for i in range(self.n_layers)]

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    @property
    def n_heads(self) -> int:
        return self.config.n_heads

    @property
    def max_positions(self) -> int:
        return self.config.max_positions

    @property
    def head_dim(self) -> int:
        return self.layers[0].attn.head_dim

    @property
    def hidden_size(self) -> int:
        return self.layers[0].attn.embed_dim

    @property
    def path(self):
        """How what each part writes reaches what each later part reads (``paths``): here the stream is the plain
        sum of the writes."""
        return SUM

    @property
    def prediction_head(self):
        """A head on the final hidden states read from the stack's files beside it, which names the readouts it
        offers in place of the stack's own (a sequence classifier's: ``classify``); None for most models."""
        return self._modules.get("prediction_head")

    @property
    def readouts(self) -> tuple[str, ...]:
        """The kinds of prediction a run of it is read as, in the order a pair tries them
        (``analysis.effects.readouts``): its prediction head's; a language model's next token; an encoder's sentence
        embedding."""
        if self.prediction_head is not None:
            return self.prediction_head.readouts
        return ("next_token",) if self.language_model else ("embedding",)

    @property
    def offers(self) -> frozenset[str]:
        """What its runs can be read for beyond attention (``models.capabilities``): its mask's and readouts'."""
        return offered(self.causal, self.readouts)

    @property
    def pruned(self) -> bool:
        return bool(self.config.pruned_heads)

    def pruned_mask(self):
        """bool ``(layers, heads)`` (NumPy): True for a head pruned away."""
        out = np.zeros((self.n_layers, self.n_heads), dtype=bool)
        for layer, heads in self.config.pruned_heads:
            out[layer, list(heads)] = True
        return out

    @property
    def windows(self) -> tuple[int | None, ...] | None:
        """Per layer, how many keys a query sees (None: every earlier one); None when no layer has a window."""
        windows = tuple(block.attn.window for block in self.layers)
        return windows if any(w is not None for w in windows) else None

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def logits(self, h: torch.Tensor, tokens: slice = slice(None)) -> torch.Tensor | None:
        """A language model's logits of ``h``, of the vocabulary's ``tokens`` (all of them by default); None for
        a model that has none."""
        return None

    @property
    def logit_cap(self) -> float | None:
        """The soft cap ``logits`` squashes the logits with, ``cap * tanh(logits / cap)`` (Gemma 2's), or None."""
        return None

    def unembedding(self) -> torch.Tensor:
        """``(vocab, E)``: the unembedding, so that ``h @ unembedding().T`` is the logits (a language model's)."""
        raise NotImplementedError

    def unembedding_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """``(k, E)``: the unembedding's rows of the token ``ids``, so that ``h @ rows.T`` is their logits."""
        weight = self.unembedding()
        return weight.index_select(0, ids.to(weight.device))

    def token_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        """``(k, E)``: each token's embedding alone, without a position (a language model's)."""
        raise NotImplementedError

    def norm_alone(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., E)``: the final norm of each vector ``x`` on its own, without the norm's bias: what a part of
        the residual stream would write into the logits were it the whole stream (its direction, up to scale)."""
        raise NotImplementedError

    def norm_linear(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., E)``: the linear part of the final norm (its scale, and its centring for a LayerNorm), so that
        ``norm_alone(x)`` is ``norm_linear(x)`` times a positive number per vector."""
        raise NotImplementedError

    def frozen_finish(self, x: torch.Tensor):
        """The final norm with its scale frozen at its value for the residual ``x`` ``(E,)``: ``(f, c)``, a
        linear map ``f`` of a part of ``x`` and the constant ``c`` ``(E,)`` the norm adds, so that
        ``finish(x) == f(x) + c`` and ``f`` of a sum is the sum of ``f``'s."""
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, *, causal: bool = False, need_weights: bool = True,
                need_logits: bool = True, head_mask: torch.Tensor | None = None,
                head_fill: torch.Tensor | None = None, edits=None) -> StackOutput:
        """Run a batch.

        Args:
            input_ids: ``(B, L)`` token ids.
            attention_mask: ``(B, L)``, 1 for real tokens, 0 for padding (transformers' convention).
            token_type_ids: ``(B, L)`` segment ids, for a stack that reads them (``input_names``).
            causal: no token sees a later one (a decoder never does, whatever this says).
            need_weights: return every layer's weights; without them attention takes PyTorch's fused path.
            need_logits: a language model's logits (the unembedding is the largest product at 49,152 tokens).
            head_mask: ``(layers, heads)``, 1 keeps a head, 0 switches it off (its weights are returned as zero).
            head_fill: ``(layers, heads, Dh)``: the output of a head switched off, instead of zero.
            edits: ``models.run.Edits``, read or replace what flows at named points of each layer.

        Both name every head of the unpruned model; a pruned head's entries are not read. A head mask is edits too
        (``switched_off``), before ``edits``.
        Padded positions carry no meaning: their hidden state is zero and their query rows are
        not those of a model run without padding.
        """
        x, padding, packing = self.embed_tokens(input_ids, attention_mask, token_type_ids)
        x, attentions = self.run_layers(x, padding, packing, causal=causal, need_weights=need_weights,
                                        edits=self.switched_off(head_mask, head_fill).then(edits))
        if need_weights and head_mask is not None:
            attentions = tuple(w * head_mask[i].to(w.dtype).view(1, -1, 1, 1) for i, w in enumerate(attentions))
        h = self.finish(x if packing is None else packing.unpack(x))
        return StackOutput(h, attentions if need_weights else None,
                           self.logits(h) if need_logits and self.language_model else None)

    def embed_tokens(self, input_ids, attention_mask=None, token_type_ids=None):
        """The input to the first block: ``(x, padding, packing)``, ``x`` packed to real tokens when there is padding."""
        x = self.embed(input_ids, token_type_ids)                              # (B, L, E)
        if attention_mask is None or bool(attention_mask.all()):
            return x, None, None
        packing = Packing(attention_mask)
        return packing.pack(x), attention_mask == 0, packing                   # (N, E)

    def switched_off(self, head_mask=None, head_fill=None) -> Edits:
        """The edits switching heads off: ``head_mask`` ``(layers, heads)`` (0: off) and ``head_fill`` ``(layers,
        heads, Dh)`` (what a head switched off outputs instead of zero), each None or naming every head of the
        unpruned model; a layer whose kept heads are all on takes no edit (unless the mask takes a gradient: gradient
        importance)."""
        if head_mask is None:
            return Edits()
        layers = []
        for i in range(self.n_layers):
            mask, fill = (None if per_head is None else select_heads(per_head[i], self.kept[i], self.n_heads)
                          for per_head in (head_mask, head_fill))
            if len(self.kept[i]) and (mask.requires_grad or bool((mask != 1).any())):
                layers.append((i, mask, fill))
        return switched_off(layers)

    def run_layers(self, x, padding=None, packing=None, *, start: int = 0, stop: int | None = None,
                   causal: bool = False, need_weights: bool | Collection[int] = True, into=None,
                   last: str = "block", edits=None):
        """Blocks ``start`` to ``stop`` (exclusive) on ``x`` as ``embed_tokens`` gives it, or as an earlier call left
        it; ``edits`` (``models.run.Edits``) read or replace what flows at named points of each layer: the one way
        to run a stack.

        ``need_weights``: every layer's weights, or those of the layers named; ``into(layer)``: zeros the weights of
        that layer are written into (``(B, H, L, L)``, a slice of a larger buffer), or None; ``last``: "block", or
        "attention" to run the last layer only as far as its attention (what its weights need). Returns ``x``
        (the last layer's input when ``last`` is "attention") and the weights formed, a tuple in layer order,
        pruned heads placed among zeros."""
        H, attentions = self.n_heads, []
        stop = self.n_layers if stop is None else stop
        for i in range(start, stop):
            wanted = need_weights if isinstance(need_weights, bool) else i in need_weights
            if edits and (pre := edits.get(("resid_pre", i))) is not None:
                x = pre(x)
            mine = edits.at(i) if edits else NO_EDITS  # read after resid_pre, whose edit may add this layer's others
            block = self.layers[i]
            options = dict(key_padding_mask=padding, causal=causal or self.causal, need_weights=wanted,
                           weights_into=None if into is None or not wanted else into(i))
            if last == "attention" and i == stop - 1:
                weights = block.attention_alone(x, packing=packing, edits=mine, **options)
            else:
                x, weights = block(x, packing=packing, edits=mine, **options)
                if (post := mine.get("resid_post")) is not None:
                    x = post(x)
            if wanted:
                attentions.append(place_heads(weights, self.kept[i], H))
        return x, tuple(attentions)

    def attention_weights(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                          token_type_ids: torch.Tensor | None = None, *, layers=None, causal: bool = False,
                          head_mask=None, head_fill=None, edits=None) -> torch.Tensor:
        """``(B, len(layers), H, L, L)``: the weights of ``layers`` (every layer by default), in that order, written
        into one buffer as each layer forms them. The run goes no higher than the highest of them, and that one
        only as far as its attention: what comes after it changes no weight. Arguments as ``forward``'s (edits after the
        highest layer's attention are not reached)."""
        x, padding, packing = self.embed_tokens(input_ids, attention_mask, token_type_ids)
        order = list(range(self.n_layers)) if layers is None else list(layers)
        (B, L), H = input_ids.shape, self.n_heads
        out = x.new_zeros(B, len(order), H, L, L)
        first = {}  # each layer's first slot in the buffer
        for j, layer in enumerate(order):
            first.setdefault(layer, j)

        def into(i: int):  # no head pruned: the weights go straight into the buffer
            return out[:, first[i]] if len(self.kept[i]) == H else None

        _, formed = self.run_layers(x, padding, packing, stop=max(order) + 1, causal=causal, need_weights=set(order),
                                    into=into, last="attention",
                                    edits=self.switched_off(head_mask, head_fill).then(edits))
        for layer, weights in zip(sorted(first), formed):
            for j in (j for j, at in enumerate(order) if at == layer):
                if j != first[layer] or into(layer) is None:
                    out[:, j] = weights
            if head_mask is not None:
                out[:, [j for j, at in enumerate(order) if at == layer]] *= \
                    head_mask[layer].to(out.dtype).view(1, 1, H, 1, 1)
        return out

    def pruned_copy(self, heads, head_fill: torch.Tensor | None = None) -> "Stack":
        """A new stack without ``heads`` (``(layer, head)`` pairs of the unpruned numbering), this one untouched.

        Each removed head takes its rows of the q, k and v projections and its columns of the output projection
        with it, as transformers 4's ``prune_heads`` did. With ``head_fill`` (``(layers, heads, Dh)``), a removed
        head's constant output is folded into the output projection's bias: the copy equals this stack with those
        heads mean-ablated. The copy shares every tensor pruning leaves as it was (embeddings, feed-forwards,
        layers that lose no head; neither is changed in place) and takes gradients where this stack does.
        """
        config = replace(self.config, pruned_heads=with_pruned(self.config.pruned_heads, heads))
        with torch.device("meta"):  # built empty and given the weights below: initialising SmolLM2 took a second
            copy = type(self)(config)
            for name in set(copy._modules) - set(self._modules):  # a part its files did not hold (a classifier's
                delattr(copy, name)                                 # decoder has no language-model head)
        copy.language_model = self.language_model
        for name in set(self._modules) - set(copy._modules):  # a part read beside the stack (its prediction head),
            setattr(copy, name, self._modules[name])            # shared as the embeddings are
        state = self.state_dict()  # detached views of these weights, not copies
        for i, block in enumerate(self.layers):
            old, new = self.kept[i], copy.kept[i]
            if old != new:
                fill = None if head_fill is None else head_fill[i, old]
                smaller = pruned_attention(block.attn, [old.index(h) for h in new], fill)
                state.update({f"layers.{i}.attn.{k}": v for k, v in smaller.state_dict().items()})
        copy.load_state_dict(state, assign=True)
        for name, weight in copy.named_parameters():  # assigned weights would take the new module's wish for
            weight.requires_grad_(self.get_parameter(name).requires_grad)  # gradients: an opened model's takes none
        return copy.train(self.training)

    @classmethod
    def untrained(cls, config, seed: int = 0) -> "Stack":
        """Randomly initialised, reproducibly for ``seed``."""
        raise NotImplementedError


def initialised(model: nn.Module, std: float, seed: int) -> nn.Module:
    """``model`` with LayerNorms at 1 and 0, biases at 0 and every other weight drawn from normal(0, ``std``),
    reproducibly for ``seed``: how BERT and GPT-2 start before training."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            owner = model.get_submodule(name.rsplit(".", 1)[0])
            if isinstance(owner, nn.LayerNorm):
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)
    return model
