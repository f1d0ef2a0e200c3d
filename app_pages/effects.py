"""Effects: which heads make a prediction, by direct logit attribution and activation patching."""
import streamlit as st

from app_pages.ui.effects_view import show
from app_pages.ui.models import model_for
from app_pages.ui.page import start

ABOUT = ("Which heads make this prediction? Direct logit attribution splits the clean prompt's logit difference, "
         "logit(answer) − logit(distractor) at its last token, into what each head writes there, read through the "
         "final norm (its scale frozen at the model's own value) and the unembedding: the parts add up to the "
         "model's own difference. Activation patching runs the corrupted prompt with one head's output taken from the "
         "clean run and reports the share of the difference that comes back: 1 brings the clean answer back whole, "
         "0 changes nothing, below 0 pushes further away. On an encoder the difference is its sentence embedding's "
         "(the mean over the tokens) cosine with an answer text less that with a distractor text, and each part "
         "passes the LayerNorms above it with their scales frozen at the prompt's own values.")
s, ref = start("effects")
st.caption(ABOUT)
model = model_for(ref)
show(s, ref, model)
