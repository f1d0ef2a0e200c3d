"""Every head explained in a sentence: the rule (or the union of two) that best predicts its attention on a fit
text, scored on held-out text it was not fitted on.

    frame = explain_heads(model)            # the built-in corpus split in two: fit on one half, scored on the other
    frame[frame.score >= EXPLAINED]         # the heads a rule explains

For each head every rule of ``analysis.roles.rules`` is scored on the fit text; the unions of two of each head's best
``TOP`` rules are scored too, and a union is taken when it adds at least ``UNION_GAIN`` to the best single rule's
score (a second rule must earn its place). The chosen rule is then scored on the held-out text: its score with a 95%
interval, its coverage, its lift over uniform attention on the same keys, and its lift over the head's best
positional rule (chosen on the fit text too, scored on the held-out one). A head is explained when its held-out score
is at least ``EXPLAINED``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from models import HeadLensError
from models.corpus import CORPUS

from ..stats import LiftBootstrap
from ..roles.rules import RULES, Rule, in_words, union
from .scores import COLUMNS as SCORE_COLUMNS
from .scores import Content, contents, no_query

EXPLAINED = 0.7  # a head whose held-out score reaches this is explained
TOP = 4  # each head's best single rules whose unions are tried
UNION_GAIN = 0.05  # what a union must add to the best single rule's fit score
COLUMNS = (*SCORE_COLUMNS[:2], "rule", "family", "sentence", "score", "lo", "hi", "coverage", "lift", "positional",
           "lift_positional", "fit_score", "sink_share")


def corpus_halves(sentences: Sequence[str] = CORPUS) -> tuple[list[str], list[str]]:
    """The default fit and held-out texts: alternate sentences of the built-in corpus, so that each half spans it."""
    return list(sentences[0::2]), list(sentences[1::2])


def kept_apart(fit: Sequence[str], held_out: Sequence[str]) -> None:
    """A held-out text is never one fitted on."""
    both = set(fit) & set(held_out)
    if both:
        raise HeadLensError(f"{len(both)} of the held-out texts are among the fit texts (such as "
                            f"{next(iter(both))!r}): "
                            "a rule is scored on text it was not chosen on.")
    if not fit or not held_out:
        raise HeadLensError("Explaining heads needs fit texts and held-out texts, at least one of each.")


def _summed(texts: list[Content], masks: Callable[[int, Content], np.ndarray], keep: bool = False):
    """The masks' sums over ``texts``: ``(scores (R, L, H), covered (R,), uniform (R,), queries, per text)``;
    ``keep``: each text's scores too."""
    total = covered = uniform = None
    queries, per_text = 0, []
    for i, c in enumerate(texts):
        s, cov, u = c.sums(masks(i, c))
        total, covered, uniform = (s, cov, u) if total is None else (total + s, covered + cov, uniform + u)
        queries += len(c.queries)
        if keep:
            per_text.append(s)
    return total, covered, uniform, queries, per_text


