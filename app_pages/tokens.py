"""Tokens: BertViz's head view, lines from a query token to the keys it attends to."""
import streamlit as st

from app_pages import common as c
from viz import token_lines

s = c.settings()
st.title("Tokens")
top = st.columns([3, 1, 2])
att = c.attention(s, c.pick_sentence(s, container=top[0]))
v = c.view(s, att)
layer = c.pick_layer(att.n_layers, container=top[1])
query = c.pick_query(v, container=top[2])
heads = c.pick_heads(att.n_heads)
fig = token_lines(v.weights[layer], v.query_labels, v.key_labels, heads, query,
                  title=c.title_for(att, f"Layer {layer}"))
c.chart(fig, "tokens-lines")
st.caption("Queries on the left, keys on the right; a line's opacity is its weight relative to the head's "
           "largest, its colour the head.")
c.exports("tokens", fig, att, v, layer, heads[0], sig=f"{att.text}|{layer}|{heads}|{query}|{s}")
