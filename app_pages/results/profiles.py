"""Head-role profiles over many sentences: computed once for every session, with a progress bar."""
from __future__ import annotations


import numpy as np

from analysis import RANKING_MEASURES, head_mask, head_similarity, measure_heads
from analysis.defaults import DECODER_SAMPLE
from analysis.roles.long import profile_document
from models import AttentionModel
from models.corpus import CORPUS, corpus_sample
from models.long import LongAttention

from .long import PROGRESS_EVERY
from .models import ModelRef, cached_model
from .progress import Bar, note, spinner
from .shared import First, Warm, shared


PROFILE_BYTES = 512 * 2**20  # attention weights one head-role profile may hold


PROFILES_BYTES = 640 * 2**20  # and all the profiles kept for every session


def _first(ref: ModelRef) -> list[tuple]:
    """What pages show first, as the sidebar's model reads it unmasked: the built-in corpus (Foci, Head roles), and
    the sentences Pruning measures a decoder on by default (its importance against each head's role)."""

    return [*_corpus(ref), (ref, False, (), corpus_sample(DECODER_SAMPLE))]


FIRST_SHARE = 8  # a profile's first form: the first eighth of its sentences
FIRST_FROM = 64  # of a profile of more sentences than this; a smaller one is its own first form


def _fewer(ref: ModelRef, causal: bool, heads_off: tuple, sentences: list[str]) -> tuple:
    """A profile's first form: the first eighth of its sentences (the whole profile when it has ``FIRST_FROM`` or
    fewer)."""
    return ref, causal, heads_off, (sentences if len(sentences) <= FIRST_FROM else
                                    sentences[:len(sentences) // FIRST_SHARE])


def _first_says(ref: ModelRef, causal: bool, heads_off: tuple, sentences: list[str]) -> str:
    first = _fewer(ref, causal, heads_off, sentences)[3]
    return f"Head roles over the first {len(first):,} of the {len(sentences):,} sentences"


def profile_bytes(value) -> int:
    """What a profile holds: its attention weights, by far its largest part."""
    _, _, attentions = value
    return sum(a.weights.nbytes for a in attentions) if isinstance(attentions, list) else 0


@shared("profile", entries=12, max_bytes=PROFILES_BYTES, size=profile_bytes, owned=True, copy=True,
        waiting="Profiling these sentences", warm=Warm(1, _first), first=First(_fewer, _first_says))
def corpus_profile(ref: ModelRef, causal: bool, heads_off: tuple, sentences: list[str]):
    """Head roles over ``sentences`` on ``ref``'s model: the per-head frame, per-sentence measures (``(sentences,
    layers, heads)`` each), and the attentions. Entries only closed sessions asked for are dropped; the built-in
    corpus's, computed by the server, stay."""
    model = cached_model(ref)
    sentences = within_budget(model, sentences)
    bar = Bar(f"Profiling {len(sentences)} sentences")
    attentions = model.attend(sentences, head_mask=head_mask(model, heads_off), causal=causal, progress=bar)
    measures = measure_heads(attentions)
    per_sentence = {name: measures.per_sentence(name) for name in RANKING_MEASURES}
    bar.empty()
    return measures.frame(), per_sentence, attentions


def _corpus(ref: ModelRef) -> list[tuple]:
    return [(ref, False, (), list(CORPUS))]


@shared("similarity", entries=12, owned=True, waiting="Comparing every pair of heads", warm=Warm(2.2, _corpus))
def profile_similarity(ref: ModelRef, causal: bool, heads_off: tuple, sentences: list[str]) -> np.ndarray:
    """The heads' Jensen-Shannon divergences over a profile's sentences (``analysis.head_similarity``), for Head
    roles' heads that behave alike: nearly as long as the rest of a profile, so only the page that shows it asks."""
    _, _, attentions = corpus_profile(ref, causal, heads_off, sentences)
    with spinner(f"Comparing the patterns of every pair of heads over {min(len(attentions), 100)} sentences…"):
        return head_similarity(attentions)


@shared("document profile", entries=4, owned=True, copy=True, waiting="Profiling this text")
def in_context(att: LongAttention):
    """The long prompt's profile, each sentence read in its context, with its per-head frame and per-sentence
    measures, kept together as a corpus profile keeps them: a rerun reads them instead of labelling every
    head again."""
    bar = Bar(f"Profiling every head over {len(att.tokens):,} tokens", every=PROGRESS_EVERY)
    profile = profile_document(att, progress=lambda done, total: bar.show(done / total,
                                                                            f"Profiling… layer {done} of {total}"))
    bar.empty()
    return profile, profile.measures.frame(), {name: profile.measures.per_sentence(name) for name in RANKING_MEASURES}


def within_budget(model: AttentionModel, sentences: list[str]) -> list[str]:
    """The first sentences whose attention weights fit ``PROFILE_BYTES``, with a note when some are left out."""
    sizes = np.cumsum([n * n * model.bytes_per_token_pair for n in model.token_counts(sentences)])
    keep = max(1, int(np.searchsorted(sizes, PROFILE_BYTES, side="right")))
    if keep < len(sentences):
        note(f"Profiling the first {keep:,} of {len(sentences):,} sentences: their attention weights "
                   f"fill the {PROFILE_BYTES // 2**20} MiB a profile may hold.")
    return sentences[:keep]
