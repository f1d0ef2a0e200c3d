"""Across layers: which input tokens an output position draws on, by attention rollout and flow."""
import streamlit as st

from analysis import FLOW_MAX_TOKENS, long_view, rollout
from app_pages.results.messages import stop_with
from app_pages.results.shared import Named
from app_pages.results.views import view_flow
from app_pages.ui.attention import attention
from app_pages.ui.exports import chart
from app_pages.ui.long import layers_long
from app_pages.ui.page import start
from app_pages.ui.pickers import pick_query, pick_sentence, title_for
from app_pages.ui.state import bound
from app_pages.ui.views import causal_note, view
from models import HeadLensError
from models.long import LongAttention
from viz import head_heatmap, text_shading


def layer_range(text: str) -> tuple[int, int]:
    """A window of layers as the URL writes it, "24-29"."""
    lo, hi = text.split("-")
    return int(lo), int(hi)


def range_to_url(window) -> str:
    return f"{window[0]}-{window[1]}"


s, _ = start("layers")
st.caption("One head's weights say where a layer looks, not which input tokens reach a position once several "
           "layers have mixed them. Rollout multiplies the layers' attention (each with the skip connection "
           "added), flow takes the most that can pass from an output token down to each input token "
           "(Abnar & Zuidema, 2020).")
top = st.columns([3, 2])
att = attention(s, pick_sentence(s, container=top[0]), long=True)
if att.keys is not None:
    st.info("Rollout and flow follow one stack of self-attention; pick the encoder or the decoder.")
    st.stop()
if isinstance(att, LongAttention):
    lv = long_view(att, hide_special=s.hide_special)
    query = pick_query(lv, container=top[1], allow_all=False, last=True)
    top_layer = att.n_layers - 1
    window = bound(st.slider, "window", (max(0, top_layer - 5), top_layer), cast=layer_range, to_url=range_to_url,
                   valid=lambda w: isinstance(w, tuple) and len(w) == 2 and 0 <= w[0] <= w[1] <= top_layer,
                   label="Layers", min_value=0, max_value=top_layer,
                   help="Rollout from the input of the first layer of this window to the output of its last; "
                        "each layer is one pass over its weights.")
    residual = bound(st.slider, "residual", 0.5, cast=float, valid=lambda r: isinstance(r, float) and 0 <= r <= 1,
                     label="Share of the skip connection", min_value=0.0, max_value=1.0, step=0.05)
    layers_long(s, att, lv, query, tuple(window), residual)
    st.stop()
v = view(s, att)
query = pick_query(v, container=top[1], allow_all=False)
layer = bound(st.slider, "layer", 0, cast=int, valid=lambda l: l in range(att.n_layers), label="Layer",
              min_value=0, max_value=att.n_layers - 1, help="Rollout through this layer, beside its raw attention.")
residual = bound(st.slider, "residual", 0.5, cast=float, valid=lambda r: isinstance(r, float) and 0 <= r <= 1,
                 label="Share of the skip connection", min_value=0.0, max_value=1.0, step=0.05,
                 help="Each layer is taken as r × identity + (1 − r) × its attention (the mean of its heads), "
                      "rows renormalised; Abnar & Zuidema use 0.5.")

rolled = rollout(v, residual=residual)
raw = v.weights[layer].mean(axis=0)
left, right = st.columns(2)
with left:
    chart(head_heatmap(raw, v.query_labels, v.key_labels, title_chars=34, visible=v.visible(layer),
                       title=f"Layer {layer} attention, mean of heads"), "layers-raw")
with right:
    chart(head_heatmap(rolled[layer], v.query_labels, v.key_labels, title_chars=34, visible=v.visible(),
                       title=f"Rollout through layer {layer}"), "layers-rollout")
causal_note(v)

token = f"“{v.query_labels[query]}”"
rows = [(f"Raw attention from {token} · layer {layer}", raw[query], "layers-raw-text"),
        (f"Rollout to {token} through layer {layer}", rolled[layer][query], "layers-rollout-text")]
n = len(v.query_labels)
if n > FLOW_MAX_TOKENS:
    st.info(f"Flow solves a max-flow problem for every pair of tokens, so it is shown for texts of at most "
            f"{FLOW_MAX_TOKENS} tokens; this one has {n}. Rollout has no such limit.")
else:
    try:
        with st.spinner(f"Computing attention flow over {n} tokens…"):
            flowed = view_flow(Named(v, (att.model_name, att.backend, att.text, s.hide_special, s.merge_words,
                                         s.causal, s.heads_off, s.moved)), residual)
    except HeadLensError as err:
        stop_with(err)
    left, _ = st.columns(2)
    with left:
        chart(head_heatmap(flowed, v.query_labels, v.key_labels, title_chars=34, visible=v.visible(),
                           title="Flow from the last layer"), "layers-flow")
    rows.append((f"Flow to {token} from the last layer", flowed[query], "layers-flow-text"))

st.subheader(f"What reaches {token}")
for what, values, key in rows:
    chart(text_shading(v.key_labels, values, highlight=query, title=title_for(att, what)), key)
