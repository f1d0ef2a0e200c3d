"""Overview: every layer x head at once, as image thumbnails; open one in Explore."""
import streamlit as st

from analysis import head_stats, special_share
from app_pages import common as c
from viz import overview


def open_in_explore(layer: int, head: int) -> None:
    c.remember("layer", layer)
    c.remember("head", head)
    st.switch_page("app_pages/explore.py")


s = c.settings()
st.title("Overview")
att = c.attention(s, c.pick_sentence(s))
v = c.view(s, att)
stats = head_stats(v, special_share(att))
fig = overview(v.weights, stats, shared_scale=s.shared_scale,
               title=c.title_for(att, f"All {att.n_layers} layers × {att.n_heads} heads"))
event = c.chart(fig, "overview", on_select="rerun", selection_mode="points")
st.caption("Rows are layers, columns heads; each square is one head's queries (down) by keys (across). "
           "Hover a square for its numbers; click it to open that head in Explore.")
# the markers trace lists heads layer by layer, so a clicked point's index names its head
clicked = [p["point_index"] for p in (event.selection.points if event else []) if "point_index" in p]
if clicked and 0 <= clicked[0] < att.n_layers * att.n_heads:
    open_in_explore(*divmod(int(clicked[0]), att.n_heads))

a, b, go_col, _ = st.columns([1, 1, 1, 2], vertical_alignment="bottom")
layer = a.selectbox("Layer", range(att.n_layers), key="open_layer")
head = b.selectbox("Head", range(att.n_heads), key="open_head")
if go_col.button("Open in Explore", type="primary"):
    open_in_explore(layer, head)
c.exports("overview", fig, att, v, layer, head, sig=f"{att.text}|{s}")
