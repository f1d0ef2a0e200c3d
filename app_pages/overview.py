"""Overview: every layer x head at once, as image thumbnails; open one in Explore."""
import numpy as np
import streamlit as st

from analysis import head_stats, long_view, reach, special_share
from app_pages.results.long import surveyed
from app_pages.ui.attention import attention
from app_pages.ui.card_links import card_button
from app_pages.ui.exports import chart, exports
from app_pages.ui.page import start
from app_pages.ui.pickers import pick_sentence, title_for
from app_pages.ui.state import open_page
from app_pages.ui.views import causal_note, view
from models.long import LongAttention
from viz import overview, reach_grid
from viz.figures import HIDDEN_NOTE


def open_in_explore(layer: int, head: int) -> None:
    open_page("app_pages/explore.py", layer=layer, head=head)
    st.rerun()


s, _ = start("overview")
att = attention(s, pick_sentence(s), long=True)
title = title_for(att, f"All {att.n_layers} layers × {att.n_heads} heads")
if isinstance(att, LongAttention):
    lv = long_view(att, hide_special=s.hide_special)
    every = surveyed(lv)
    stats = {"entropy": every.entropy, "max_weight": every.max_weight, "to_special": every.aside}
    fig = overview(every.pooled, stats, shared_scale=s.shared_scale, title=title,
                   visible=None if every.hidden is None else ~every.hidden)
    distance, first, v = every.distance, every.first, None
else:
    v = view(s, att)
    stats = head_stats(v, special_share(att))
    fig = overview(v.weights, stats, shared_scale=s.shared_scale, title=title,
                   visible=None if not v.causal else (v.visible() if v.windows is None else
                                                      np.stack([v.visible(layer) for layer in range(len(v.weights))])))
    distance, first = reach(att)
event = chart(fig, "overview", on_select="rerun", selection_mode="points")
st.caption("Rows are layers, columns heads; each square is one head's queries (down) by keys (across). "
           "Hover a square for its numbers; click it to open that head in Explore.")
if v is not None:
    causal_note(v, any_layer=True)
elif lv.causal:
    st.caption(f"A decoder's attention: {HIDDEN_NOTE}. A long prompt's squares are drawn in blocks of tokens, "
               "each showing its largest weight.")
# the markers trace lists heads layer by layer, so a clicked point's index names its head
clicked = [p["point_index"] for p in (event.selection.points if event else []) if "point_index" in p]
if clicked and 0 <= clicked[0] < att.n_layers * att.n_heads:
    open_in_explore(*divmod(int(clicked[0]), att.n_heads))

a, b, go_col, card_col, _ = st.columns([1, 1, 1, 1, 1], vertical_alignment="bottom")
layer = a.selectbox("Layer", range(att.n_layers), key="open_layer")
head = b.selectbox("Head", range(att.n_heads), key="open_head")
if go_col.button("Open in Explore", type="primary"):
    open_in_explore(layer, head)
card_button(layer, head, "overview-card", card_col, label="Open its card")
exports("overview", fig, att if v is not None else None, v, layer, head, sig=f"{att.text}|{s}")

st.subheader("How far each head looks")
chart(reach_grid(distance, first, title=title_for(att, "Every head's reach")), "overview-reach")
st.caption("Mean attention distance: for each query, the distance in tokens to its keys weighted by its attention, "
           "averaged over queries (Vig & Belinkov 2019); early layers of a language model look near, later ones far. "
           "Sink share: the mean weight the queries after the first put on the first token, where a decoder's "
           "heads park attention they do not need (Xiao et al. 2024). Both are of every weight, before hiding "
           "special tokens.")

