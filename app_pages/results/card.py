"""A head's card and the atlas, gathered from the results the other pages share, and the ways to open a card.

The card computes nothing another page computes: its parts are those pages' shared results (the Head roles
profile and its explanations, the decoder detector, Effects' pairs, copying scores and task, Pruning's importance, Queries & keys'
pictures), asked with the arguments those pages open with, so the server's preparation has them ready. Its own
two measures, each head's strongest examples and what it writes, are declared here and prepared with them.
"""
from __future__ import annotations


from dataclasses import dataclass

import pandas as pd

from analysis.cards.atlas import atlas_frame
from analysis.cards.build import assemble, is_patchable
from analysis.effects import own_readout
from analysis.cards.card import CardParts, Peaks, Writes, corpus_peaks, corpus_writes
from analysis.roles.labels import telling_head
from analysis.tasks.effects import table
from models import DETECTOR, VOCABULARY
from models.corpus import CORPUS, corpus_sample

from .detector import detected
from .effects import cheap_copying, copying, effects
from .explanations import explained_for, explanations, paragraphs
from .models import ModelRef, cached_model, offers_of
from .profiles import corpus_profile
from .pruning import SAMPLE, first_measured, importance
from .qk import first_pictures, pictures
from .progress import Bar
from .shared import Warm, shared
from .tasks import first_task, task_effects


def _unmasked(ref: ModelRef) -> list[tuple]:
    return [(ref, False, ())]


@shared("peaks", entries=8, waiting="Finding each head's strongest examples", warm=Warm(1.5, _unmasked))
def peaks(ref: ModelRef, causal: bool, heads_off: tuple) -> Peaks:
    """Each head's most concentrated query in each sentence of the built-in corpus, read from its Head roles
    profile's attention."""
    _, _, attentions = corpus_profile(ref, causal, heads_off, list(CORPUS))
    return corpus_peaks(attentions)


@shared("writes", entries=8, waiting="Measuring what each head writes",
        warm=Warm(2.5, lambda ref: [(ref.analysed, False, ())]))
def writes(ref: ModelRef, causal: bool, heads_off: tuple) -> Writes:
    """A decoder's heads' largest output norm in each sentence of its profile (the from-scratch engine reads each head's output)."""
    _, _, attentions = corpus_profile(ref, causal, heads_off, list(CORPUS))
    bar = Bar(f"Reading what every head writes in {len(attentions)} sentences")
    found = corpus_writes(cached_model(ref.analysed), [a.text for a in attentions], progress=bar)
    bar.empty()
    return found


def telling(ref: ModelRef, causal: bool = False, heads_off: tuple = (), *, compute: bool = True):
    """``(layer, head, role)`` of the head a card of ``ref``'s model opens on (``analysis.roles.labels.telling_head``): a
    bundled decoder's strongest induction head from its detector, another model's strongest object head from its
    Head roles profile; None when none is labelled so, or (``compute`` False) while neither result is ready."""
    if DETECTOR in offers_of(ref):
        found = detected(ref) if compute else detected.peek(ref)
        return None if found is None else telling_head(None, found)
    args = (ref, causal, heads_off, list(CORPUS))
    found = corpus_profile(*args) if compute else corpus_profile.peek(*args)
    return None if found is None else telling_head(found[0])


def importance_args(ref: ModelRef) -> tuple:
    """The importance Pruning opens with on ``ref``'s model (on the from-scratch engine): a bundled decoder's by gradient on its
    sample, an encoder's by mean ablation on the corpus sample."""
    if VOCABULARY in offers_of(ref):  # by gradient on the next-token loss
        return first_measured(ref)[0]
    return (ref.analysed, "mean", corpus_sample(SAMPLE), "ablation")


@shared("task table", entries=8, copy=True, waiting="Averaging the task's pairs",
        warm=Warm(9.5, lambda ref: [(ref,)]))
def task_heads(ref: ModelRef) -> pd.DataFrame:
    """Each head's mean over Effects' first task, with its interval, p and q (``analysis.tasks.effects.table``):
    its bootstrap and sign flips take half a second, once."""
    return table(task_effects(*first_task(ref)[0]))


