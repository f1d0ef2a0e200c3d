"""How much of each head a rule (``analysis.roles.rules``) explains: the head's attention on the rule's keys.

The score of a rule for a head is the mean over queries of the head's content attention on the keys the rule names
for that query; a query whose rule names no key counts 0. In a decoder the first token is set aside, as the views
set it aside: the queries are positions 1 … n−1 and each query's weights on keys 1 … q are renormalised to sum to 1;
what the first token takes is the head's sink share, reported beside. In an encoder special tokens never query and
the weights are the head's own. Each score comes with a 95% interval (a Poisson bootstrap over the texts, as the
foci's lifts have), the rule's coverage (the share of queries it names a key for) and its lift over uniform attention
on the same keys (the score that attention spread evenly over the keys a query sees would get).

Many rules are scored at once: a text's content attention is formed once (``Content``), each rule's keys become a
mask of the queries by the keys (``masks``), and every head's sum over one text is one matrix product (``sums``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from models import HeadLensError

from ..stats import LiftBootstrap, text_key
from ..roles.rules import Reading, Rule
from ..attention.views import token_label

COLUMNS = ("layer", "head", "rule", "sentence", "score", "lo", "hi", "coverage", "lift", "sink_share")


@dataclass
class Content:
    """One text's heads as a score reads them: its ``queries``, the keys each ``sees`` ``(Q, n)`` (a decoder's first
    token set aside), every head's ``weights`` on them ``(L·H, Q, n)`` (float64; a decoder's renormalised), and the
    heads' ``sink`` share summed over the queries ``(L, H)``."""

    reading: Reading
    key: int
    queries: np.ndarray
    sees: np.ndarray
    weights: np.ndarray | None
    sink: np.ndarray | None
    whole: np.ndarray | None = None  # ``whole=True``: the heads' whole rows ``(L·H, Q, n)``, as the model gave them

    @classmethod
    def of(cls, attention, head: tuple[int, int] | None = None, whole: bool = False) -> Content:
        """Every head's content, or (``head``, a ``(layer, head)``) that head's alone (shape ``(1, 1)``); ``whole``:
        the whole rows instead (float32), as a program reads them, and no ``weights``."""
        reading = Reading.of(attention)
        n = len(reading)
        queries, sees = _queries_and_sees(reading)
        weights = attention.weights if head is None else attention.weights[head[0]:head[0] + 1, head[1]:head[1] + 1]
        L, H = weights.shape[:2]
        w = weights[:, :, queries, :].astype(np.float32 if whole else np.float64).reshape(L * H, len(queries), n)
        sink = w[..., 0].sum(-1, dtype=np.float64).reshape(L, H)
        key = text_key(attention.text)
        if whole:
            return cls(reading, key, queries, sees, None, sink, w)
        if reading.causal:
            w = np.where(sees, w, 0.0)
            total = w.sum(-1, keepdims=True)
            w = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
        return cls(reading, key, queries, sees, w, sink)

    @classmethod
    def bare(cls, reading: Reading) -> Content:
        """A text read without attention: its queries and the keys each sees, no weights (a program's parts)."""
        queries, sees = _queries_and_sees(reading)
        return cls(reading, text_key(reading.text), queries, sees, None, None)

    @property
    def shape(self) -> tuple[int, int]:
        return self.sink.shape

    @property
    def content_keys(self) -> np.ndarray:
        """bool ``(Q, n)``: the keys that are content for each query: a decoder's keys 1 … q, an encoder's words."""
        return self.sees if self.reading.causal else self.sees & ~self.reading.special[None, :]

    def masks(self, rules: Sequence[Rule]) -> np.ndarray:
        """bool ``(rules, Q, n)``: the keys each rule names for each query, those the query sees."""
        n = len(self.reading)
        out = np.zeros((len(rules), len(self.queries), n), dtype=bool)
        for r, rule in enumerate(rules):
            keys = rule.predict(self.reading)  # filtered here at once: ``sees`` keeps a causal query's keys
            counts = [len(keys[q]) for q in self.queries]
            if not sum(counts):
                continue
            cols = np.fromiter((k for q in self.queries for k in keys[q]), dtype=np.int64, count=sum(counts))
            rows = np.repeat(np.arange(len(self.queries)), counts)
            inside = (cols >= 0) & (cols < n)
            out[r, rows[inside], cols[inside]] = True
        return out & self.sees

    def sums(self, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For masks ``(R, Q, n)``: every head's attention on them summed over the queries ``(R, L, H)``, the
        queries each names a key for ``(R,)``, and uniform attention's summed score ``(R,)``."""
        R = len(masks)
        flat = masks.reshape(R, -1).astype(np.float64)
        scores = (self.weights.reshape(len(self.weights), -1) @ flat.T).T.reshape(R, *self.shape)
        covered = masks.any(-1).sum(-1).astype(np.float64)
        uniform = (masks.sum(-1) / self.sees.sum(-1)).sum(-1)
        return scores, covered, uniform


def _queries_and_sees(reading: Reading) -> tuple[np.ndarray, np.ndarray]:
    """The positions that query (a decoder's 1 … n−1, an encoder's non-special tokens) and the keys each sees
    ``(Q, n)`` (a decoder's first token set aside)."""
    n = len(reading)
    queries = np.arange(1, n) if reading.causal else np.flatnonzero(~reading.special)
    sees = np.ones((len(queries), n), dtype=bool)
    if reading.causal:
        sees = np.arange(n)[None, :] <= queries[:, None]
        sees[:, 0] = False
    return queries, sees


def contents(attentions: Sequence) -> list[Content]:
    """Each text's ``Content``, those with a token that queries."""
    out = [Content.of(a) for a in attentions]
    return [c for c in out if len(c.queries)]


def no_query(what: str = "Scoring a rule") -> HeadLensError:
    return HeadLensError(f"{what} needs a text with a token that queries: a word besides special tokens (and, in a "
                         "decoder, more than one token).")


def rule_scores(attentions: Sequence, rule: Rule, *, replicates: int = 1000) -> pd.DataFrame:
    """Each head's score for ``rule`` over ``attentions`` (one ``Attention`` per text, every layer), one row per
    head: ``COLUMNS``. The interval resamples the texts (each text's counts seeded by its own words)."""
    if not attentions:
        raise HeadLensError("Scoring a rule needs at least one text's attention.")
    texts = contents(attentions)
    if not texts:
        raise no_query()
    L, H = texts[0].shape
    boot = LiftBootstrap((L, H), replicates)
    scores, sinks = np.zeros((L, H)), np.zeros((L, H))
    queries = covered = uniform = 0.0
    for c in texts:
        s, cov, u = c.sums(c.masks([rule]))
        scores, sinks = scores + s[0], sinks + c.sink
        queries, covered, uniform = queries + len(c.queries), covered + cov[0], uniform + u[0]
        boot.add(c.key, s[0], len(c.queries))
    lo, hi = boot.interval()
    layer, head = np.divmod(np.arange(L * H), H)
    score = (scores / queries).ravel()
    return pd.DataFrame({"layer": layer, "head": head, "rule": rule.name, "sentence": rule.sentence, "score": score,
                         "lo": lo.ravel(), "hi": hi.ravel(), "coverage": covered / queries,
                         "lift": score / (uniform / queries) if uniform else np.nan,
                         "sink_share": (sinks / queries).ravel()}, columns=COLUMNS)


MISS_BELOW = 0.5  # a query whose weight on its rule's keys is below this is one the rule misses


def misses(attentions: Sequence, rule: Rule, layer: int, head: int, k: int = 3) -> pd.DataFrame:
    """Where ``rule`` fails for ``(layer, head)`` over ``attentions`` (held-out text): the ``k`` queries, each of its
    own text, whose weight on the rule's keys is below ``MISS_BELOW`` and whose strongest weight elsewhere is the
    largest. One row each: ``sentence`` (its index in ``attentions``), ``text``, ``query``, ``key`` (where it went),
    their tokens, ``weight`` (on that key, as the score reads it) and ``on_rule`` (its weight on the rule's keys)."""
    found = []
    for i, attention in enumerate(attentions):
        c = Content.of(attention, (layer, head))  # this head's weights alone
        if not len(c.queries):
            continue
        w = c.weights[0]                                                                  # (Q, n)
        on = c.masks([rule])[0]
        share = (w * on).sum(-1)
        elsewhere = np.where(on | ~c.sees, -1.0, w)
        best = elsewhere.argmax(-1)
        strength = elsewhere[np.arange(len(best)), best]
        rows = np.flatnonzero((share < MISS_BELOW) & (strength > 0))
        if len(rows):
            r = rows[np.argmax(strength[rows])]
            found.append((float(strength[r]), i, int(c.queries[r]), int(best[r]), float(share[r])))
    found.sort(key=lambda f: -f[0])
    out = [{"sentence": i, "text": attentions[i].text, "query": q, "key": key,
            "query_token": token_label(attentions[i].tokens[q]), "key_token": token_label(attentions[i].tokens[key]),
            "weight": weight, "on_rule": on_rule} for weight, i, q, key, on_rule in found[:k]]
    return pd.DataFrame(out, columns=["sentence", "text", "query", "key", "query_token", "key_token", "weight",
                                      "on_rule"])
