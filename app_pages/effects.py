"""Effects: which heads make a prediction, by direct logit attribution and activation patching."""
import streamlit as st

from analysis.effects import METHODS
from app_pages.results.effects import effects
from app_pages.ui.effects import pick_pair
from app_pages.ui.effects_view import (EffectsView, copying_section, downloads, flow_section, grids, head_section,
                                       metrics, open_clicked, parts_and_residual, pick_head, positions_section)
from app_pages.results.tasks import chosen, task_effects
from app_pages.ui import task_view as over_task
from app_pages.ui.exports import exports
from app_pages.ui.models import decoder_or_stop
from app_pages.ui.settings import settings
from app_pages.ui.state import bound
from app_pages.ui.tasks import pick_task, task_or_stop

ABOUT = ("Which heads make this prediction? Direct logit attribution splits the clean prompt's logit difference, "
         "logit(answer) − logit(distractor) at its last token, into what each head writes there, read through the "
         "final norm (its scale frozen at the model's own value) and the unembedding: the parts add up to the "
         "model's own difference. Activation patching runs the corrupted prompt with one head's output taken from the "
         "clean run and reports the share of the difference that comes back: 1 brings the clean answer back whole, "
         "0 changes nothing, below 0 pushes further away.")
SHORT = {"exact": "Exact patching", "attribution": "Attribution patching (a fast estimate)"}
SCOPES = {"pair": "One prompt pair", "task": "A task of many pairs"}

s = settings()
st.title("Effects")
st.caption(ABOUT)
# the same weights on the from-scratch engine, which reads and patches each head
ref, model = decoder_or_stop(s.model, f"Effects are read through a language model's unembedding, and "
                                      f"{s.model.title} has none")
scope = bound(st.segmented_control, "effects_scope", "pair", init="default", options=list(SCOPES), cast=str,
              label="Explain", format_func=SCOPES.get, required=True,
              help="One prompt pair: exactly what each head does to one prediction. A task: the same averaged over many "
                   "pairs built from templates (or your CSV), with 95% intervals and p-values, as a claim about a head "
                   "needs.")
if scope == "task":
    choice = pick_task()
    task = task_or_stop(ref, choice.spec)
    over_task.problems(task)
    everyone = task_effects(ref, choice.spec, choice.metric, choice.method)
    view = over_task.TaskView(ref, model, choice, everyone, chosen(everyone, choice.correct_only))
    over_task.metrics(view)
    layer, head = over_task.pick_head(view)
    over_task.grids(view, (layer, head))
    over_task.residual_section(view)
    per_pair = over_task.head_section(view, layer, head)
    curve = over_task.curve_section(view)
    over_task.open_clicked(view)
    over_task.downloads(view, layer, head, per_pair, curve)
    for key, (name, fig, more) in view.figures.items():
        st.caption(name)
        exports(key, fig, None, sig=over_task.task_signature(choice) + more)
    st.stop()
pair = pick_pair(ref, model)
method = bound(st.segmented_control, "effects_method", "exact", init="default", options=list(METHODS), cast=str,
               label="Patching", format_func=SHORT.get, required=True,
               help="Exact: the corrupted prompt rerun once per head, all the heads of a layer at once, each copy "
                    "recomputing only the layers above it and the tokens after those both prompts share (about 2 s "
                    "for SmolLM2's 270 heads on two cores). "
                    "Attribution patching (Nanda 2023): one forward and one backward pass, a first-order estimate "
                    "of every patch.")
view = EffectsView(ref, model, pair, method, effects(ref, pair, method))
metrics(view)
layer, head = pick_head(view)
grids(view, (layer, head))
tokens = parts_and_residual(view)
head_section(view, s, layer, head)
copying_section(view, (layer, head))
edges = flow_section(view)
open_clicked(view)
positions_section(view, tokens)
downloads(view, layer, head, edges)
sig = f"{pair.clean}|{pair.corrupted}|{pair.answer}|{pair.distractor}|{method}"
for key, (name, fig, more) in view.figures.items():
    st.caption(name)
    exports(key, fig, None, sig=sig + more)
