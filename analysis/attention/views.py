"""Attention as a view shows it: special tokens hidden, subword pieces merged into words.

Merging follows Clark et al. (2019): attention *to* a word is the sum over its pieces (keys),
attention *from* a word is the mean over its pieces (queries), so every row still sums to 1.
Hiding special tokens drops their rows and columns and renormalises each row to sum to 1.

What is hidden is what ``set_aside`` names: the special tokens, and in a decoder the first token
when it is an attention sink (Xiao et al. 2024): SmolLM2 has no BOS token, and its heads put 0.57
to 0.71 of a query's weight on whatever token comes first (the mean over every layer and head,
over each sentence of the built-in corpus). That weight is a place to park, as [CLS] and [SEP]
are in a BERT (Clark et al. 2019), so content attention leaves it out.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.result import Attention

SINK_SHARE = 0.5  # a decoder's first token is a sink when later queries put this much weight on it, on average
# Byte-level BPE writes a leading space as "Ġ", SentencePiece as "▁"; WordPiece marks pieces "##".
_SPACE_MARKS = ("Ġ", "▁")


@dataclass(frozen=True, eq=False)
class View:
    """What a figure draws.

    Attributes:
        query_labels, key_labels: readable tokens or words, in order.
        weights: float32 ``(layers, heads, n_queries, n_keys)``.
        query_special, key_special: bool, which labels are special tokens.
        query_spans, key_spans: ``(first, last + 1)`` token index range behind each label.
        causal: whether a query saw only its own and earlier tokens (a decoder's self-attention).
        layers: the model's layers ``weights`` holds (``Attention.layers``); None for every layer.
        windows: per layer of the model, its sliding window (``Attention.windows``); None when none slides.
    """

    query_labels: list[str]
    key_labels: list[str]
    weights: np.ndarray
    query_special: np.ndarray
    key_special: np.ndarray
    query_spans: list[tuple[int, int]]
    key_spans: list[tuple[int, int]]
    causal: bool = False
    layers: tuple[int, ...] | None = None
    windows: tuple[int | None, ...] | None = None

    def window(self, layer: int | None) -> int | None:
        """The sliding window of the model's ``layer``: how many of the last keys a query sees; None for all."""
        return None if layer is None or self.windows is None else self.windows[layer]

    def visible(self, layer: int | None = None) -> np.ndarray | None:
        """bool ``(n_queries, n_keys)``: which keys each query could see in the model's ``layer`` (any layer
        when None); None when it saw them all. A causal query never sees a key after it, nor, in a sliding
        layer, one a window or more behind it: those cells are not zero attention, they are not there. A
        label over several tokens sees a label when one of its tokens sees one of the other's."""
        if not self.causal:
            return None
        ends = np.array([e for _, e in self.query_spans])
        starts = np.array([s for s, _ in self.key_spans])
        seen = starts[None, :] < ends[:, None]
        window = self.window(layer)
        if window is not None:
            first = np.array([s for s, _ in self.query_spans])
            last = np.array([e for _, e in self.key_spans]) - 1
            seen &= first[:, None] - last[None, :] < window
        return seen

    def head(self, layer: int, head: int) -> np.ndarray:
        """One head's weights; ``layer`` is the model's."""
        return self.weights[layer if self.layers is None else self.layers.index(layer), head]


def token_label(token: str) -> str:
    """A token as a reader would write it: byte-level and SentencePiece space marks removed."""
    for mark in _SPACE_MARKS:
        if token.startswith(mark) and len(token) > 1:
            return token[len(mark):]
        if token == mark:
            return "␣"  # a space on its own
    return token.replace("Ċ", "\\n")


def first_token_sink(att: Attention) -> bool:
    """Whether, in causal attention, the queries after the first token put ``SINK_SHARE`` or more of
    their weight on it, averaged over every layer and head (a uniform head gives 0.29 over 10 tokens)."""
    if not att.causal or att.keys is not None or len(att.tokens) < 2 or att.special[0]:
        return False
    share = getattr(att, "sink_share", None)  # a long prompt measures it on its first queries
    if share is None:
        share = float(att.weights[..., 1:, 0].mean(dtype=np.float64))
    return share >= SINK_SHARE


def set_aside(att: Attention) -> np.ndarray:
    """bool ``(n_tokens,)``: the tokens that content attention and "hide special tokens" leave out:
    special tokens ([CLS], [SEP], <s>…) and a decoder's first token when it is a sink."""
    out = np.asarray(att.special, dtype=bool).copy()
    if first_token_sink(att):
        out[0] = True
    return out


def word_spans(att: Attention) -> list[tuple[int, int]]:
    """Runs of consecutive tokens that share a word id; each special token stands alone."""
    spans: list[tuple[int, int]] = []
    for i, (wid, special) in enumerate(zip(att.word_ids, att.special)):
        joins = spans and not special and wid is not None and att.word_ids[i - 1] == wid and not att.special[i - 1]
        if joins:
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))
    return spans


