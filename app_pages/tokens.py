"""Tokens: BertViz's head view, lines from a query token to the keys it attends to."""
import streamlit as st

from analysis import long_view
from app_pages.ui.attention import attention
from app_pages.ui.exports import chart, exports
from app_pages.ui.long import tokens_long
from app_pages.ui.page import start
from app_pages.ui.pickers import (
    pick_heads,
    pick_layer,
    pick_query,
    pick_sentence,
    title_for,
)
from app_pages.ui.views import view
from models.long import LongAttention
from viz import token_lines

s, _ = start("tokens")
top = st.columns([3, 1, 2])
att = attention(s, pick_sentence(s, container=top[0]), long=True)
layer = pick_layer(att.n_layers, container=top[1], windows=att.windows)
if isinstance(att, LongAttention):
    lv = long_view(att, hide_special=s.hide_special)
    query = pick_query(lv, container=top[2], allow_all=False, last=True)
    tokens_long(s, att, layer, pick_heads(att.n_heads), query, lv)
    st.stop()
v = view(s, att)
query = pick_query(v, container=top[2])
heads = pick_heads(att.n_heads)
fig = token_lines(v.weights[layer], v.query_labels, v.key_labels, heads, query,
                  title=title_for(att, f"Layer {layer}"))
chart(fig, "tokens-lines")
st.caption("Queries on the left, keys on the right; a line's opacity is its weight relative to the head's "
           "largest, its colour the head.")
exports("tokens", fig, att, v, layer, heads[0], sig=f"{att.text}|{layer}|{heads}|{query}|{s}")
