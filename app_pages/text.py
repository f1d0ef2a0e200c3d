"""Text: the sentence itself, each token shaded by the attention it receives."""
import streamlit as st

from app_pages import common as c
from viz import text_shading

s = c.settings()
st.title("Text")
top = st.columns([3, 1, 1, 2])
att = c.attention(s, c.pick_sentence(s, container=top[0]))
v = c.view(s, att)
layer = c.pick_layer(att.n_layers, container=top[1])
head = c.pick_head(att.n_heads, container=top[2])
query = c.pick_query(v, container=top[3])
w = v.head(layer, head)
values = w.mean(axis=0) if query is None else w[query]
source = "every token (mean)" if query is None else f"“{v.query_labels[query]}”"
same_side = att.keys is None
fig = text_shading(v.key_labels, values, highlight=query if same_side else None,
                   title=c.title_for(att, f"Attention from {source} · layer {layer}, head {head}"))
c.chart(fig, "text-shading")
c.exports("text", fig, att, v, layer, head, sig=f"{att.text}|{layer}|{head}|{query}|{s}")
