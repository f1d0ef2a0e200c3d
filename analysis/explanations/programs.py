"""A head's explanation as a small program: at most ``MAX_RULES`` rules of ``analysis.roles.rules`` and a fallback
(the query's content keys, evenly), mixed with non-negative weights fitted on the fit text, plus the sink. It
predicts each query's whole row.

A row has two sides. The keys set aside (a decoder's first token; an encoder's ``[CLS]`` and its other special
tokens) take the head's mean shares on the fit text: the first token its sink share, the other special keys theirs,
evenly. The content keys (a decoder's keys 1 … q, an encoder's words) share the rest as the program spreads it: each
rule's part over the keys it names for the query (evenly; a recency rule by its decay, ``Rule.spread``), the
fallback's over every content key, their weighted sum scaled to sum to 1, so that a query its rules leave empty
falls back. The weights (the rules' and the fallback's, summing to 1) minimise the squared error to the head's
content rows (its weights on the content keys, scaled to sum to 1) over the fit text: non-negative least squares on
sums kept text by text (``Gram``), the sum held by a row that outweighs the rest. The rules are chosen greedily, each
the one that cuts the error most, while it cuts what is left by at least ``MIN_GAIN`` (the first always joins); a
rule that then gives less than ``MIN_SHARE`` of what the rules give goes, and the rest are fitted again. A program of
equal weights is the union of its rules.

Held out, a program is read (``evaluate``, a ``Reading``):

- ``score``: the head's content attention on its rules' keys, the mean over queries;
- ``lift``: that score over the one uniform attention on the same keys would get;
- ``iou``: the soft IoU of the predicted and the actual content rows, Σ min / Σ max over every query and key;
- ``iou_full``: the same on whole rows, the keys set aside included.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from ..roles.rules import KNOWN, UNION, Rule
from ..stats import LiftBootstrap
from .scores import Content, no_query

MAX_RULES = 3  # rules in a program, besides the sink and the fallback
MIN_GAIN = 0.05  # a further rule joins when it cuts this share of the fit's squared error left
MIN_SHARE = 0.05  # and stays when it gives at least this share of what the program's rules give
EMPTY = 0.0  # a query whose content attention sums to no more gives its content nothing (a compiled head's Select
# naming no key: all on the BOS)
FIRST, OTHER, FALLBACK = "sink", "special", "fallback"  # the parts besides the rules, as ``part_names`` says them


def parts(c: Content, rules: Sequence[Rule]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One text's program parts on its content keys: ``(rows (R + 1, Q, n), named (R, Q, n), content (Q, n))``: each
    rule's part of each query's content row (summing to 1 where it names a content key), then the fallback's (every
    content key evenly); the content keys each rule names; the content keys."""
    content = c.content_keys
    named = c.masks(rules) & content
    rows = np.zeros((len(rules) + 1, *content.shape), dtype=np.float32)
    for r, rule in enumerate(rules):
        rows[r] = rule.spread(c.queries, named[r])
    rows[-1] = content / np.maximum(content.sum(-1, keepdims=True), 1)
    return rows, named, content


