"""Effects: which heads make a prediction, by direct logit attribution and activation patching."""
import streamlit as st

from analysis.effects import METHODS
from app_pages.ui.effects import effects, pick_pair
from app_pages.ui.effects_view import (EffectsView, copying_section, downloads, flow_section, grids, head_section,
                                       metrics, open_clicked, parts_and_residual, pick_head, positions_section)
from app_pages.ui.exports import exports
from app_pages.ui.models import DECODERS, model_for, twin
from app_pages.ui.settings import settings
from app_pages.ui.state import bound

ABOUT = ("Which heads make this prediction? Direct logit attribution splits the clean prompt's logit difference, "
         "logit(answer) − logit(distractor) at its last token, into what each head writes there, read through the "
         "final norm (its scale frozen at the model's own value) and the unembedding: the parts add up to the "
         "model's own difference. Activation patching runs the corrupted prompt with one head's output taken from the "
         "clean run and reports the share of the difference that comes back: 1 brings the clean answer back whole, "
         "0 changes nothing, below 0 pushes further away.")
SHORT = {"exact": "Exact patching", "attribution": "Attribution patching (a fast estimate)"}

s = settings()
st.title("Effects")
st.caption(ABOUT)
ref = twin(s.model) or s.model  # the same weights on our engine, which reads and patches each head
model = model_for(ref)
stack = getattr(model, "stack", None)
if stack is None or not stack.language_model:
    st.info(f"Effects are read through a language model's unembedding, and {s.model.title} has none: it is an "
            f"encoder. Choose a bundled decoder ({DECODERS}) in the sidebar, or a decoder you trained on the Train "
            "page.")
    st.stop()
pair = pick_pair(ref, model)
method = bound(st.segmented_control, "effects_method", "exact", init="default", options=list(METHODS), cast=str,
               label="Patching", format_func=SHORT.get, required=True,
               help="Exact: the corrupted prompt rerun once per head, all the heads of a layer at once, each copy "
                    "recomputing only the layers above it (about 3 s for SmolLM2's 270 heads on two cores). "
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
