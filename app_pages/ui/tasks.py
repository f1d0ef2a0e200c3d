"""Effects over a task: the task a page runs, picked from its widgets (kept in the URL), and what it computes on
it, once for every session."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from analysis.significance import interval
from analysis.task_ablation import kept_curve, order_by_effect
from analysis.task_effects import METRICS, NORMALISE, TaskEffects, run_task
from analysis.tasks import CORRUPTIONS, PAGE_ROWS, TASKS, Task, from_csv, make_task
from models import HeadLensError

from .messages import stop_with
from .models import ModelRef, cached_model
from .pruning import first_measured, importance
from .shared import Bar, Warm, shared
from .state import bound, flag

SOURCES = {**TASKS, "csv": "Your pairs (a CSV file)"}
SHORT_METRICS = {"logit_diff": "Logit difference", "prob_diff": "Probability difference",
                 "greater_than": "Greater-than mass"}
METHOD_LABELS = {"attribution": "Attribution", "exact": "Exact"}
PAIR_COUNTS = [10, 20, 50, 100, 200, 500, 1000]
TEMPLATE_CSV = ("clean,corrupted,answer,distractor\n"
                "\"When Mary and John went to the store, John gave a drink to\","
                "\"When Mary and John went to the store, Mary gave a drink to\", Mary, John\n"
                "The Eiffel Tower is located in the city of,The Colosseum is located in the city of, Paris, Rome\n")


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


FIRST = TaskSpec("ioi", 50)  # the task the page opens with


@dataclass(frozen=True)
class TaskChoice:
    spec: TaskSpec
    metric: str
    method: str
    normalise: str
    correct_only: bool


def pick_task(patching: bool = True) -> TaskChoice:
    """The task, metric, method and averaging from the page's widgets (``patching`` False: the task and metric
    alone, the method and averaging left at their defaults)."""
    cols = st.columns([2, 1, 1])
    source = bound(cols[0].selectbox, "task", "ioi", init="index", options=list(SOURCES), cast=str, label="Task",
                   format_func=SOURCES.get,
                   help="Indirect object: 17 templates in both name orders (Wang et al. 2022). Facts: a landmark's "
                        "city, a capital, a language. Greater-than: \"The war lasted from the year 1729 to the year "
                        "17\" (Hanna et al. 2023). Induction: random words repeated. Or a CSV of your own pairs.")
    csv = b""
    if source == "csv":
        upload = st.file_uploader("Pairs · CSV with the columns clean, corrupted, answer, distractor", type=["csv"],
                                  key="task_csv")
        st.download_button("A CSV to start from", TEMPLATE_CSV, "headlens-task-template.csv", "text/csv",
                           key="task-template", on_click="ignore")
        if upload is None:
            st.info("Upload a CSV of prompt pairs: a header row, then one pair a row. Each prompt pair needs the same "
                    "number of tokens; the answer and the distractor are one token each (with their leading space).")
            st.stop()
        csv = upload.getvalue()
        pairs, seed, corruption = PAGE_ROWS, 0, "s2"
    else:
        pairs = bound(cols[1].select_slider, "task_pairs", 50, options=PAIR_COUNTS, cast=int, label="Pairs",
                      help="Drawn from the task's templates and words, the same ones for the same seed.")
        seed = bound(cols[2].number_input, "task_seed", 0, cast=int, label="Seed", min_value=0, max_value=10_000,
                     step=1)
        corruption = "s2"
        if source == "ioi":
            corruption = bound(st.segmented_control, "task_corruption", "s2", init="default",
                               options=list(CORRUPTIONS), cast=str, label="Corrupted by",
                               format_func=lambda c: CORRUPTIONS[c][0].upper() + CORRUPTIONS[c][1:], required=True)
    metrics = [m for m in METRICS if m != "greater_than" or source == "greater_than"]
    cols = st.columns(3)
    metric = bound(cols[0].selectbox, "task_metric", metrics[-1] if source == "greater_than" else metrics[0],
                   init="index", options=metrics, cast=str, label="Metric", format_func=SHORT_METRICS.get,
                   help="; ".join(f"{SHORT_METRICS[m]}: {METRICS[m].split(': ', 1)[1]}" for m in metrics) + ".")
    if not patching:
        return TaskChoice(TaskSpec(source, pairs, seed, corruption, csv), metric, "attribution", "set", False)
    method = bound(cols[1].segmented_control, "task_method", "attribution", init="default",
                   options=list(METHOD_LABELS), cast=str, label="Patching", format_func=METHOD_LABELS.get,
                   required=True, help="Attribution patching: one forward and one backward pass a batch of pairs, a "
                                       "first-order estimate (about 20 s for 100 SmolLM2 pairs on two cores). Exact: "
                                       "every head patched in every pair (about 1.5 s a pair), and the residual "
                                       "stream at each role's token.")
    normalise = bound(cols[2].segmented_control, "task_normalise", "set", init="default", options=list(NORMALISE),
                      cast=str, label="Recovered share", format_func={"set": "Over the set", "pair": "Per pair"}.get,
                      required=True,
                      help=f"Over the set: {NORMALISE['set'].split(': ')[1]} (robust when one pair's span is near "
                           f"zero). Per pair: {NORMALISE['pair'].split(': ')[1]}.")
    correct_only = bound(st.toggle, "task_correct", False, cast=flag, label="Only the pairs the model gets right",
                         help="Leave out the pairs whose clean prompt does not favour the answer (metric at or "
                              "below zero).")
    return TaskChoice(TaskSpec(source, pairs, seed, corruption, csv), metric, method, normalise, correct_only)


@shared("task", entries=16, waiting="Building the task's pairs")
def built_task(ref: ModelRef, spec: TaskSpec) -> Task:
    """The task's pairs for ``ref``'s tokenizer."""
    model = cached_model(ref)
    if spec.source == "csv":
        return from_csv(model, spec.csv)
    options = {"corruption": spec.corruption} if spec.source == "ioi" else {}
    return make_task(model, spec.source, n=spec.pairs, seed=spec.seed, **options)


def task_or_stop(ref: ModelRef, spec: TaskSpec) -> Task:
    try:
        return built_task(ref, spec)
    except HeadLensError as err:
        stop_with(err)


def first_task(ref: ModelRef) -> list[tuple]:
    """What Effects over a task shows first: indirect object, 50 pairs, by attribution patching, on the from-scratch engine."""
    return [(ref.scratch(), FIRST, "logit_diff", "attribution")]


@shared("task effects", entries=8, waiting="Running the task's pairs", warm=Warm(9, first_task))
def task_effects(ref: ModelRef, spec: TaskSpec, metric: str, method: str) -> TaskEffects:
    """Every pair of the task traced, attributed and patched, in batches, with a progress bar."""
    model, task = cached_model(ref), built_task(ref, spec)
    bar = Bar(f"Running {len(task)} pairs: {METHOD_LABELS[method].lower()} patching")
    effects = run_task(model, task, metric, method, progress=bar)
    bar.empty()
    return effects


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


def role_attention_summary(effects: TaskEffects, layer: int, head: int):
    """The head's mean attention from the last token to each role, with 95% bootstrap intervals."""
    values = effects.role_attention[:, layer, head, :].astype(np.float64)
    if len(values) < 2:
        return values.mean(0), values.mean(0), values.mean(0)
    low, high = interval(values)
    return values.mean(0), low, high