def explain_attentions(fit: Sequence, held_out: Sequence, *, rules: Sequence[Rule] | None = None,
                       replicates: int = 1000, progress: Callable[[float], None] | None = None) -> pd.DataFrame:
    """Every head's explanation from the attentions of a fit text and a held-out one (``Attention``\\ s, every
    layer): one row per head, ``COLUMNS``."""
    kept_apart([a.text for a in fit], [a.text for a in held_out])
    rules = list(RULES.values() if rules is None else rules)
    said = progress or (lambda _: None)
    fitting, held = contents(fit), contents(held_out)
    if not fitting or not held:
        raise no_query("Explaining heads")
    L, H = fitting[0].shape
    singles = [c.masks(rules) for c in fitting]
    said(0.3)
    fit_s, *_, fit_q, _ = _summed(fitting, lambda i, _: singles[i])
    fit_score = fit_s / fit_q                                                    # (R, L, H)
    best = np.argsort(-fit_score, axis=0)[:TOP]                                  # (TOP, L, H)
    pairs = sorted({(int(min(a, b)), int(max(a, b))) for t in best.reshape(TOP, -1).T
                    for i, a in enumerate(t) for b in t[i + 1:]})
    a, b = (np.array([p[i] for p in pairs], dtype=int) for i in (0, 1))
    joined_s, *_ = _summed(fitting, lambda i, _: singles[i][a] | singles[i][b])
    union_score = joined_s / fit_q                                               # (U, L, H)
    said(0.5)
    top, top_u = fit_score.argmax(0), union_score.argmax(0)
    take_union = union_score.max(0) >= fit_score.max(0) + UNION_GAIN
    positional = np.array([r.family == "positional" for r in rules])
    best_positional = np.where(positional[:, None, None], fit_score, -np.inf).argmax(0)
    # the held-out text: every single rule and each union some head chose
    chosen_unions = sorted(set(top_u[take_union].tolist()))
    ua, ub = a[chosen_unions], b[chosen_unions]
    R = len(rules)
    choice = np.where(take_union, R + np.searchsorted(chosen_unions, top_u), top)  # index among singles + chosen
    causal = fitting[0].reading.causal
    held_masks = lambda _, c: np.concatenate([m := c.masks(rules), m[ua] | m[ub]])  # noqa: E731
    s, covered, uniform, queries, per_text = _summed(held, held_masks, keep=True)
    said(0.8)
    rows, cols = np.indices((L, H))
    boot = LiftBootstrap((L, H), replicates)
    for c, part in zip(held, per_text):
        boot.add(c.key, part[choice, rows, cols], len(c.queries))
    lo, hi = boot.interval()
    sink = sum(c.sink for c in held) / queries
    score = s[choice, rows, cols] / queries
    named = rules + [union(rules[i], rules[j]) for i, j in zip(ua, ub)]
    pos_score = s[best_positional, rows, cols] / queries
    frame = pd.DataFrame({
        "layer": rows.ravel(), "head": cols.ravel(),
        "rule": [named[i].name for i in choice.ravel()], "family": [named[i].family for i in choice.ravel()],
        "sentence": [in_words(named[i].sentence, causal) for i in choice.ravel()],
        "score": score.ravel(), "lo": lo.ravel(), "hi": hi.ravel(),
        "coverage": (covered[choice] / queries).ravel(),
        "lift": (score / np.where(uniform[choice] > 0, uniform[choice] / queries, np.nan)).ravel(),
        "positional": [rules[i].name for i in best_positional.ravel()],
        "lift_positional": (score / np.where(pos_score > 0, pos_score, np.nan)).ravel(),
        "fit_score": np.where(take_union, union_score.max(0), fit_score.max(0)).ravel(),
        "sink_share": sink.ravel()}, columns=COLUMNS)
    frame.attrs.update(causal=causal, fit=len(fit), held_out=len(held_out))
    said(1.0)
    return frame


def explain_heads(model, fit: Sequence[str] | None = None, held_out: Sequence[str] | None = None, *,
                  rules: Sequence[Rule] | None = None, replicates: int = 1000, batch_size: int = 32,
                  progress: Callable[[float], None] | None = None) -> pd.DataFrame:
    """Every head of ``model`` explained: the rule fitted on ``fit`` and scored on ``held_out`` (by default the
    built-in corpus's two halves, ``corpus_halves``), one row per head (``COLUMNS``)."""
    if fit is None and held_out is None:
        fit, held_out = corpus_halves()
    elif fit is None or held_out is None:
        raise HeadLensError("Give both the fit texts and the held-out texts, or neither (the built-in corpus's "
                            "halves).")
    fit, held_out = list(fit), list(held_out)
    kept_apart(fit, held_out)
    attentions = model.attend(fit + held_out, batch_size=batch_size)
    return explain_attentions(attentions[:len(fit)], attentions[len(fit):], rules=rules, replicates=replicates,
                              progress=progress)


def explain_corpus(attentions: Sequence, **options) -> pd.DataFrame:
    """``explain_attentions`` over one list of texts' attentions split in two as ``corpus_halves`` splits the
    corpus: alternate texts fitted on and held out (``held_out_of``)."""
    return explain_attentions(list(attentions[0::2]), held_out_of(attentions), **options)


def held_out_of(attentions: Sequence) -> list:
    """The held-out half of ``explain_corpus``'s texts."""
    return list(attentions[1::2])


def explained_share(frame: pd.DataFrame, at_least: float = EXPLAINED) -> float:
    """The share of heads whose held-out score reaches ``at_least``."""
    return float((frame["score"] >= at_least).mean())
