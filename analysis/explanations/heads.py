"""Every head explained by a small program (``programs``): at most three rules with their weights, the sink, and a
fallback for queries its rules leave empty, fitted on a fit text and read on held-out text it was not fitted on.

    frame = explain_heads(model)            # the built-in paragraphs' halves: fit on one, read on the other
    frame[explained(frame)]                 # the heads a program explains

One row per head (``COLUMNS``): ``rule`` (the program's rules joined by " or ", the one that gives most first, which
``rule_named`` takes back), ``family``, ``sentence`` (the program in words, each part with its share of the held-out
rows), ``program`` (the same as names and shares), ``weights`` (the rules' fitted weights, in ``rule``'s order),
``sink_weight`` and ``special_weight`` (the shares the program gives the first token and an encoder's other special
tokens: the head's means on the fit text); then, on the held-out text, ``score`` (the head's content attention on
the rules' keys) with its 95% interval ``lo``/``hi``, ``coverage``, ``lift`` (over uniform attention on the same
keys), ``iou`` and ``iou_full`` (the soft IoU, Σ min / Σ max, of the program's rows and the head's, on the content
keys and on whole rows), ``positional`` (the best program of positional rules alone, fitted the same way),
``lift_positional`` (``iou`` over that program's) and ``sink_share`` (the head's mean weight on the first token).

A head is explained when its held-out ``score`` is at least ``EXPLAINED`` and its ``lift`` at least
``EXPLAINED_LIFT``: a program naming every key a query sees scores 1.0 and explains nothing.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from models import HeadLensError
from models.corpus import CORPUS, paragraph_halves

from ..roles.rules import KNOWN, RULES, UNION, Reading, Rule, compiled_rules, union
from .programs import Gram, evaluate, in_words, part_names
from .scores import COLUMNS as SCORE_COLUMNS
from .scores import Content, no_query

EXPLAINED = 0.7  # a head whose held-out score reaches this, with a lift of at least EXPLAINED_LIFT, is explained
EXPLAINED_LIFT = 3.0  # naming every key a query sees scores 1.0 and explains nothing: the keys must be few
COLUMNS = (*SCORE_COLUMNS[:2], "rule", "family", "sentence", "program", "weights", "fallback_weight", "sink_weight",
           "special_weight", "score", "lo", "hi", "coverage", "lift", "iou", "iou_full", "positional", "lift_positional",
           "sink_share")


def corpus_halves(sentences: Sequence[str] = CORPUS) -> tuple[list[str], list[str]]:
    """Alternate sentences of the built-in sentence corpus, so that each half spans it: the fit and held-out texts of
    the explanations a page reads from a profile of that corpus (``explain_corpus``)."""
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


def explain_attentions(fit: Sequence, held_out: Sequence, *, rules: Sequence[Rule] | None = None,
                       replicates: int = 1000, progress: Callable[[float], None] | None = None) -> pd.DataFrame:
    """Every head's program fitted on the attentions of a fit text and read on a held-out one (``Attention``\\ s,
    every layer): one row per head, ``COLUMNS``."""
    kept_apart([a.text for a in fit], [a.text for a in held_out])
    return _explained(fit, held_out, rules, replicates, progress or (lambda _: None))


def _explained(fit: Iterable, held_out: Iterable, rules: Sequence[Rule] | None, replicates: int,
               said: Callable[[float], None]) -> pd.DataFrame:
    """``explain_attentions`` on attentions read once each, in order, as they come (a generator's)."""
    rules = [r for r in (RULES.values() if rules is None else rules) if r.name != "first token"]  # the sink's part
    gram = Gram.of(fit, rules)
    if gram.G is None:
        raise no_query("Explaining heads")
    said(FIT_SHARE)
    every = _evenly_as_rule(gram.programs(range(len(rules))), rules)
    positional = gram.programs([i for i, r in enumerate(rules) if r.family == "positional"])
    said(FIT_SHARE + 0.05)
    read, pos = evaluate(held_out, rules, [every, positional], gram.aside, replicates)
    said(READ_SHARE)
    causal = gram.causal
    L, H = read.score.shape
    rows = []
    for i, (layer, head) in enumerate(np.ndindex(L, H)):
        shares = read.shares[layer, head]
        mine = _largest_first(every[i], gram.covered)
        program = functools.reduce(union, [rules[j] for j in mine])
        named = [rules[j] for j in _largest_first(positional[i], gram.covered)]
        rows.append({"layer": layer, "head": head, "rule": program.name, "family": program.family,
                     "sentence": in_words(rules, shares, causal), "program": _program(rules, shares, every[i]),
                     "weights": tuple(float(every[i, j]) for j in mine), "fallback_weight": float(every[i, -1]),
                     "sink_weight": float(gram.aside[i, 0]),
                     "special_weight": float(gram.aside[i, 1]), "positional": " or ".join(r.name for r in named)})
    frame = pd.DataFrame(rows)
    cells = {"score": read.score, "lo": read.lo, "hi": read.hi, "coverage": read.coverage, "lift": read.lift,
             "lift_positional": read.iou / pos.iou, "iou": read.iou, "iou_full": read.iou_full,
             "sink_share": read.sink_share}
    for name, value in cells.items():
        frame[name] = np.asarray(value).ravel()
    frame = frame[list(COLUMNS)]
    frame.attrs.update(causal=causal, fit=gram.texts, held_out=read.texts, rules=[r.name for r in rules])
    said(1.0)
    return frame


def read_on(frame: pd.DataFrame, attentions: Sequence, *, replicates: int = 1000) -> pd.DataFrame:
    """Each head's program of ``frame`` (``explain_heads``', or some of its rows: one card's head) read on other
    texts' attentions, a user's: one row per head of ``frame``, ``layer``, ``head``, ``rule``, and ``score``, ``lo``,
    ``hi``, ``coverage``, ``lift``, ``iou``, ``iou_full``, ``sink_share`` as the frame reads its held-out text."""
    rules = [KNOWN[n] for n in frame.attrs.get("rules", [r.name for r in RULES.values() if r.name != "first token"])]
    index = {r.name: i for i, r in enumerate(rules)}
    texts = [a for a in attentions if _queries(a)]
    if not texts:
        raise no_query("Reading a head's program")
    L, H = texts[0].weights.shape[:2]
    weights, aside = np.zeros((L * H, len(rules) + 1)), np.zeros((L * H, 2))
    weights[:, -1] = 1.0  # a head the frame leaves out: read as even (not reported)
    at = [int(r.layer) * H + int(r.head) for r in frame.itertuples()]
    for i, r in zip(at, frame.itertuples()):
        weights[i] = 0.0
        for name, w in zip(r.rule.split(UNION), r.weights):
            weights[i, index[name]] = w
        weights[i, -1] = r.fallback_weight
        aside[i] = r.sink_weight, r.special_weight
    (read,) = evaluate(texts, rules, [weights], aside, replicates)
    out = pd.DataFrame({"layer": frame["layer"].to_numpy(), "head": frame["head"].to_numpy(),
                        "rule": frame["rule"].to_numpy()})
    for name in ("score", "lo", "hi", "coverage", "lift", "iou", "iou_full", "sink_share"):
        out[name] = getattr(read, name).ravel()[at]
    out.attrs["texts"] = len(texts)
    return out


def _queries(attention) -> bool:
    return len(Content.bare(Reading.of(attention)).queries) > 0


def _evenly_as_rule(weights: np.ndarray, rules: Sequence[Rule]) -> np.ndarray:
    """Programs ``(L·H, R + 1)`` whose fallback gives most (every content key evenly) given to a rule naming every
    key, where one is among ``rules`` (RASP's TRUE): a compiled head's uniform Select named as one, its rules'
    rounding left out."""
    every = [j for j, r in enumerate(rules) if r.comparisons == {"TRUE"}]
    if not every:
        return weights
    out = weights.copy()
    even = out[:, -1] >= 0.5
    out[even] = np.where(out[even] < 1e-6, 0.0, out[even])
    out[even, every[0]] += out[even, -1]
    out[even, -1] = 0.0
    return out


def _largest_first(weights: np.ndarray, covered: np.ndarray) -> list[int]:
    """The rules a program uses, the one that gives most of the fit's rows first."""
    used = [j for j in range(len(weights) - 1) if weights[j] > 0]
    return sorted(used, key=lambda j: -weights[j] * covered[j])


def _program(rules: Sequence[Rule], shares: np.ndarray, weights: np.ndarray) -> str:
    """The program's parts and their shares of a row: "previous token 0.62; itself 0.20; sink 0.15; fallback 0.03"."""
    names = part_names(rules)
    used = [j for j in np.argsort(-shares, kind="stable")
            if (weights[j] > 0 if j < len(weights) - 1 else shares[j] > 0.005)]
    return "; ".join(f"{names[j]} {shares[j]:.2f}" for j in used)


def explain_heads(model, fit: Sequence[str] | None = None, held_out: Sequence[str] | None = None, *,
                  rules: Sequence[Rule] | None = None, replicates: int = 1000, batch_size: int = 8,
                  progress: Callable[[float], None] | None = None, **attend) -> pd.DataFrame:
    """Every head of ``model`` explained: its program fitted on ``fit`` and read on ``held_out`` (by default the
    built-in paragraphs' two halves, ``paragraph_halves``; a compiled program's, its own random inputs' halves, read
    by ``compiled_rules``), one row per head (``COLUMNS``). The texts are attended
    ``batch_size`` at a time and each batch read as it comes: one batch's weights are held at once, not every
    text's (SmolLM2 over the 130 paragraphs: 2 GB of weights); ``attend``: ``model.attend``'s options (``head_mask``,
    ``causal``)."""
    own = getattr(model, "random_inputs", None)  # a compiled program: its own tokens' inputs, RASP's comparisons
    on = ("inputs" if own else "paragraphs") if fit is None and held_out is None else "texts"  # as the frame says
    if rules is None and own:
        rules = compiled_rules()
    if fit is None and held_out is None:
        fit, held_out = own_halves(own()) if own else paragraph_halves()
    elif fit is None or held_out is None:
        raise HeadLensError("Give both the fit texts and the held-out texts, or neither (the built-in paragraphs' "
                            "halves).")
    fit, held_out = list(fit), list(held_out)
    kept_apart(fit, held_out)
    said, total = progress or (lambda _: None), len(fit) + len(held_out)

    def attended(texts: list[str], before: int, share: float):
        for start in range(0, len(texts), batch_size):
            batch = model.attend(texts[start:start + batch_size], batch_size=batch_size, **attend)
            while batch:  # each text's weights let go once read
                yield batch.pop(0)
            said(share * (before + min(start + batch_size, len(texts))) / total)

    frame = _explained(attended(fit, 0, FIT_SHARE), attended(held_out, len(fit), READ_SHARE), rules, replicates,
                       said)
    frame.attrs["held_out_texts"] = on
    return frame


def explained_on(model) -> str:
    """What ``explain_heads`` reads ``model``'s heads on by default, in words."""
    if getattr(model, "random_inputs", None):  # counted as it reads them, not drawn twice
        return "random inputs of its tokens"
    return f"{sum(map(len, paragraph_halves()))} paragraphs"


def own_halves(texts: Sequence[str]) -> tuple[list[str], list[str]]:
    """A compiled program's random inputs (``CompiledModel.random_inputs``, each once) in two halves: alternate
    inputs fitted on and held out."""
    texts = list(dict.fromkeys(texts))
    return texts[0::2], texts[1::2]


FIT_SHARE, READ_SHARE = 0.45, 0.95  # the progress reported once the fit texts, then the held-out ones, are read


def explain_corpus(attentions: Sequence, **options) -> pd.DataFrame:
    """``explain_attentions`` over one list of sentences' attentions split in two as ``corpus_halves`` splits the
    corpus: alternate sentences fitted on and held out (``held_out_of``)."""
    frame = explain_attentions(list(attentions[0::2]), held_out_of(attentions), **options)
    frame.attrs["held_out_texts"] = "sentences"
    return frame


def held_out_of(attentions: Sequence) -> list:
    """The held-out half of ``explain_corpus``'s texts."""
    return list(attentions[1::2])


def explained(frame: pd.DataFrame, at_least: float = EXPLAINED, lift: float = EXPLAINED_LIFT) -> pd.Series:
    """Which heads are explained: a held-out score of ``at_least`` on keys few enough for a lift of ``lift``."""
    return (frame["score"] >= at_least) & (frame["lift"] >= lift)


def explained_share(frame: pd.DataFrame, at_least: float = EXPLAINED, lift: float = EXPLAINED_LIFT) -> float:
    """The share of heads ``explained``."""
    return float(explained(frame, at_least, lift).mean())
