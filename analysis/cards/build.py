"""``head_card`` and ``atlas`` from Python: every part computed here with the function its page uses, and the
app's defaults (the same corpus, detector sentences, pairs, task and importance sample).

    model = load_model("smollm2", backend="scratch")
    parts = card_parts(model)                  # every head at once: about a minute for SmolLM2 on two cores
    card = head_card(model, 23, 3, parts=parts)
    card.summary(); atlas(parts)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pandas as pd

from models import DETECTOR, VOCABULARY, AttentionModel, HeadLensError, offers
from models.corpus import CORPUS, corpus_sample
from models.run import patching_stack

from ..defaults import DECODER_SAMPLE, FIRST_TASK, FIRST_TASK_PAIRS, Pair
from .atlas import atlas_frame, heads_like
from ..roles.detector import LENGTH, SENTENCES, SEQUENCES, detector_labels, head_detector
from ..effects import logit_attribution, own_readout, patch_heads, readout_for
from .card import CardParts, HeadCard, Peaks, Writes, card_from, corpus_peaks, corpus_writes
from ..explanations import explain_corpus, explain_heads
from ..pruning.importance import head_importance
from ..qk_attribution.pictures import qk_embedding, qk_vectors
from ..roles.measure import measure_heads
from ..tasks.effects import run_task, table
from ..tasks.build import make_task
from ..effects.vocabulary import copying_scores

TASK = (FIRST_TASK, FIRST_TASK_PAIRS)  # the defaults table's (``analysis.defaults``), as the page's
IMPORTANCE_SAMPLE = DECODER_SAMPLE
CARD = "A head's card reads its heads"


def is_patchable(model: AttentionModel) -> bool:
    """A model whose heads the from-scratch engine runs, patches and measures by its own readout (a decoder's next
    token, an encoder's sentence embedding or masked token, a classifier's label)."""
    if model.encoder_decoder:
        return False
    try:
        return patching_stack(model, CARD) is not None
    except HeadLensError:
        return False


class CardSource(Protocol):
    """Where each part of a card comes from: computed here (``Computed``), or the app's shared results
    (``app_pages.results.card``). ``assemble`` asks each for the same parts in the same way."""

    def profile(self) -> tuple[pd.DataFrame, list]: ...               # Head roles' frame, the corpus' attention
    def peaks(self, attentions: list) -> Peaks: ...
    def explanations(self, attentions: list) -> pd.DataFrame | None: ...  # explain_heads; None: not ready
    def importance(self) -> pd.DataFrame | None: ...                  # None: not measured
    def pictures(self) -> dict | None: ...                            # queries and keys, None: not drawn
    def offers(self) -> frozenset[str]: ...                            # ``models.offers``: which parts apply
    def patchable(self) -> bool: ...                                  # its pairs and task are read
    def writes(self) -> Writes: ...
    def detector(self) -> pd.DataFrame: ...
    def copying(self) -> pd.DataFrame | None: ...
    def pairs(self) -> dict[str, Pair]: ...
    def pair(self, pair: Pair) -> tuple[pd.DataFrame, pd.DataFrame]: ...  # attribution, every head patched
    def task(self) -> tuple[pd.DataFrame, str] | None: ...             # the task's table and name


def assemble(source: CardSource) -> CardParts:
    """Every head's card parts, each taken from ``source``: the one place a card is put together."""
    frame, attentions = source.profile()
    parts = CardParts(frame, attentions, source.peaks(attentions), windows=attentions[0].windows)
    parts.explanations = source.explanations(attentions)
    parts.importance, parts.qk = source.importance(), source.pictures()
    parts.offers = source.offers()
    if DETECTOR in parts.offers:
        try:
            parts.detector = source.detector()
        except HeadLensError as err:  # a tokenizer with too few whole words for its repeated sequences
            parts.detector_why = str(err)
    if VOCABULARY in parts.offers:
        parts.writes, parts.copying = source.writes(), source.copying()
    if not source.patchable():
        return parts
    for name, pair in source.pairs().items():
        try:
            found = source.pair(pair)
        except HeadLensError as err:  # a pair this model's tokenizer splits unevenly: left out, with why
            parts.left_out[name] = str(err)
            continue
        if found is not None:  # a source may leave out what it has not got yet
            parts.pairs[name] = found
    task = source.task()
    if task is not None:
        parts.task, parts.task_name = task
    return parts


