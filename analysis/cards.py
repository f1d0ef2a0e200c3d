"""``head_card`` and ``atlas`` from Python: every part computed here with the function its page uses, and the
app's defaults (the same corpus, detector sentences, pairs, task and importance sample).

    model = load_model("smollm2", backend="scratch")
    parts = card_parts(model)                  # every head at once: about a minute for SmolLM2 on two cores
    card = head_card(model, 23, 3, parts=parts)
    card.summary(); atlas(parts)
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from models import AttentionModel, HeadLensError
from models.corpus import CORPUS, corpus_sample

from .defaults import DECODER_SAMPLE, FIRST_TASK, FIRST_TASK_PAIRS
from .atlas import atlas_frame, heads_like
from .detector import LENGTH, SENTENCES, SEQUENCES, detector_labels, head_detector
from .defaults import PAIRS
from .effects import logit_attribution, patch_heads
from .head_card import CardParts, HeadCard, card_from, corpus_peaks, corpus_writes
from .importance import head_importance
from .qk import qk_embedding, qk_vectors
from .roles import measure_heads
from .task_effects import run_task, table
from .tasks import make_task
from .vocabulary import copying_scores

TASK = (FIRST_TASK, FIRST_TASK_PAIRS)  # the defaults table's (``analysis.defaults``), as the page's
IMPORTANCE_SAMPLE = DECODER_SAMPLE
CARD = "A head's card reads its heads"


def is_decoder(model: AttentionModel) -> bool:
    """A language model whose heads the from-scratch engine reads (an encoder is not loaded there to say no)."""
    if not model.causal:
        return False
    try:
        return model.scratch(CARD, language=True) is not None
    except HeadLensError:
        return False


def card_parts(model: AttentionModel, *, sentences: Sequence[str] | None = None, pairs: dict | None = None,
               task: tuple[str, int] | None = TASK, importance: bool = True, progress=None) -> CardParts:
    """Every head's card parts, each as its page computes it: Head roles over ``sentences`` (the built-in corpus),
    and for a decoder the head detector, the OV copying scores, each of ``pairs`` (the built-in pairs) attributed
    and patched exactly, ``task`` (a generator's name and its pairs; None for none) by attribution patching, and
    (``importance``) each head's importance by gradient on Pruning's sample."""
    sentences = list(CORPUS if sentences is None else sentences)
    attentions = model.attend(sentences, progress=progress)
    parts = CardParts(measure_heads(attentions).frame(), attentions, corpus_peaks(attentions),
                      windows=attentions[0].windows)
    if not is_decoder(model):
        return parts
    engine = model.scratch(CARD)
    parts.writes = corpus_writes(engine, sentences)
    detected = head_detector(model, sentences=corpus_sample(SENTENCES), n_sequences=SEQUENCES, length=LENGTH)
    parts.detector = detected.assign(label=detector_labels(detected))
    parts.copying = copying_scores(engine)
    for name, pair in (PAIRS if pairs is None else pairs).items():
        parts.pairs[name] = (logit_attribution(engine, pair.clean, pair.answer, pair.distractor),
                             patch_heads(engine, pair.clean, pair.corrupted, pair.answer, pair.distractor))
    if task is not None:
        name, n = task
        parts.task = table(run_task(engine, make_task(engine, name, n), "logit_diff", "attribution", residual=False))
        parts.task_name = f"{name}, {n} pairs"
    if importance:
        parts.importance = head_importance(engine, corpus_sample(IMPORTANCE_SAMPLE), method="gradient",
                                           ablation="zero", measure="loss")
    return parts


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
        parts.qk = {(layer, head): qk_embedding(qk_vectors(model.scratch(CARD), sentences, layer, head))}
    card = card_from(parts, model.name, layer, head)
    card.like = heads_like(atlas_frame(parts), layer, head, others, model=model.name)
    return card


def atlas(parts: CardParts) -> pd.DataFrame:
    """Every head's row of measures (``analysis.atlas.atlas_frame``)."""
    return atlas_frame(parts)
