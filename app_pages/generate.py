"""Generate: a decoder continues a sentence, token by token; then every page shows prompt and continuation."""
import streamlit as st

from app_pages.results.messages import stop_with
from app_pages.results.models import cached_model
from app_pages.ui.attention import attention
from app_pages.ui.exports import chart
from app_pages.ui.generation import continuations, generated_from
from app_pages.ui.page import start
from app_pages.ui.pickers import pick_layer, pick_sentence, title_for
from app_pages.ui.state import choose
from app_pages.ui.views import view
from models import HeadLensError
from viz import text_shading

s, scratch = start("generate")
if not hasattr(cached_model(scratch), "generate"):  # a custom model on the transformers engine
    st.info("Generation runs on the from-scratch engine: choose the custom model on the from-scratch engine in the "
            "sidebar.")
    st.stop()
st.caption("The model continues the sentence one token at a time, as it is written here. Every page then shows the "
           "sentence with its continuation, each generated token marked ▸; pick one below, or as the query on Text, "
           "to see what it looked at. It runs on the from-scratch engine with the sidebar model's weights.")
kept = continuations()
text = pick_sentence(s)
begun = generated_from(text)  # a sentence already continued: continue its prompt again
prompt = text if begun is None else text[:begun]
a, b, c = st.columns([2, 2, 1], vertical_alignment="bottom")
n = a.slider("Tokens to generate", 1, 64, 32, key="gen_tokens")
temperature = b.number_input("Temperature", 0.0, 2.0, 0.0, 0.1, key="gen_temperature",
                             help="0: the most likely token each time (greedy). Above 0: drawn from the softmax at "
                                  "that temperature, seed 0, so the same settings give the same text.")
if c.button("Continue", type="primary", key="gen_go"):
    shown = st.empty()
    pieces: list[str] = []
    try:
        for piece in cached_model(scratch).generate(prompt, max_new_tokens=n, temperature=temperature):
            pieces.append(piece)
            shown.code(prompt + "".join(pieces), language=None, wrap_lines=True)  # as written, never as markup
    except HeadLensError as err:
        stop_with(err)
    kept[prompt] = "".join(pieces)
    st.rerun()  # every choice of sentence now carries the continuation
if not kept.get(prompt):
    st.stop()
st.caption(f"Prompt: {len(prompt)} characters, then {len(kept[prompt])} generated:")
st.code(kept[prompt], language=None, wrap_lines=True)
if st.button("Remove the continuation", key="gen_clear"):
    kept.pop(prompt)
    st.rerun()

att = attention(s, prompt + kept[prompt])
v = view(s, att)
generated = [i for i, (first, _) in enumerate(v.query_spans) if att.generated[first]]
if not generated:
    st.info("The model ended the text at once: there is no generated token to look at.")
    st.stop()
left, right = st.columns([3, 1])
query = choose("Generated token", generated, "gen_query", container=left,
               format_func=lambda i: f"{i}: {v.query_labels[i]}")
layer = pick_layer(att.n_layers, container=right, windows=att.windows)
looked = v.weights[layer, :, query].mean(axis=0)
chart(text_shading(v.key_labels, looked, highlight=query,
                   title=title_for(att, f"What “{v.query_labels[query]}” looked at · layer {layer}, mean of heads")),
      "gen-looked")
