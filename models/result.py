"""The result format every view reads: tokens and per-layer, per-head attention weights.

A head is named one way everywhere: ``(layer, head)`` in code, ``layer`` and ``head`` columns in
frames, and ``head_label(layer, head)`` wherever a person reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


Head = tuple[int, int]  # (layer, head), both counted from 0


def head_label(layer: int, head: int) -> str:
    """How a head is written for a person: ``L3 H11``."""
    return f"L{int(layer)} H{int(head)}"


@dataclass(frozen=True, eq=False)
class Attention:
    """Attention of one text, padding removed.

    Attributes:
        tokens: the query tokens, as the tokenizer writes them.
        weights: float32 ``(layers, heads, n_queries, n_keys)``; each row sums to 1
            (0 for a head switched off by a head mask).
        word_ids: for each token the index of the word it belongs to, None for special tokens;
            pieces of one word share an index.
        special: bool ``(n_tokens,)``, True for [CLS], [SEP], <s>, </s> and the like.
        offsets: ``(start, end)`` character span of each token in ``text``; (0, 0) for special tokens.
        text: the text the tokens came from.
        model_name, backend, device: what produced the weights.
        truncated: whether the text was cut to the model's maximum length.
        n_tokens_original: how many tokens the whole text has, special tokens included.
        component: "self" (encoder or decoder-only model), "encoder", "decoder" or "cross".
        causal: whether a query could only see earlier keys.
        keys: for cross-attention, the key side (the encoder's tokens); None when keys are the queries.
        decoder, cross: for encoder-decoder models, the decoder's self-attention and its
            cross-attention to the encoder; this object then holds the encoder's self-attention.
        pruned: bool ``(layers, heads)``, True for a head the model no longer has (its weights
            are all zero); None for a model without pruned heads.
        generated_from: where in ``text`` a generated continuation starts (characters); None for
            a text that is all prompt.
        layers: the model's layers that ``weights`` holds, in its order, when ``attend`` was asked for
            some (``attend(text, layers=[...])``); None when it holds every layer.
        windows: per layer of the model, how many of the last keys a query of a sliding-window layer sees
            (itself included), None for a layer that sees every earlier key; None when no layer slides.
    """

    tokens: list[str]
    weights: np.ndarray
    word_ids: list[int | None]
    special: np.ndarray
    offsets: list[tuple[int, int]]
    text: str
    model_name: str
    backend: str
    device: str
    truncated: bool = False
    n_tokens_original: int = 0
    component: str = "self"
    causal: bool = False
    keys: "Attention | None" = field(default=None, repr=False)
    decoder: "Attention | None" = field(default=None, repr=False)
    cross: "Attention | None" = field(default=None, repr=False)
    pruned: np.ndarray | None = field(default=None, repr=False)
    generated_from: int | None = None
    layers: tuple[int, ...] | None = None
    windows: tuple[int | None, ...] | None = None

    @property
    def generated(self) -> np.ndarray:
        """bool ``(n_tokens,)``: the tokens of the generated continuation."""
        if self.generated_from is None:
            return np.zeros(len(self.tokens), dtype=bool)
        return np.array([start >= self.generated_from and not special
                         for (start, _), special in zip(self.offsets, self.special)], dtype=bool)

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def key_tokens(self) -> list[str]:
        """Tokens on the key axis: the encoder's for cross-attention, else the queries'."""
        return self.tokens if self.keys is None else self.keys.tokens

    def layer_index(self, layer: int) -> int:
        """Where the model's ``layer`` is in ``weights`` (itself unless ``layers`` names some)."""
        return layer if self.layers is None else self.layers.index(layer)

    def head(self, layer: int, head: int) -> np.ndarray:
        """``(n_queries, n_keys)`` weights of one head; ``layer`` is the model's."""
        return self.weights[self.layer_index(layer), head]
