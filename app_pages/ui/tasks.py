"""Effects over a task: the task a page runs, picked from its widgets (kept in the URL), and what it computes on
it, once for every session."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from analysis.stats import interval
from analysis.effects import readouts
from analysis.tasks.effects import METRICS, NORMALISE, TaskEffects
from analysis.tasks.build import CORRUPTIONS, PAGE_ROWS, Task, built_in
from models import HeadLensError

from ..results.messages import stop_with
from ..results.models import ModelRef
from ..results.tasks import METHOD_LABELS, TaskSpec, built_task
from .state import bound, flag

CSV = {"csv": "Your pairs (a CSV file)"}
SHORT_METRICS = {m: what.split(":")[0].capitalize() for m, what in METRICS.items()}  # "Logit difference"
PAIR_COUNTS = [10, 20, 50, 100, 200, 500, 1000]


@dataclass(frozen=True)
class TaskChoice:
    spec: TaskSpec
    metric: str
    method: str
    normalise: str
    correct_only: bool


def pick_task(model, patching: bool = True) -> TaskChoice:
    """The task, metric, method and averaging from the page's widgets (``patching`` False: the task and metric
    alone, the method and averaging left at their defaults): ``model``'s tasks (an encoder's or a language
    model's) and the metrics its readouts read."""
    offered = readouts(model)
    own = offered[-1]  # the readout of the model's own prediction, whose built-in tasks are offered
    cols = st.columns([2, 1, 1])
    sources = {**built_in(own), **CSV}
    source = bound(cols[0].selectbox, "task", next(iter(sources)), init="index", options=list(sources), cast=str,
                   label="Task", format_func=sources.get, help=own.tasks_help)
    csv = b""
    if source == "csv":
        upload = st.file_uploader("Pairs · CSV with the columns clean, corrupted, answer, distractor", type=["csv"],
                                  key="task_csv")
        st.download_button("A CSV to start from", own.csv_example, "headlens-task-template.csv", "text/csv",
                           key="task-template", on_click="ignore")
        if upload is None:
            st.info("Upload a CSV of prompt pairs: a header row, then one pair a row. Each prompt pair needs the same "
                    "number of tokens; " + own.csv_note)
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
    # a CSV's pairs may take any readout the model offers (a masked-LM encoder's: at a [MASK]); a built-in task its own
    metrics = [m for r in (offered[::-1] if source == "csv" else offered[-1:]) for m in r.metrics
               if m != "greater_than" or source == "greater_than"]
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


def task_or_stop(ref: ModelRef, spec: TaskSpec) -> Task:
    try:
        return built_task(ref, spec)
    except HeadLensError as err:
        stop_with(err)


def role_attention_summary(effects: TaskEffects, layer: int, head: int):
    """The head's mean attention from the last token (an encoder's: every token) to each role, with 95% bootstrap
    intervals."""
    values = effects.role_attention[:, layer, head, :].astype(np.float64)
    if len(values) < 2:
        return values.mean(0), values.mean(0), values.mean(0)
    low, high = interval(values)
    return values.mean(0), low, high
