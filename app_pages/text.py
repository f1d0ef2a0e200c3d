"""Text: the sentence itself, each token shaded by the attention it receives."""
import streamlit as st

from analysis import long_view
from app_pages.ui.attention import attention
from app_pages.ui.exports import chart, exports
from app_pages.ui.long import text_long
from app_pages.ui.page import start
from app_pages.ui.pickers import (
    pick_head,
    pick_layer,
    pick_query,
    pick_sentence,
    title_for,
)
from app_pages.ui.views import view
from models import head_label
from models.long import LongAttention
from viz import text_shading

s, _ = start("text")
top = st.columns([3, 1, 1, 2])
att = attention(s, pick_sentence(s, container=top[0]), long=True)
layer = pick_layer(att.n_layers, container=top[1], windows=att.windows)
head = pick_head(att.n_heads, container=top[2])
if isinstance(att, LongAttention):
    lv = long_view(att, hide_special=s.hide_special)
    text_long(s, att, layer, head, pick_query(lv, container=top[3], last=True), lv)
    st.stop()
v = view(s, att)
query = pick_query(v, container=top[3])
w = v.head(layer, head)
values = w.mean(axis=0) if query is None else w[query]
source = "every token (mean)" if query is None else f"“{v.query_labels[query]}”"
same_side = att.keys is None
fig = text_shading(v.key_labels, values, highlight=query if same_side else None,
                   title=title_for(att, f"Attention from {source} · {head_label(layer, head)}"))
chart(fig, "text-shading")
exports("text", fig, att, v, layer, head, sig=f"{att.text}|{layer}|{head}|{query}|{s}")
