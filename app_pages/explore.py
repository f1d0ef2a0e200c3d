"""Explore: every head of one layer as heatmaps, with per-head numbers."""
import pandas as pd
import streamlit as st

from analysis import head_stats, special_share
from app_pages.ui.attention import attention
from app_pages.ui.card_links import card_button, card_url, start_here
from app_pages.ui.explanations import explained_in
from app_pages.ui.exports import chart, exports
from app_pages.ui.long import explore_long
from app_pages.ui.page import start
from app_pages.ui.pickers import (
    pick_full_resolution,
    pick_head,
    pick_heads,
    pick_layer,
    pick_sentence,
    title_for,
)
from app_pages.ui import compiled
from app_pages.ui.views import causal_note, special_words, view
from app_pages.ui.why import explore_clicks, explore_why
from models import head_label
from models.long import LongAttention
from viz import head_grid, head_heatmap

s, _ = start("explore")
start_here(s.model, s.causal, s.heads_off)
top = st.columns([3, 1, 1])
att = attention(s, pick_sentence(s, container=top[0]), long=True)
opening = compiled.opening(s.model) if s.model.program is not None else None  # a compiled program: its output's
layer = pick_layer(att.n_layers, container=top[1], windows=att.windows, default=opening and opening[0])
focus = pick_head(att.n_heads, container=top[2], label="Focus head")
card_button(layer, focus, "explore-card")
heads = pick_heads(att.n_heads)
if isinstance(att, LongAttention):
    explore_long(s, att, layer, focus, heads)
    st.stop()
v = view(s, att)

fig = head_grid(v.weights[layer], v.query_labels, v.key_labels, heads, shared_scale=s.shared_scale,
                title=title_for(att, f"Layer {layer}"), visible=v.visible(layer),
                links={h: card_url(layer, h) for h in heads}, about=explained_in(s, layer, att))
clicks = explore_clicks(fig, v, heads, layer)  # a cell's score split by writer, below
event = chart(fig, "explore-grid", **({"on_select": "rerun", "selection_mode": "points"} if clicks else {}))
causal_note(v, layer)
full = pick_full_resolution([v], heads, "full", "Head at full resolution", "head", lambda h: f"H{h}")
if full is not None:
    exact = head_heatmap(v.head(layer, full), v.query_labels, v.key_labels, max_cells=None, height=760,
                         visible=v.visible(layer),
                         zmax=float(v.weights[layer][heads].max()) if s.shared_scale else None,
                         title=title_for(att, f"{head_label(layer, full)}, every weight"))
    chart(exact, "explore-full")

stats = head_stats(v, special_share(att), layers=slice(layer, layer + 1))
table = pd.DataFrame({
    "head": range(att.n_heads),
    "entropy (nats)": stats["entropy"][0],
    "largest weight": stats["max_weight"][0],
    special_words(att): stats["to_special"][0],
})
st.subheader(f"Heads of layer {layer}")
st.caption(f"Entropy and largest weight are of the rows as shown; “{special_words(att)}” is the mean share each "
           f"query gives {special_words(att, long=True)}, before hiding them.")
st.dataframe(table.style.format(precision=3).highlight_between(subset=["head"], left=focus, right=focus),
             hide_index=True, key="explore-stats")
exports("explore", fig, att, v, layer, focus, sig=f"{att.text}|{layer}|{heads}|{s}")
explore_why(s.model, event if clicks else None, fig, v, att.text, layer, focus)
