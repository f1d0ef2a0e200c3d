"""Circuits: the task, method and edges a page runs (kept in the URL), and what it computes on them once for every
session: every edge's score, the faithfulness curve, one circuit's faithfulness, the heads' attention between roles."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from analysis import circuits as AC
from analysis.effects import readouts
from analysis.circuits import EdgeScores
from models import HeadLensError

from ..results.circuits import KINDS, circuit_scores
from ..results.messages import stop_with
from ..results.models import ModelRef
from ..results.tasks import TaskSpec
from .state import bound
from .tasks import pick_task

METHODS = {"eap_ig": "EAP-IG", "eap": "EAP"}
DRAWN = [5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500]   # circuit sizes the page draws
DEFAULT_EDGES = 100


@dataclass(frozen=True)
class CircuitChoice:
    spec: TaskSpec
    metric: str
    method: str
    steps: int
    kinds: tuple[str, ...]

    @property
    def args(self) -> tuple:
        return self.spec, self.metric, self.method, self.steps


def pick_circuit(model) -> CircuitChoice:
    """The task and metric (Effects' widgets, ``model``'s), the method, its steps and the kinds of edge from the
    page's widgets."""
    choice = pick_task(model, patching=False)
    cols = st.columns(3)
    method = bound(cols[0].segmented_control, "circuit_method", "eap_ig", init="default", options=list(METHODS),
                   cast=str, label="Edge scores", format_func=METHODS.get, required=True,
                   help="EAP (Syed et al. 2023): each edge's sender output, clean less corrupted, times the gradient of "
                        "the metric by its receiver's input at the clean prompt; one forward and one backward pass a "
                        "batch. EAP-IG (Hanna et al. 2024): the gradient averaged along the way from the corrupted "
                        "input to the clean one, which sees an attention that the clean prompt has settled (its "
                        "gradient near zero); a forward and a backward pass per step.")
    steps = 1
    if method == "eap_ig":
        steps = bound(cols[1].number_input, "circuit_steps", AC.STEPS, cast=int, label="Steps", min_value=1,
                      max_value=50, step=1, help="Points along the way from the corrupted input to the clean one.")
    output = readouts(model)[-1].output  # what the model's last node is: its logits, an encoder's embedding, classes
    named = {**KINDS, "logits": f"the {output}"} if output != "logits" else KINDS
    kinds = bound(st.pills, "circuit_kinds", list(KINDS), multi=True, init="default", options=list(KINDS),
                  cast=str, label="Edges into", format_func=named.get, selection_mode="multi",
                  help="The circuit's edges are the top ones among those entering these inputs.")
    if not kinds:
        st.info("Choose at least one kind of edge to build circuits from.")
        st.stop()
    return CircuitChoice(choice.spec, choice.metric, method, int(steps), tuple(k for k in KINDS if k in kinds))


def scores_or_stop(ref: ModelRef, c: CircuitChoice) -> EdgeScores:
    try:
        return circuit_scores(ref, *c.args)
    except HeadLensError as err:
        stop_with(err)


def pick_edges(curve: AC.Curve) -> int:
    """The circuit's size (kept in the URL): the smallest reaching the target when the page draws it, else 100."""
    smallest = curve.smallest()
    default = smallest if smallest in DRAWN else DEFAULT_EDGES
    return bound(st.select_slider, "circuit_edges", default, options=DRAWN, cast=int, label="Edges in the circuit",
                 help="The circuit drawn: the edges of largest |score| among the kinds chosen.")


def graph_json(scores: EdgeScores, n: int, kinds, faithfulness: float, low: float, high: float) -> str:
    """The circuit as JSON: its nodes, its edges with their scores, and how faithful it is."""
    frame = scores.frame(n, list(kinds))
    g = scores.graph
    nodes = sorted({(g.sender_name(s), *g.senders[s]) for s in frame.sender_index}
                   | {(g.receiver_node_name(r), *g.receiver_node(r)) for r in frame.receiver_index})
    return json.dumps({
        "task": scores.task.title, "pairs": len(scores.task), "metric": scores.metric, "method": scores.method,
        "steps": scores.steps, "faithfulness": faithfulness, "interval": [low, high],
        "nodes": [{"name": name, "kind": kind, "layer": layer, "index": index} for name, kind, layer, index in nodes],
        "edges": [{"sender": r.sender, "receiver": r.receiver, "kind": r.kind, "score": float(r.score),
                   "share": float(r.share)} for r in frame.itertuples()]}, indent=1)


def heads_above(scores: EdgeScores, layer: int) -> list[tuple[int, int]]:
    """The heads in layers above ``layer``."""
    return [(l, h) for kind, l, h in scores.graph.senders if kind == "head" and l > layer]


def comparison(heads: pd.DataFrame) -> pd.DataFrame:
    """Per class of Wang et al., the heads of this circuit in it beside GPT-2 small's."""
    from analysis.circuits import WANG

    return pd.DataFrame([{"class": name, "this circuit": ", ".join(heads[heads["class"] == name]["head"]) or "—",
                          "GPT-2 small (Wang et al. 2022)": wang} for name, wang in WANG.items()])
