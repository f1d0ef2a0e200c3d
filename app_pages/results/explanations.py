"""Every head's explanation (``analysis.explanations``), fitted on half the built-in paragraphs and read on the other
half, first from the Head roles profile's sentences (seconds), and what the model loses when its best-explained heads
are replaced by their programs: computed once for every session."""
from __future__ import annotations

import pandas as pd

from analysis import head_mask
from analysis.explanations import explain_corpus, explain_heads, replacement_counts, replacement_curve
from analysis.explanations.heads import explained_on
from models.corpus import CORPUS, paragraph_halves

from .models import ModelRef, cached_model
from .profiles import corpus_profile
from .progress import Bar, spinner
from .shared import Warm, shared

PARAGRAPHS, SENTENCES = "paragraphs", "sentences"  # the texts a head is explained on, as its frame names them


@shared("explanations", entries=8, copy=True, waiting="Explaining every head on the built-in paragraphs",
        warm=Warm(12, lambda ref: [(ref, False, (), PARAGRAPHS)]))
def explanations(ref: ModelRef, causal: bool, heads_off: tuple, texts: str = PARAGRAPHS) -> pd.DataFrame:
    """Each head's program fitted on alternate paragraphs of the built-in prose and read on the others
    (``explain_heads``, about 10 s for MiniLM and 45 s for SmolLM2 on two cores); on ``SENTENCES``, on alternate
    sentences of the built-in corpus (``explain_corpus``) from the attention its Head roles profile holds: seconds
    once the profile is ready."""
    if texts == SENTENCES:
        _, _, attentions = corpus_profile(ref, causal, heads_off, list(CORPUS))
        with spinner(f"Scoring every rule for every head over {len(attentions)} sentences…"):
            return explain_corpus(attentions)
    model = cached_model(ref)
    bar = Bar(f"Explaining every head over {explained_on(model)}")
    found = explain_heads(model, head_mask=head_mask(model, heads_off), causal=causal,
                          progress=lambda share: bar(round(share * 100), 100))
    bar.empty()
    return found


def explained_for(ref: ModelRef, causal: bool, heads_off: tuple) -> tuple[tuple, bool]:
    """The arguments of the explanations a page shows at once, and whether the paragraphs' are on their way: those
    when computed; else the sentences' (seconds, from the Head roles profile), and (True) the paragraphs' drawn in
    their place once the server's preparation, which then takes them next, has them. With no preparation under way
    they are computed on request (``explanations(*paragraphs(...))``: 10 s to a minute)."""
    full = paragraphs(ref, causal, heads_off)
    if explanations.peek(*full) is not None:
        return full, False
    coming = explanations.later(*full, says="Every head is explained on the built-in sentences for now. On the "
                                            "paragraphs, its explanation")
    return (ref, causal, heads_off, SENTENCES), coming


def paragraphs(ref: ModelRef, causal: bool, heads_off: tuple) -> tuple:
    return ref, causal, heads_off, PARAGRAPHS


CURVE = "every"  # the curve at ``replacement_counts``; FIRST: only a quarter of the heads
FIRST = "quarter"
FIRST_TEXTS, CURVE_TEXTS, MEANS_TEXTS = 6, 24, 16  # held-out paragraphs measured on first and for the curve, and fit
# paragraphs the means are taken over: seconds first, where the whole curve takes a minute


def first_replacement(ref: ModelRef) -> tuple:
    """What the page shows first: a quarter of the heads replaced, on the first held-out paragraphs."""
    return ref, paragraph_halves()[1][:FIRST_TEXTS], FIRST


def whole_replacement(ref: ModelRef) -> tuple:
    """The curve over more of the held-out paragraphs, on request."""
    return ref, paragraph_halves()[1][:CURVE_TEXTS], CURVE


@shared("replacement", entries=8, copy=True, waiting="Replacing heads by their programs",
        warm=Warm(21, lambda ref: [first_replacement(ref)]))  # the first form only: the whole curve on request
def replacement(ref: ModelRef, texts: list[str], counts: str) -> pd.DataFrame:
    """The best-explained heads replaced by their programs and mean-ablated (``replacement_curve``, the means over
    the first fit paragraphs) on ``texts``: ``counts`` "every" (``replacement_counts``), or "quarter" (a quarter of
    the heads alone)."""
    found = explanations(ref, False, (), PARAGRAPHS)
    n = len(found)
    ks = replacement_counts(n) if counts == CURVE else [max(1, round(n / 4))]
    bar = Bar(f"Replacing the best-explained heads by their programs, {len(ks)} sizes on {len(texts)} paragraphs")
    curve = replacement_curve(cached_model(ref), found, texts, counts=ks, means_of=paragraph_halves()[0][:MEANS_TEXTS],
                              progress=bar)
    bar.empty()
    return curve