@dataclass
class Computed:
    """Each part computed here, as its page computes it (``card_parts``)."""

    model: AttentionModel
    sentences: list[str]
    pairs_given: dict | None = None
    task_given: tuple[str, int] | None = TASK
    importance_too: bool = True
    progress: object = None
    paragraphs: bool = True  # explanations on the built-in paragraphs; False: on ``sentences``' halves

    def profile(self):
        attentions = self.model.attend(self.sentences, progress=self.progress)
        return measure_heads(attentions).frame(), attentions

    def peaks(self, attentions):
        return corpus_peaks(attentions)

    def explanations(self, attentions):
        return explain_heads(self.model) if self.paragraphs else explain_corpus(attentions)

    def offers(self) -> frozenset[str]:
        return offers(self.model)

    def patchable(self) -> bool:
        return is_patchable(self.model)

    def importance(self):
        if not (self.importance_too and VOCABULARY in self.offers()):  # by gradient on the next-token loss
            return None
        return head_importance(self.model, corpus_sample(IMPORTANCE_SAMPLE), method="gradient", ablation="zero",
                               measure="loss")

    def pictures(self):
        return None  # drawn for one head on request (``head_card(qk=True)``)

    def writes(self):
        return corpus_writes(self.model, self.sentences)

    def detector(self):
        detected = head_detector(self.model, sentences=corpus_sample(SENTENCES), n_sequences=SEQUENCES, length=LENGTH)
        return detected.assign(label=detector_labels(detected))

    def copying(self):
        return copying_scores(self.model)

    def pairs(self):
        if self.pairs_given is not None:
            return self.pairs_given
        return own_readout(self.model).builtin_pairs()

    def pair(self, pair):
        e = self.model
        linear = readout_for(e, pair.clean).not_linear is None  # else no direct parts: patching alone
        return (logit_attribution(e, pair.clean, pair.answer, pair.distractor) if linear else None,
                patch_heads(e, pair.clean, pair.corrupted, pair.answer, pair.distractor))

    def task(self):
        first = own_readout(self.model).first_task
        if self.task_given is None or first is None:
            return None
        name, n = self.task_given
        e = self.model
        if self.task_given == TASK:  # the model's own first task (an encoder's: the seed's objects changed)
            name = first[0]
        found = table(run_task(e, make_task(e, name, n), None, "attribution", residual=False))
        return found, first[1] if self.task_given == TASK else f"{name}, {n} pairs"


def card_parts(model: AttentionModel, *, sentences: Sequence[str] | None = None, pairs: dict | None = None,
               task: tuple[str, int] | None = TASK, importance: bool = True, progress=None) -> CardParts:
    """Every head's card parts, each as its page computes it (``assemble`` over ``Computed``): Head roles over
    ``sentences`` (the built-in corpus) and each head's explanation (fitted on alternate built-in paragraphs, scored
    on the others: ``analysis.explanations.explain_heads``; given ``sentences``, on alternate ones of those), and for
    a decoder the head detector, the OV copying scores, each of ``pairs`` (the built-in pairs) attributed and patched
    exactly, ``task`` (a generator's name and its pairs; None for none) by attribution patching, and
    (``importance``) each head's importance by gradient on Pruning's sample."""
    return assemble(Computed(model, list(CORPUS if sentences is None else sentences), pairs, task, importance,
                             progress, paragraphs=sentences is None))


def head_card(model: AttentionModel, layer: int, head: int, *, parts: CardParts | None = None,
              others: dict[str, pd.DataFrame] | None = None, qk: bool = False, **options) -> HeadCard:
    """``(layer, head)``'s card: its figures read from ``parts`` (``card_parts(model, **options)`` when not given),
    the heads like it in its model and in ``others`` (model name -> its ``atlas``), and (``qk``) its queries and
    keys picture over the corpus."""
    if not (0 <= layer < model.n_layers and 0 <= head < model.n_heads):
        raise HeadLensError(f"{model.name} has {model.n_layers} layers of {model.n_heads} heads; there is no "
                            f"layer {layer}, head {head}.")
    parts = parts or card_parts(model, **options)
    if qk and parts.qk is None:
        sentences = [a.text for a in parts.attentions]
        parts.qk = {(layer, head): qk_embedding(qk_vectors(model, sentences, layer, head))}
    card = card_from(parts, model.name, layer, head)
    card.like = heads_like(atlas_frame(parts), layer, head, others, model=model.name)
    return card


def atlas(parts: CardParts) -> pd.DataFrame:
    """Every head's row of measures (``analysis.cards.atlas.atlas_frame``)."""
    return atlas_frame(parts)
