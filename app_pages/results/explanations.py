"""Every head's explanation (``analysis.explanations``), read from the Head roles profile of the built-in corpus, and
what the model loses when its best-explained heads are replaced by their programs: computed once for every session."""
from __future__ import annotations

import pandas as pd

from analysis.explanations import corpus_halves, explain_corpus, replacement_counts, replacement_curve
from models.corpus import CORPUS

from .models import ModelRef, cached_model
from .profiles import corpus_profile
from .shared import Bar, Warm, shared, spinner


def _unmasked(ref: ModelRef) -> list[tuple]:
    return [(ref, False, ())]


@shared("explanations", entries=8, copy=True, waiting="Explaining every head", warm=Warm(1.2, _unmasked))
def explanations(ref: ModelRef, causal: bool, heads_off: tuple) -> pd.DataFrame:
    """Each head's program, fitted on alternate sentences of the built-in corpus and read on the others
    (``explain_corpus``), from the attention its Head roles profile holds: seconds once the profile is ready."""
    _, _, attentions = corpus_profile(ref, causal, heads_off, list(CORPUS))
    with spinner(f"Scoring every rule for every head over {len(attentions)} sentences…"):
        return explain_corpus(attentions)


CURVE = "every"  # the curve at ``replacement_counts``; FIRST: only a quarter of the heads
FIRST = "quarter"
FIRST_TEXTS = 24  # held-out sentences the first form measures on: seconds, where the whole curve takes a minute


def first_replacement(ref: ModelRef) -> tuple:
    """What the page shows first: a quarter of the heads replaced, on the first held-out sentences."""
    return ref, corpus_halves()[1][:FIRST_TEXTS], FIRST


def whole_replacement(ref: ModelRef) -> tuple:
    """The curve over the held-out half of the built-in corpus, on request."""
    return ref, corpus_halves()[1], CURVE


@shared("replacement", entries=8, copy=True, waiting="Replacing heads by their programs",
        warm=Warm(21, lambda ref: [first_replacement(ref)]))  # the first form only: the whole curve on request
def replacement(ref: ModelRef, texts: list[str], counts: str) -> pd.DataFrame:
    """The best-explained heads replaced by their programs and mean-ablated (``replacement_curve``) on ``texts``:
    ``counts`` "every" (``replacement_counts``), or "quarter" (a quarter of the heads alone)."""
    found = explanations(ref, False, ())
    n = len(found)
    ks = replacement_counts(n) if counts == CURVE else [max(1, round(n / 4))]
    bar = Bar(f"Replacing the best-explained heads by their programs, {len(ks)} sizes on {len(texts)} sentences")
    curve = replacement_curve(cached_model(ref), found, texts, counts=ks, means_of=corpus_halves()[0], progress=bar)
    bar.empty()
    return curve
