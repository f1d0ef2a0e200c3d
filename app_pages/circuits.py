"""Circuits: the edges between heads that carry a task, scored over its pairs, run as a circuit and checked."""
from dataclasses import replace

import streamlit as st

from analysis import circuits as AC
from app_pages.results.circuits import circuit_at, circuit_curve
from app_pages.results.models import cached_model
from app_pages.ui import circuit_view as view
from app_pages.ui import compiled
from app_pages.ui.circuits import pick_circuit, pick_edges, scores_or_stop
from app_pages.ui.effects_task import problems
from app_pages.ui.page import start
from app_pages.ui.tasks import task_or_stop
from app_pages.ui.why import circuit_why

ABOUT = ("Patching says which heads matter; a circuit says how they connect. Every node that writes into the "
         "residual stream (the input, each head, each MLP) reaches every later node's input (a head's query, its "
         "key and value heads, an MLP, the logits) by an edge. Each edge is scored over a task's pairs by how much "
         "the metric falls when it carries the corrupted prompt's output (EAP, or EAP-IG along the way from the "
         "corrupted input); the top edges are then run as a circuit, every other edge corrupted, and its metric "
         "set against the whole model's: its faithfulness.")

s, ref = start("circuits")
st.caption(ABOUT)
choice = pick_circuit(cached_model(ref))
# on a cold server, the first form (EAP over a few pairs) while the preparation computes this choice's
_, spec, metric, method, steps, kinds, *sizes = circuit_curve.now(ref, *choice.args, choice.kinds)
shown = replace(choice, spec=spec, metric=metric, method=method, steps=steps)
task = task_or_stop(ref, shown.spec)
problems(task)
scores = scores_or_stop(ref, shown)
span = scores.clean - scores.corrupted
cols = st.columns(4)
cols[0].metric("Pairs", f"{len(task):,}")
cols[1].metric("Edges", f"{scores.graph.n_edges:,}", help=f"{len(scores.graph.senders)} senders, "
               f"{len(scores.graph.receivers)} receivers")
cols[2].metric("Clean − corrupted", f"{span.mean():+.2f}", help="The task metric's mean span: what a circuit "
               "is asked to recover.")
cols[3].metric("Model right", f"{(scores.clean > 0).mean():.0%}", help="The pairs whose clean prompt favours the "
               "answer (metric above zero).")
curve = circuit_curve(ref, *shown.args, kinds, *sizes)
n = pick_edges(curve)
faith = circuit_at(ref, *shown.args, kinds, n, *sizes)
figures = {"circuit-graph": ("The circuit", view.graph_section(ref, shown, scores, n, faith)),
           "circuit-curve": ("The faithfulness curve", view.curve_section(curve, n))}
view.heads_section(ref, shown, scores, n)
if ref.program is not None:
    compiled.truth_section(ref, scores, n, list(kinds))
circuit_why(ref, shown.spec, task, scores.frame(n, list(kinds)), scores.graph)
view.path_section(ref, shown, scores)
view.downloads(scores, shown, n, faith, curve, figures)
smallest = curve.smallest()
st.caption(f"{scores.method.upper().replace('_', '-')} over {len(task)} pairs; "
           + (f"{smallest:,} edges reach {AC.TARGET:.0%} faithfulness." if smallest else
              f"no circuit of the sizes tried reaches {AC.TARGET:.0%}."))
