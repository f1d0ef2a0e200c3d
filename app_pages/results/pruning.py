"""Head importance and pruning curves: computed once for every session, with a progress bar."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.pruning.ablation import Ablation, ablate
from analysis.defaults import DECODER_SAMPLE, ENCODER_SAMPLE, PRUNING_RANK
from analysis.pruning.importance import attention_proxies, head_importance
from analysis.pruning.curves import curve_work, full_run, prune_counts, pruning_curve, ranking_rows
from analysis.tasks.ablation import kept_curve, order_by_effect
from models import VOCABULARY
from models.corpus import corpus_sample

from .models import ModelRef, cached_model, offers_of
from .progress import Bar
from .shared import First, Warm, shared
from .tasks import TaskSpec, chosen, task_effects


SAMPLE = ENCODER_SAMPLE  # the defaults table's (``analysis.defaults``)


LLM_SAMPLE = DECODER_SAMPLE


@dataclass
class Importance:
    frame: pd.DataFrame          # head_importance
    means: np.ndarray | None     # each head's mean output, for mean ablation
    full: np.ndarray | float     # the full model's embeddings of the sentences, or its next-token loss


def first_measured(ref: ModelRef) -> list[tuple]:
    """What Pruning measures a bundled decoder on first: it on the from-scratch engine, by gradient, on the default sentences."""
    return [(ref.analysed, "zero", corpus_sample(LLM_SAMPLE), "gradient")]


FIRST_SENTENCES = 25  # the importance's first form, by ablation: each head measured on the first 25 sentences


def _first_sentences(ref: ModelRef, ablation: str, sentences: list[str], method: str = "ablation") -> tuple:
    """What a page shows first while an encoder's importance by ablation (one pass per head) is computed: the same
    on the first ``FIRST_SENTENCES`` sentences; a gradient's (one pass in all) has no first form."""
    return ref, ablation, sentences[:FIRST_SENTENCES] if method == "ablation" else sentences, method


@shared("importance", entries=12, waiting="Measuring every head", warm=Warm(3, first_measured),
        first=First(_first_sentences, lambda ref, ablation, sentences, method="ablation": (
            f"each head measured on the first {FIRST_SENTENCES} of the {len(sentences)} sentences")))
def importance(ref: ModelRef, ablation: str, sentences: list[str], method: str = "ablation") -> Importance:
    """Every head's importance on ``sentences`` (by ablation or gradient), with a progress bar while it runs."""
    model = cached_model(ref)
    measure = measure_of(ref)
    bar = Bar(f"Switching each of {model.n_layers * model.n_heads} heads off in turn, on {len(sentences)} sentences"
              if method == "ablation" else f"Differentiating the loss on {len(sentences)} sentences")
    means = model.head_means(sentences) if ablation == "mean" else None
    full = model.predictions(sentences)[0] if measure == "loss" else model.embed(sentences)
    frame = head_importance(model, sentences, method=method, ablation=ablation, head_means=means,
                            reference=full, measure=measure, progress=bar)
    bar.empty()
    _read_only(full, means)
    return Importance(frame, means, full)


def _read_only(*arrays) -> None:
    """A shared result's arrays, which every session reads, made read-only (a number or None is left as it is)."""
    for array in arrays:
        if isinstance(array, np.ndarray):
            array.flags.writeable = False


FIRST_STEP = 0.5  # the curves' first form: none, half and every head pruned


def _coarse(ref: ModelRef, ablation: str, sentences: list[str], method: str = "ablation"):
    return (*_first_sentences(ref, ablation, sentences, method), FIRST_STEP)  # the importance's first form's sentences


@shared("curves", entries=12, copy=True, waiting="Computing the pruning curves",
        warm=Warm(8, first_measured), first=First(_coarse, lambda ref, ablation, sentences, method="ablation": (
            "the curves at 3 sizes (none, half and every head pruned)" + (
                f", each head switched off on the first {FIRST_SENTENCES} sentences" if method == "ablation" else ""))))
