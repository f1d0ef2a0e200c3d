"""The Effects page's one view, in a pair mode (``effects_pair``) and a task mode (``effects_task``): the same
sections in the same order (what the prompts give, the head picked, the grids, what the mode shows of that head,
downloads), a click on a head selecting it in both (``card_links.click_picks_head``), and each figure's export."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from analysis.effects import METHODS
from models import VOCABULARY, AttentionModel, head_label, offers

from ..results.effects import effects
from ..results.models import ModelRef
from ..results.tasks import chosen, task_effects
from . import effects_pair as pair_mode
from . import effects_task as task_mode
from .card_links import click_picks_head
from .effects import pick_pair
from .exports import exports
from .settings import Settings
from .state import bound, choose_head
from .tasks import pick_task, task_or_stop

SCOPES = {"pair": "One prompt pair", "task": "A task of many pairs"}
SHORT = {"exact": "Exact patching", "attribution": "Attribution patching (a fast estimate)"}


@dataclass
class Mode:
    """What a mode gives the view: its results' view (``figures``, ``events``), the picker a clicked head goes to,
    what its exports are signed with, and its sections."""

    module: object                         # effects_pair or effects_task: metrics, head_note, PICK_HELP, grids
    view: object
    picker: str
    signature: str
    sections: Callable[[int, int], object]            # (layer, head) -> what the downloads need
    downloads: Callable[[int, int, object], None]     # (layer, head, what the sections gave)


def show(s: Settings, ref: ModelRef, model: AttentionModel) -> None:
    """The page below its caption: the scope picked, then its mode's sections."""
    scope = bound(st.segmented_control, "effects_scope", "pair", init="default", options=list(SCOPES), cast=str,
                  label="Explain", format_func=SCOPES.get, required=True,
                  help="One prompt pair: exactly what each head does to one prediction. A task: the same averaged over "
                       "many pairs built from templates (or your CSV), with 95% intervals and p-values, as a claim "
                       "about a head needs.")
    mode = _task(ref, model) if scope == "task" else _pair(s, ref, model)
    v = mode.view
    mode.module.metrics(v)
    picks = list(zip(v.ranked["layer"].tolist(), v.ranked["head"].tolist()))
    layer, head = choose_head(mode.picker, picks, help=mode.module.PICK_HELP,
                              format_func=lambda h: f"{head_label(*h)} · {mode.module.head_note(v, h)}")
    mode.module.grids(v, (layer, head))
    given = mode.sections(layer, head)
    for key, event in v.events:
        click_picks_head(event, key, v.figures[key][1], model.n_heads, picker=mode.picker)
    mode.downloads(layer, head, given)
    for key, (name, fig, more) in v.figures.items():
        st.caption(name)
        exports(key, fig, None, sig=mode.signature + more)


def _pair(s: Settings, ref: ModelRef, model: AttentionModel) -> Mode:
    pair = pick_pair(ref, model)
    method = bound(st.segmented_control, "effects_method", "exact", init="default", options=list(METHODS), cast=str,
                   label="Patching", format_func=SHORT.get, required=True,
                   help="Exact: the corrupted prompt rerun once per head, all the heads of a layer at once, each copy "
                        "recomputing only the layers above it and the tokens after those both prompts share (about "
                        "2 s for SmolLM2's 270 heads on two cores). Attribution patching (Nanda 2023): one forward "
                        "and one backward pass, a first-order estimate of every patch.")
    v = pair_mode.EffectsView(ref, model, pair, method, effects(ref, pair, method))

    def sections(layer: int, head: int):
        tokens = pair_mode.parts_and_residual(v)
        pair_mode.head_section(v, s, layer, head)
        edges = None
        if VOCABULARY in offers(model):  # through the unembedding, and a pre-norm stream's updates
            pair_mode.copying_section(v, (layer, head))
            edges = pair_mode.flow_section(v)
        pair_mode.positions_section(v, tokens)
        return edges

    return Mode(pair_mode, v, "effects_head", f"{pair.clean}|{pair.corrupted}|{pair.answer}|{pair.distractor}|{method}",
                sections, lambda layer, head, edges: pair_mode.downloads(v, layer, head, edges))


def _task(ref: ModelRef, model: AttentionModel) -> Mode:
    choice = pick_task(model)
    task_mode.problems(task_or_stop(ref, choice.spec))
    everyone = task_effects(ref, choice.spec, choice.metric, choice.method)
    v = task_mode.TaskView(ref, model, choice, everyone, chosen(everyone, choice.correct_only))

    def sections(layer: int, head: int):
        task_mode.residual_section(v)
        return task_mode.head_section(v, layer, head), task_mode.curve_section(v)

    return Mode(task_mode, v, "task_head", task_mode.task_signature(choice), sections,
                lambda layer, head, given: task_mode.downloads(v, layer, head, *given))
