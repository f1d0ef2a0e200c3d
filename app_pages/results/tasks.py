"""Effects over a task: the task a page runs, picked from its widgets (kept in the URL), and what it computes on
it, once for every session."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass


from analysis.defaults import FIRST_TASK_PAIRS
from analysis.effects import own_readout
from analysis.tasks.effects import TaskEffects, run_task
from analysis.tasks.build import Task, from_csv, make_task
from models import HeadLensError

from .messages import stop_with
from .models import ModelRef, cached_model
from .progress import Bar
from .shared import Warm, shared


@dataclass(frozen=True)
class TaskSpec:
    """What a task is made from: a generator's name, its size, seed and corruption, or a CSV file's bytes."""

    source: str
    pairs: int
    seed: int = 0
    corruption: str = "s2"
    csv: bytes = b""

    @property
    def cache_key(self) -> tuple:
        return ("task", self.source, self.pairs, self.seed, self.corruption, hashlib.sha256(self.csv).hexdigest())


def first_spec(model) -> TaskSpec | None:
    """The task a page opens with on ``model`` (its readout's: ``analysis.defaults``' first task, or an encoder's),
    50 pairs; None where no built-in task fits (a classifier's)."""
    first = own_readout(model).first_task
    return None if first is None else TaskSpec(first[0], FIRST_TASK_PAIRS)


@shared("task", entries=16, waiting="Building the task's pairs")
def built_task(ref: ModelRef, spec: TaskSpec) -> Task:
    """The task's pairs for ``ref``'s tokenizer."""
    model = cached_model(ref)
    if spec.source == "csv":
        return from_csv(model, spec.csv)
    options = {"corruption": spec.corruption} if spec.source == "ioi" else {}
    return make_task(model, spec.source, n=spec.pairs, seed=spec.seed, **options)


def first_task(ref: ModelRef) -> list[tuple]:
    """What Effects over a task shows first: indirect object, 50 pairs, by attribution patching, on the from-scratch
    engine (an encoder's: the seed's objects changed, its embedding difference); none where the model's readout has
    no built-in task (a classifier's)."""
    model = cached_model(ref.analysed)
    spec = first_spec(model)
    return [] if spec is None else [(ref.analysed, spec, own_readout(model).metric, "attribution")]


@shared("task effects", entries=8, waiting="Running the task's pairs", warm=Warm(9, first_task))
def task_effects(ref: ModelRef, spec: TaskSpec, metric: str, method: str) -> TaskEffects:
    """Every pair of the task traced, attributed and patched, in batches, with a progress bar."""
    model, task = cached_model(ref), built_task(ref, spec)
    bar = Bar(f"Running {len(task)} pairs: {METHOD_LABELS[method].lower()} patching")
    effects = run_task(model, task, metric, method, progress=bar)
    bar.empty()
    return effects


METHOD_LABELS = {"attribution": "Attribution", "exact": "Exact"}


def chosen(effects: TaskEffects, correct_only: bool) -> TaskEffects:
    """The effects over every pair, or over those the model gets right; a sentence where fewer than two are left."""
    if correct_only:
        right = int(effects.correct.sum())
        if right < 2:
            stop_with(HeadLensError(f"The model gets {right} of these pairs right, and an average with an interval "
                                    "needs two; switch off “Only the pairs the model gets right”, or run more pairs."))
        return effects.only(effects.correct)
    if len(effects.task) < 2:
        stop_with(HeadLensError("An average with an interval needs at least two pairs; this task has one. Add rows "
                                "to the file."))
    return effects