def _span_label(att: Attention, start: int, end: int) -> str:
    if end - start == 1:
        return token_label(att.tokens[start])
    first, last = att.offsets[start][0], att.offsets[end - 1][1]
    if last > first:
        return att.text[first:last]
    return "".join(token_label(t).removeprefix("##") for t in att.tokens[start:end])


GENERATED_MARK = "▸"  # before the label of a generated token, in every view


def _marked(att: Attention, start: int, end: int) -> str:
    label = _span_label(att, start, end)
    return GENERATED_MARK + label if att.generated_from is not None and att.generated[start] else label


def merge_weights(weights: np.ndarray, query_spans, key_spans) -> np.ndarray:
    """Sum over the pieces of each key word, mean over the pieces of each query word."""
    k_starts = np.array([s for s, _ in key_spans])
    q_starts = np.array([s for s, _ in query_spans])
    q_sizes = np.array([e - s for s, e in query_spans], dtype=np.float32)
    merged = np.add.reduceat(weights, k_starts, axis=-1)
    merged = np.add.reduceat(merged, q_starts, axis=-2)
    return (merged / q_sizes[:, None]).astype(np.float32)


def renormalise_rows(weights: np.ndarray) -> np.ndarray:
    """Rows scaled to sum to 1; a row with nothing left stays zero."""
    sums = weights.sum(axis=-1, keepdims=True)
    return np.divide(weights, sums, out=np.zeros_like(weights), where=sums > 0)


def make_view(att: Attention, *, hide_special: bool = False, merge_words: bool = False) -> View:
    """The weights and labels to draw for ``att`` under the two display options."""
    keys = att.keys or att
    weights = att.weights
    if merge_words:
        q_spans, k_spans = word_spans(att), word_spans(keys)
        weights = merge_weights(weights, q_spans, k_spans)
    else:
        q_spans = [(i, i + 1) for i in range(len(att.tokens))]
        k_spans = [(i, i + 1) for i in range(len(keys.tokens))]
    q_labels = [_marked(att, s, e) for s, e in q_spans]
    k_labels = [_marked(keys, s, e) for s, e in k_spans]
    aside, keys_aside = set_aside(att), set_aside(keys)
    q_special = np.array([bool(aside[s]) for s, _ in q_spans], dtype=bool)
    k_special = np.array([bool(keys_aside[s]) for s, _ in k_spans], dtype=bool)
    if hide_special and (q_special.any() or k_special.any()):
        keep_q, keep_k = np.flatnonzero(~q_special), np.flatnonzero(~k_special)
        weights = renormalise_rows(weights[..., keep_q, :][..., keep_k])
        q_labels, k_labels = [q_labels[i] for i in keep_q], [k_labels[i] for i in keep_k]
        q_spans, k_spans = [q_spans[i] for i in keep_q], [k_spans[i] for i in keep_k]
        q_special, k_special = q_special[keep_q], k_special[keep_k]
    return View(q_labels, k_labels, np.ascontiguousarray(weights, dtype=np.float32), q_special, k_special,
                q_spans, k_spans, causal=bool(att.causal and att.keys is None), layers=att.layers,
                windows=att.windows if att.keys is None else None)


def row_entropy(weights: np.ndarray) -> np.ndarray:
    """Entropy in nats of each row (the last axis) of attention weights; 0 log 0 counts as 0."""
    # one buffer, logs taken only where a weight is positive: a 512-token layer stack is 19 M weights
    terms = np.log(weights, out=np.zeros(weights.shape, dtype=np.result_type(weights, np.float32)), where=weights > 0)
    terms *= weights
    return -terms.sum(axis=-1)


def head_stats(view: View, special_share: np.ndarray | None = None, layers: slice = slice(None)) -> dict[str, np.ndarray]:
    """Per head of every layer (or of ``layers``), from the weights as shown.

    Returns arrays shaped ``(layers, heads)``: ``entropy`` (nats, mean over query rows),
    ``max_weight``, and ``to_special`` (mean over queries of the weight on special keys; from
    ``special_share`` when given, since a view with special tokens hidden has none left).
    """
    w = view.weights[layers]
    entropy = row_entropy(w).mean(axis=-1)
    to_special = special_share[layers] if special_share is not None else w[..., view.key_special].sum(-1).mean(-1)
    return {"entropy": entropy.astype(np.float32), "max_weight": w.max(axis=(-2, -1)),
            "to_special": np.asarray(to_special, dtype=np.float32)}


def special_share(att: Attention) -> np.ndarray:
    """``(layers, heads)``: mean over queries of the weight each head puts on special tokens (and a sink)."""
    return att.weights[..., set_aside(att.keys or att)].sum(-1).mean(-1)
