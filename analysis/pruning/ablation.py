"""Switching heads off: zeroing a head's output (what a head mask and pruning do) or putting its mean output
over the sentences in place of it (mean ablation, which leaves later layers an input of the usual size), and
what that changes: the output's cosine to the full model's, its neighbours, each head's attention.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models import Attention, AttentionModel, HeadLensError
from models.run import editable

ABLATIONS = {"zero": "Zero: the head's output is removed (as pruning does)",
             "mean": "Mean: the head outputs its mean over the sentences"}
NEIGHBOURS = 5  # nearest neighbours compared for neighbour agreement


def head_mask(model: AttentionModel, heads) -> np.ndarray | None:
    """``(layers, heads)`` float32, 0 for each ``(layer, head)`` in ``heads`` and 1 elsewhere; None for no heads."""
    heads = list(heads)
    if not heads:
        return None
    return ~heads_marked(model.n_layers, model.n_heads, heads) * np.float32(1)


def heads_marked(n_layers: int, n_heads: int, heads) -> np.ndarray:
    """bool ``(layers, heads)``, True for each ``(layer, head)`` in ``heads``."""
    marked = np.zeros((n_layers, n_heads), dtype=bool)
    for layer, head in heads:
        marked[layer, head] = True
    return marked


def present_heads(model: AttentionModel) -> np.ndarray:
    """bool ``(layers, heads)``: the heads the model still has."""
    pruned = getattr(model, "pruned_heads", None)
    return np.ones((model.n_layers, model.n_heads), dtype=bool) if pruned is None else ~pruned


def ablation_means(model: AttentionModel, sentences, ablation: str, head_means):
    if ablation not in ABLATIONS:
        raise HeadLensError(f"Unknown ablation '{ablation}': choose 'zero' or 'mean'.")
    if ablation == "zero":
        return None
    return model.head_means(sentences) if head_means is None else head_means


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two sets of unit-length embeddings, ``(n,)``."""
    return np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))


def neighbour_agreement(reference: np.ndarray, other: np.ndarray, k: int = NEIGHBOURS) -> float:
    """Mean overlap, over sentences, of each one's ``k`` nearest neighbours (by cosine, itself left
    out) under ``other`` with those under ``reference``: 1 when every neighbourhood is kept."""
    n = len(reference)
    if n < 2:
        raise HeadLensError("Neighbour agreement needs at least two sentences.")
    k = min(k, n - 1)

    def nearest(e: np.ndarray) -> np.ndarray:
        sim = e.astype(np.float64) @ e.T.astype(np.float64)
        np.fill_diagonal(sim, -np.inf)
        return np.argsort(-sim, axis=1, kind="stable")[:, :k]

    a, b = nearest(reference), nearest(other)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))


@dataclass
class Ablation:
    """What switching ``heads`` off does, per sentence and per later head."""

    heads: list[tuple[int, int]]
    ablation: str
    cosine: np.ndarray            # (sentences,): each embedding's cosine to the full model's
    attention_change: np.ndarray  # (layers, heads): mean total-variation distance of each head's rows; NaN for an ablated head
    loss: float | None = None     # the model's loss with the heads off, where it has one
    full_loss: float | None = None
    sentence_losses: np.ndarray | None = None  # (sentences, 2): each one's next-token loss, full and heads off


def attention_change(full: Sequence[Attention], ablated: Sequence[Attention]) -> np.ndarray:
    """``(layers, heads)``: half the L1 distance between each query row's weights in ``full`` and in
    ``ablated`` (0 unchanged, 1 disjoint), averaged over rows and then over sentences."""
    total = None
    for a, b in zip(full, ablated):
        tv = 0.5 * np.abs(a.weights.astype(np.float64) - b.weights).sum(axis=-1).mean(axis=-1)
        total = tv if total is None else total + tv
    return total / len(full)


def ablate(model: AttentionModel, sentences: Sequence[str], heads, *, ablation: str = "zero",
           head_means=None) -> Ablation:
    """Switch ``heads`` (``(layer, head)`` pairs) off together and measure the effect on the
    embeddings, on every head's attention (later layers change, earlier ones cannot) and, where
    the model has one, on its loss. ``head_means`` defaults to the means over ``sentences``."""
    model = editable(model, "Ablation switches heads off")
    pairs = model.heads(heads)
    if not pairs:
        raise HeadLensError("Pick at least one head to switch off.")
    means = ablation_means(model, sentences, ablation, head_means)
    mask = head_mask(model, pairs)
    full_emb, off_emb = model.embed(sentences), model.embed(sentences, head_mask=mask, head_means=means)
    change = attention_change(model.attend(list(sentences)),
                              model.attend(list(sentences), head_mask=mask, head_means=means))
    for layer, head in pairs:
        change[layer, head] = np.nan
    loss = full_loss = per_sentence = None
    if getattr(model, "loss", None) is not None:
        with torch.inference_mode():
            full_loss = float(model.loss(list(sentences)))
            loss = float(model.loss(list(sentences), head_mask=torch.as_tensor(mask, device=model.device),
                                    head_means=means))
    if hasattr(model, "loss_variants"):  # a language model: each sentence's next-token loss, full and heads off
        full_mask = np.ones_like(mask)
        per_sentence = np.array([model.loss_variants([s], [full_mask, mask], head_means=means) for s in sentences])
    return Ablation(pairs, ablation, cosines(full_emb, off_emb), change, loss, full_loss, per_sentence)