@shared("atlas", entries=8, copy=True, waiting="Gathering every head's measures", warm=Warm(20, lambda ref: [(ref,)]))
def atlas(ref: ModelRef) -> pd.DataFrame:
    """Every head's row of measures, read from the card's parts (``analysis.cards.atlas.atlas_frame``)."""
    return atlas_frame(card_parts(ref, importance_too=importance_first(ref), qk_too=False))


def importance_first(ref: ModelRef) -> bool:
    """Whether a card's first form waits for importance: a bundled language model's, by gradient, prepared."""
    return VOCABULARY in offers_of(ref)


def patchable(ref: ModelRef) -> bool:
    """A model the from-scratch engine patches (a bundled decoder, the default MiniLM on either engine, the untrained
    encoder, a custom model there): its card reads its pairs and task."""
    scratch = ref.editable()
    return scratch is not None and is_patchable(cached_model(scratch))


@dataclass
class FromPages:
    """A card's parts as the pages' shared results (``analysis.cards.build.CardSource``), computed here when no page or
    preparation has; ``importance_too``, ``qk_too``: False takes those only when already computed."""

    ref: ModelRef
    causal: bool = False
    heads_off: tuple = ()
    importance_too: bool = True
    qk_too: bool = True
    first: bool = False  # a first card: leave out what the server is preparing and has not got yet (``later``)

    def _ready(self, result, *args):
        """``result(*args)``; for a first card, None while the server prepares it."""
        return None if self.first and result.later(*args) else result(*args)

    def profile(self):
        frame, _, attentions = corpus_profile(self.ref, self.causal, self.heads_off, list(CORPUS))
        return frame, attentions

    def peaks(self, attentions):
        return peaks(self.ref, self.causal, self.heads_off)

    def explanations(self, attentions):
        args = (self.ref, self.causal, self.heads_off)
        return explanations(*(explained_for(*args)[0] if self.first else paragraphs(*args)))  # first: what is ready

    def importance(self):
        scratch = self.ref.editable()
        measured = None if scratch is None else importance_args(scratch)
        if measured is None or not (self.importance_too or importance.peek(*measured) is not None):
            return None
        found = self._ready(importance, *measured)
        return None if found is None else found.frame

    def pictures(self):
        scratch = self.ref.editable()
        drawn = None if scratch is None else first_pictures(scratch)[0]
        if drawn is None or not (self.qk_too or pictures.peek(*drawn) is not None):
            return None
        return pictures(*drawn).frames

    def offers(self) -> frozenset[str]:
        return offers_of(self.ref)

    def patchable(self) -> bool:
        return patchable(self.ref)

    def writes(self):
        return self._ready(writes, self.ref, self.causal, self.heads_off)

    def detector(self):
        return self._ready(detected, self.ref)

    def copying(self):
        scratch = self.ref.analysed
        return self._ready(copying, scratch) if cheap_copying(self.ref) else copying.peek(scratch)  # else on request

    def pairs(self):
        return own_readout(cached_model(self.ref.analysed)).builtin_pairs()

    def pair(self, pair):
        found = self._ready(effects, self.ref.analysed, pair, "exact")
        return None if found is None else (found.attribution, found.heads)

    def task(self):
        first = own_readout(cached_model(self.ref.analysed)).first_task
        if first is None:  # no built-in task fits the model's prediction (a classifier's)
            return None
        found = self._ready(task_heads, self.ref)
        return None if found is None else (found, first[1])


def card_parts(ref: ModelRef, causal: bool = False, heads_off: tuple = (), *, importance_too: bool = True,
               qk_too: bool = True, first: bool = False) -> CardParts:
    """Every head's card parts on ``ref``'s model, put together by ``analysis.cards.build.assemble`` (as a card from
    Python is) from the shared results its pages read; ``first``: without those the server is still preparing."""
    return assemble(FromPages(ref, causal, heads_off, importance_too, qk_too, first))

