"""How much of each head a rule (``analysis.rules``) explains: the head's attention on the rule's keys.

The score of a rule for a head is the mean over queries of the head's content attention on the keys the rule names
for that query; a query whose rule names no key counts 0. In a decoder the first token is set aside, as the views
set it aside: the queries are positions 1 … n−1 and each query's weights on keys 1 … q are renormalised to sum to 1;
what the first token takes is the head's sink share, reported beside. In an encoder special tokens never query and
the weights are the head's own. Each score comes with a 95% interval (a Poisson bootstrap over the texts, as the
foci's lifts have), the rule's coverage (the share of queries it names a key for) and its lift over uniform attention
on the same keys (the score that attention spread evenly over the keys a query sees would get).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from models import HeadLensError

from .foci import LiftBootstrap, text_key
from .rules import Reading, Rule

COLUMNS = ("layer", "head", "rule", "sentence", "score", "lo", "hi", "coverage", "lift", "sink_share")


def _queries(reading: Reading) -> np.ndarray:
    """The positions that query: 1 … n−1 in a decoder, the tokens that are not special in an encoder."""
    if reading.causal:
        return np.arange(1, len(reading))
    return np.flatnonzero(~reading.special)


def text_parts(attention, rule: Rule) -> tuple[np.ndarray, np.ndarray, float, float, float]:
    """One text's sums over its queries: ``(scores (layers, heads), sink shares (layers, heads), queries, queries
    the rule names a key for, uniform attention's score)``."""
    reading = Reading.of(attention)
    queries = _queries(reading)
    L, H = attention.weights.shape[:2]
    if not len(queries):
        return np.zeros((L, H)), np.zeros((L, H)), 0.0, 0.0, 0.0
    n = len(reading)
    keys = rule.keys_of(reading)
    on = np.zeros((len(queries), n), dtype=bool)  # the rule's keys of each query, the ones the query sees
    visible = np.ones((len(queries), n), dtype=bool)
    for row, q in enumerate(queries):
        on[row, keys[q]] = True
    if reading.causal:
        visible = np.arange(n)[None, :] <= queries[:, None]
        visible[:, 0] = False  # the first token set aside
        on &= visible
    w = attention.weights[:, :, queries, :].astype(np.float64)  # (L, H, queries, keys)
    sink = w[..., 0].sum(-1)
    if reading.causal:
        content = np.where(visible, w, 0.0)
        total = content.sum(-1, keepdims=True)
        w = np.divide(content, total, out=np.zeros_like(content), where=total > 0)
    scores = (w * on).sum(-1).sum(-1)
    uniform = float((on.sum(1) / visible.sum(1)).sum())
    return scores, sink, float(len(queries)), float(on.any(1).sum()), uniform


def rule_scores(attentions: Sequence, rule: Rule, *, replicates: int = 1000) -> pd.DataFrame:
    """Each head's score for ``rule`` over ``attentions`` (one ``Attention`` per text, every layer), one row per
    head: ``COLUMNS``. The interval resamples the texts (each text's counts seeded by its own words)."""
    if not attentions:
        raise HeadLensError("Scoring a rule needs at least one text's attention.")
    L, H = attentions[0].weights.shape[:2]
    boot = LiftBootstrap((L, H), replicates)
    scores, sinks = np.zeros((L, H)), np.zeros((L, H))
    queries = covered = uniform = 0.0
    for attention in attentions:
        s, sink, n, c, u = text_parts(attention, rule)
        scores, sinks, queries, covered, uniform = scores + s, sinks + sink, queries + n, covered + c, uniform + u
        if n:
            boot.add(text_key(attention.text), s, n)
    if not queries:
        raise HeadLensError("None of these texts has a token that queries: each needs a word besides special tokens "
                            "(and, in a decoder, more than one token).")
    lo, hi = boot.interval()
    layer, head = np.divmod(np.arange(L * H), H)
    score = (scores / queries).ravel()
    return pd.DataFrame({"layer": layer, "head": head, "rule": rule.name, "sentence": rule.sentence, "score": score,
                         "lo": lo.ravel(), "hi": hi.ravel(), "coverage": covered / queries,
                         "lift": score / (uniform / queries) if uniform else np.nan,
                         "sink_share": (sinks / queries).ravel()}, columns=COLUMNS)