def curves(ref: ModelRef, ablation: str, sentences: list[str], method: str = "ablation",
           step: float = 0.1) -> pd.DataFrame:
    """The pruning curves by importance (``importance(ref, ablation, sentences, method)``; the later steps re-rank
    on ``PRUNING_RANK`` of the sentences), at random (``SEEDS``) and by attention alone, ``step`` of the heads pruned
    at a time."""
    imp = importance(ref, ablation, sentences, method)
    model = cached_model(ref)
    proxies = proxy_table(ref, sentences)
    counts = prune_counts(model.n_layers * model.n_heads, step)
    n = len(sentences)
    runs = [("importance", 0), *(("random", seed) for seed in SEEDS), ("proxy", 0)]
    ranked = len(ranking_rows(n, PRUNING_RANK))
    works = [curve_work(model, n, counts, order, measure_of(ref), shared_full=True, n_ranked=ranked)
             for order, _ in runs]
    bar = Bar(f"Pruning {step:.0%} of the heads at a time, {len(runs)} ways, on {n} sentences")
    full = full_run(model, sentences, measure_of(ref))  # the unpruned model's run, shared by every curve
    # the page's importance is the curve's first step when measured the way the curve measures
    first_step = imp.frame if method == ("gradient" if measure_of(ref) == "loss" else "ablation") else None
    frames, measured = [], {}  # each pruned set's run, for the curves that reach it (every head, at the end)
    for i, (order, seed) in enumerate(runs):
        base = sum(works[:i])
        frames.append(pruning_curve(model, sentences, order=order, seed=seed, step=step, ablation=ablation,
                                    head_means=imp.means, proxies=proxies, measure=measure_of(ref), full=full,
                                    runs=measured, importance=first_step, rank_on=PRUNING_RANK,
                                    progress=lambda done, _, base=base: bar(base + done, sum(works))))
    bar.empty()
    return pd.concat(frames, ignore_index=True)


@shared("heads off", entries=16, waiting="Switching the heads off")
def switched_off(ref: ModelRef, sentences: list[str], measured_on: list[str], heads: list[tuple[int, int]],
                 ablation: str, method: str = "ablation") -> Ablation:
    """``heads`` switched off together on ``measured_on`` (``ablate``), a head's mean taken over ``sentences``, as
    ``importance(ref, ablation, sentences, method)`` took it: every session's view of the same heads shares it."""
    effect = ablate(cached_model(ref), measured_on, heads, ablation=ablation,
                    head_means=importance(ref, ablation, sentences, method).means)
    _read_only(effect.cosine, effect.attention_change, effect.sentence_losses)
    return effect


@shared("proxies", entries=12, copy=True, waiting="Measuring attention",
        warm=Warm(4, lambda ref: [(ref.analysed, corpus_sample(LLM_SAMPLE))]))
def proxy_table(ref: ModelRef, sentences: list[str]) -> pd.DataFrame:
    """Attention-only measures of each head on ``sentences`` (entropy, weight on special tokens)."""
    return attention_proxies(cached_model(ref).attend(sentences))


SEEDS = (0, 1, 2)


def measure_of(ref: ModelRef) -> str:
    """What a pruned model is judged by: a bundled model with a vocabulary by its next-token loss, the others by
    their embeddings."""
    return "loss" if VOCABULARY in offers_of(ref) else "embedding"


@shared("task curve", entries=8, waiting="Measuring the task with fewer heads")
def task_curve(ref: ModelRef, spec: TaskSpec, metric: str, method: str, normalise: str,
               correct_only: bool) -> pd.DataFrame:
    """The task's metric against the heads kept: by the task's mean effect, and by the Pruning page's importance."""
    model = cached_model(ref)
    effects = chosen(task_effects(ref, spec, metric, method), correct_only)
    imp = importance(*first_measured(ref)[0]).frame
    by_importance = [(int(r.layer), int(r.head)) for r in imp.sort_values("importance", ascending=False,
                                                                          kind="stable").itertuples()]
    bar = Bar("Measuring the task with fewer heads")
    frame = kept_curve(model, effects.task, {"by the task's mean effect": order_by_effect(effects, normalise),
                                             "by importance (the Pruning page's)": by_importance},
                       metric=metric, progress=bar)
    bar.empty()
    return frame