def _scaled(X: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Rows of ``X`` on the keys ``keep`` names, each scaled to sum to 1 (0 where it has nothing there)."""
    X = X * keep
    total = X.sum(-1, keepdims=True)
    return np.divide(X, total, out=np.zeros_like(X), where=total > EMPTY)


def _other(c: Content, content: np.ndarray) -> np.ndarray:
    """bool ``(Q, n)``: the keys set aside besides the first token (an encoder's other special tokens)."""
    other = c.sees & ~content
    other[:, 0] = False
    return other


def _aside(c: Content, content: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys set aside: the first token's weight ``(L·H, Q)``, the other set-aside keys' weight ``(L·H, Q)`` and
    which they are ``(Q, n)``."""
    other = _other(c, content)
    return c.whole[..., 0], (c.whole * other).sum(-1), other


def _content_rows(weights: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each head's predicted content rows ``(heads, Q, n)`` from its weights ``(heads, K)`` over ``parts``' rows,
    each scaled to sum to 1 (the fallback's where the parts give nothing), and which queries fell back
    ``(heads, Q)``."""
    K, Q, n = rows.shape
    P = (weights.astype(rows.dtype) @ rows.reshape(K, -1)).reshape(len(weights), Q, n)
    total = P.sum(-1, keepdims=True)
    return np.where(total > 0, P / np.where(total > 0, total, 1), rows[-1]), total[..., 0] <= 0


def _whole_rows(P: np.ndarray, first: np.ndarray, spare: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Whole rows from content rows ``P`` ``(heads, Q, n)``: ``first`` ``(heads, Q)`` on the first token, ``spare``
    ``(heads, Q)`` evenly over the ``other`` keys set aside ``(Q, n)``, the rest as ``P`` spreads it."""
    out = P * (1 - first - spare)[..., None]
    out[..., 0] += first
    return out + spare[..., None] * (other / np.maximum(other.sum(-1, keepdims=True), 1))[None]


@dataclass
class Gram:
    """What a least-squares fit of every head's content rows needs, added text by text: the parts' products ``G``
    ``(K, K)`` (the same for every head), the heads' rows with each part ``B`` ``(L·H, K)`` and with themselves
    ``ss`` ``(L·H,)``; and the heads' mean shares on the first token and on the other keys set aside ``aside``
    ``(L·H, 2)``. All None when no text has a query."""

    G: np.ndarray | None
    B: np.ndarray | None
    ss: np.ndarray | None
    aside: np.ndarray | None
    covered: np.ndarray | None  # ``(K,)``: the queries each part names a key for
    texts: int = 0  # the texts with a query, read
    causal: bool = False  # whether they were read with causal attention

    @classmethod
    def of(cls, fit: Sequence, rules: Sequence[Rule]) -> Gram:
        G = B = ss = aside = None
        queries, covered, texts, causal = 0, 0, 0, False
        for attention in fit:
            c = Content.of(attention, whole=True)
            if not len(c.queries):
                continue
            texts, causal = texts + 1, bool(attention.causal)
            rows, _, content = parts(c, rules)
            F = rows.reshape(len(rows), -1)
            X = _scaled(c.whole, content).reshape(len(c.whole), -1)
            first, other, _ = _aside(c, content)
            sums = ((F @ F.T).astype(np.float64), (X @ F.T).astype(np.float64),
                    np.einsum("ij,ij->i", X, X, dtype=np.float64),
                    np.stack([first.sum(-1, dtype=np.float64), other.sum(-1, dtype=np.float64)], -1))
            G, B, ss, aside = sums if G is None else (G + sums[0], B + sums[1], ss + sums[2], aside + sums[3])
            queries += len(c.queries)
            covered = covered + (F.reshape(len(rows), len(c.queries), -1).sum(-1) > 0).sum(-1)
        if G is None:
            return cls(None, None, None, None, None)
        return cls(G, B, ss, aside / queries, covered, texts, causal)

    def _solve(self, head: int, chosen: list[int]) -> tuple[np.ndarray, float]:
        """Non-negative weights of the parts ``chosen`` for ``head`` and the squared error they leave."""
        G = self.G[np.ix_(chosen, chosen)]
        b = self.B[head, chosen]
        L = np.linalg.cholesky(G + np.eye(len(chosen)) * (1e-9 * np.trace(G) + 1e-12))
        heavy = np.sqrt(1e4 * np.trace(G) / len(chosen))  # the weights sum to 1: a row that outweighs the rest
        w, _ = nnls(np.vstack([L.T, np.full((1, len(chosen)), heavy)]), np.append(np.linalg.solve(L, b), heavy))
        return w, float(self.ss[head] - 2 * w @ b + w @ G @ w)

    def programs(self, candidates: Sequence[int]) -> np.ndarray:
        """Every head's program among the rules ``candidates`` (indices): its weights ``(L·H, R + 1)`` over the rules
        and the fallback (always in; its weight may be 0), zero for the rules it leaves out."""
        K = len(self.G)
        out = np.zeros((len(self.B), K))
        for h in range(len(self.B)):
            chosen, (w, err) = [K - 1], self._solve(h, [K - 1])
            for step in range(MAX_RULES):
                tried = [(self._solve(h, chosen + [r]), r) for r in candidates if r not in chosen]
                if not tried:
                    break
                (w_new, err_new), r = min(tried, key=lambda t: t[0][1])
                if step and err - err_new < MIN_GAIN * max(err, 1e-12):
                    break
                chosen, w, err = chosen + [r], w_new, err_new
            while len(chosen) > 2:  # a rule that gives too little of the rows goes, and the rest refit
                given = (w * self.covered[chosen])[1:]
                least = int(np.argmin(given))
                if given[least] >= MIN_SHARE * given.sum():
                    break
                chosen = chosen[:least + 1] + chosen[least + 2:]
                w, _ = self._solve(h, chosen)
            if chosen:
                out[h, chosen] = w
        return out


@dataclass
class Reading:
    """A program per head read on held-out text, each ``(L, H)``: ``score``, ``lo``/``hi`` (its 95% interval),
    ``coverage`` (the share of queries its rules name a key for), ``lift``, ``iou``, ``iou_full``, ``sink_share``;
    and ``shares`` ``(L, H, R + 3)``: the mean share of a predicted whole row each part gives (the rules, the
    fallback, the first token, the other keys set aside)."""

    score: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    coverage: np.ndarray
    lift: np.ndarray
    iou: np.ndarray
    iou_full: np.ndarray
    sink_share: np.ndarray
    shares: np.ndarray
    texts: int = 0  # the texts with a query, read


def evaluate(attentions: Sequence, rules: Sequence[Rule], programs: Sequence[np.ndarray], aside: np.ndarray,
             replicates: int = 1000) -> list[Reading]:
    """Each head's program read on ``attentions``, for each of ``programs`` (weights ``(L·H, R + 1)`` over
    ``parts``; ``aside``, the mean shares set aside, ``Gram.aside``): one ``Reading`` each, every text's parts built
    once. The programs after the first are read for their content rows' IoU alone (the rest NaN)."""
    sums: list[dict] = [{} for _ in programs]
    boots: list[LiftBootstrap] = []
    queries, shape, texts = 0, None, 0
    for attention in attentions:
        c = Content.of(attention, whole=True)
        if not len(c.queries):
            continue
        shape, texts = c.shape, texts + 1
        boots = boots or [LiftBootstrap(shape, replicates if not i else 1) for i in range(len(programs))]
        rows, named, content = parts(c, rules)
        actual = _scaled(c.whole, content).astype(np.float32)
        for i, (weights, into, boot) in enumerate(zip(programs, sums, boots)):
            _read_text(c, rows, named, content, actual, weights, aside, into, boot, whole=not i)
        queries += len(c.queries)
    if shape is None:
        raise no_query("Reading a program")

    def heads(x):
        return np.asarray(x, dtype=np.float64).reshape(*shape, *np.shape(x)[1:])

    out = []
    for i, (into, boot) in enumerate(zip(sums, boots)):
        iou = heads(into["min"] / into["max"])
        if i:  # a program read for its content rows' IoU alone
            nan = np.full_like(iou, np.nan)
            out.append(Reading(nan, nan, nan, nan, nan, iou, nan, nan, nan, texts))
            continue
        lo, hi = boot.interval()
        score, uniform = into["on"] / queries, into["uniform"] / queries
        out.append(Reading(score=heads(score), lo=lo, hi=hi, coverage=heads(into["covered"] / queries),
                           lift=heads(np.divide(score, uniform, out=np.full_like(score, np.nan), where=uniform > 0)),
                           iou=iou, iou_full=heads(into["min_full"] / into["max_full"]),
                           sink_share=heads(into["sink"] / queries), shares=heads(into["shares"] / queries),
                           texts=texts))
    return out


def _read_text(c: Content, rows: np.ndarray, named: np.ndarray, content: np.ndarray, actual: np.ndarray,
               weights: np.ndarray, aside: np.ndarray, into: dict, boot: LiftBootstrap, whole: bool = True) -> None:
    """One text's sums for one program per head, added ``into``; ``whole=False``: the content rows' IoU alone."""
    def add(name: str, value) -> None:
        into[name] = into.get(name, 0) + value

    R = len(named)
    K, Q, n = rows.shape
    P, empty = _content_rows(weights, rows)
    uses = (weights[:, :R] > 0).astype(np.float32)
    keys = (uses @ named.reshape(R, -1).astype(np.float32)).reshape(-1, Q, n) > 0      # each head's rules' keys
    # a query the head gives no content (all on the first token or special tokens: a compiled head whose Select
    # names no key) agrees with a program whose rules name none for it
    agree = (np.einsum("hqn,qn->hq", c.whole, content.astype(c.whole.dtype)) <= EMPTY) & ~keys.any(-1)  # (LH, Q)
    add("min", np.minimum(P, actual).sum((1, 2), dtype=np.float64) + agree.sum(-1))
    add("max", np.maximum(P, actual).sum((1, 2), dtype=np.float64))
    if not whole:
        return
    other = _other(c, content)
    first = np.broadcast_to(aside[:, :1], (len(P), Q)).astype(np.float32)
    spare = np.where(other.any(-1)[None], aside[:, 1:2], 0.0).astype(np.float32)       # (LH, Q)
    rows_whole = _whole_rows(P, first, spare, other)
    add("min_full", np.minimum(rows_whole, c.whole).sum((1, 2), dtype=np.float64))
    add("max_full", np.maximum(rows_whole, c.whole).sum((1, 2), dtype=np.float64))
    on = (actual * keys).sum((1, 2), dtype=np.float64) + agree.sum(-1)
    boot.add(c.key, on.reshape(c.shape), Q)
    add("on", on)
    add("covered", keys.any(-1).sum(-1))
    add("uniform", (keys.sum(-1) / np.maximum(content.sum(-1), 1)).sum(-1))
    add("sink", c.sink.ravel())
    given = weights[:, :, None] * rows.sum(-1)[None]                                   # (LH, K, Q)
    given[:, -1] += empty
    given = given / np.maximum(given.sum(1, keepdims=True), 1e-30) * (1 - first - spare)[:, None, :]
    add("shares", np.concatenate([given.sum(-1), first.sum(-1)[:, None], spare.sum(-1)[:, None]], 1))


def part_names(rules: Sequence[Rule]) -> list[str]:
    """The names of a program's parts, in ``Reading.shares``' order."""
    return [r.name for r in rules] + [FALLBACK, FIRST, OTHER]


def said(rule: Rule) -> str:
    """What a rule's sentence says it attends to: "the previous token", "its subject (nsubj)"."""
    sentence = rule.sentence.removeprefix("attends ")
    return sentence.split(" to ", 1)[1] if sentence.startswith("from ") else sentence.removeprefix("to ")


def in_words(rules: Sequence[Rule], shares: np.ndarray, causal: bool, at_least: float = 0.01) -> str:
    """A program in words, its parts by their shares: "attends to the previous token (0.62), itself (0.20), the
    first token (0.15) and the rest evenly (0.03)"."""
    phrases = [said(r) for r in rules] + ["the rest evenly", "the first token" if causal else "[CLS]",
                                          "the other special tokens"]
    order = [i for i in np.argsort(-shares, kind="stable") if shares[i] >= at_least]
    named = [f"{phrases[i]} ({shares[i]:.2f})" for i in order]
    if len(named) > 1:
        named = [", ".join(named[:-1]) + " and " + named[-1]]
    return "attends to " + named[0] if named else "attends evenly"


@dataclass(frozen=True)
class Program:
    """One head's program, as ``explain_heads``' frame holds it: its ``rules`` and their ``weights``, the
    ``fallback``'s weight, and the shares set aside (``sink`` on the first token, ``special`` on an encoder's other
    special tokens)."""

    rules: tuple[Rule, ...]
    weights: tuple[float, ...]
    fallback: float
    sink: float
    special: float

    @classmethod
    def of(cls, row) -> Program:
        """The program of a row of ``explain_heads``' frame."""
        return cls(tuple(KNOWN[n] for n in row.rule.split(UNION)), tuple(float(w) for w in row.weights),
                   float(row.fallback_weight), float(row.sink_weight), float(row.special_weight))

    def pattern(self, reading) -> tuple[np.ndarray, np.ndarray]:
        """``(pattern (n, n), rows (n,))``: the program's whole row for each query a score reads of ``reading``
        (a ``roles.rules.Reading``), and which rows those are (a decoder's first token and an encoder's special
        tokens keep the head's own)."""
        c = Content.bare(reading)
        parts_rows, _, content = parts(c, self.rules)
        P, _ = _content_rows(np.array([[*self.weights, self.fallback]]), parts_rows.astype(np.float64))
        other = _other(c, content)
        Q = len(c.queries)
        spare = np.where(other.any(-1), self.special, 0.0)[None]
        whole = _whole_rows(P, np.full((1, Q), self.sink), spare, other)[0]
        n = len(reading)
        rows = np.zeros(n, dtype=bool)
        rows[c.queries] = True
        out = np.zeros((n, n))
        out[c.queries] = whole
        return out, rows
