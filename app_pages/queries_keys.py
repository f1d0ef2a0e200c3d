"""Queries & keys: each head's queries and keys over a corpus in one picture (AttentionViz), every head at
once, one head as a scatter, and a clicked token's sentence as a heatmap."""
import numpy as np
import streamlit as st

from app_pages.results.attention import cached_attention
from app_pages.results.messages import plain, short
from app_pages.results.qk import pictures
from app_pages.ui.card_links import card_button
from app_pages.ui.exports import chart, file_name
from app_pages.ui.models import model_for
from app_pages.ui.page import start
from app_pages.ui.qk import METHODS, pick_corpus, within_tokens
from app_pages.ui.state import choose, fresh_click, preset
from models import head_label
from viz import head_heatmap
from viz.qk import COLOR_BY, qk_overview, qk_scatter

ABOUT = (
    "Each head scores a query against a key by their dot product, then takes a softmax over the sentence's keys. "
    "Here every token of the corpus appears twice, as a query (circle) and as a key (cross), in one plane "
    "(Yeh et al. 2023, AttentionViz). Keys are moved so that their centre meets the queries' and both are scaled "
    "to the same mean length, which leaves every softmax unchanged; each key gets one more coordinate so that a "
    "query's nearest key is its highest-scoring one; and the plane is the one that keeps, as far as a plane can, "
    "each query nearest the key it attends to most. **Faithfulness** is the share of queries for which that holds "
    "in the picture, among their own sentence's keys; **chance** is the share a key drawn at random would get. "
    "Most queries attend most to a key heads park on ([CLS], [SEP], a decoder's first token), which is easy to "
    "draw; **word to word** is the same share among the queries that attend most to a word, which count for half "
    "of the fit. A pink ground marks a head where either share is below one half: do not read it by nearness.")


s, ref = start("queries_keys")
model = model_for(ref)
with st.expander("What this picture shows", expanded=False):
    st.markdown(ABOUT)
a, b = st.columns([3, 2], vertical_alignment="bottom")
with a:
    sentences = pick_corpus(s)
method = choose("Projection", list(METHODS), "qk_method", container=b, cast=str, format_func=METHODS.get)
sentences = within_tokens(model, sentences)
_, sentences, method = pictures.now(ref, sentences, method)  # on a cold server, over fewer sentences first
if s.heads_off or s.causal:
    st.caption("Drawn from the model as it is: the heads switched off and the causal mask in the sidebar do not "
               "apply on this page.")
st.markdown(f"#### Every head over {len(sentences):,} sentences")
slot = st.empty()  # the heads drawn so far, a layer at a time, while the rest is computed


def so_far(ready) -> None:
    layers = len(ready.frames) // model.n_heads
    slot.plotly_chart(qk_overview(ready.frames, model.n_layers, model.n_heads, png=ready.png,
                                  title=f"Layers 0–{layers - 1} of {model.n_layers} drawn · the rest is being computed"),
                      theme=None, config={"displaylogo": False})


drawn = pictures(ref, sentences, method, partial=so_far)
frames = drawn.frames
faithful = np.array([f.attrs["faithfulness"] for f in frames.values()])
grid = qk_overview(frames, model.n_layers, model.n_heads, png=drawn.png,
                   title=f"{model.n_layers} layers × {model.n_heads} heads · {ref.title}")
slot.empty()  # the partial pictures go; the grid that answers clicks is drawn after them
event = chart(grid, "qk_grid", on_select="rerun", selection_mode="points")
untrusted = sum(bool(f.attrs["misleads"]) for f in frames.values())
st.caption(f"Rows are layers, columns heads; queries blue, keys orange. Median faithfulness {np.median(faithful):.2f} "
           f"(chance {next(iter(frames.values())).attrs['chance']:.2f}). On a pink ground, the {untrusted} heads whose "
           "picture puts fewer than half of their queries, or of their word-to-word queries, nearest the key they "
           "attend to most: nearness there does not show attention. Click a head to draw it below.")
point = fresh_click(event, "qk_grid")
if point is not None and "point_index" in point and 0 <= point["point_index"] < model.n_layers * model.n_heads:
    layer, head = divmod(int(point["point_index"]), model.n_heads)
    preset("qk_layer", layer)
    preset("qk_head", head)

# the head shown first: the one drawn most faithfully for the queries that attend most to a word
best = max(frames, key=lambda pair: (not frames[pair].attrs["misleads"], np.nan_to_num(
    frames[pair].attrs["word_faithfulness"] * frames[pair].attrs["word_share"], nan=-1.0)))
c1, c2, c3 = st.columns([1, 1, 2], vertical_alignment="bottom")
layer = choose("Layer", list(range(model.n_layers)), "qk_layer", default=best[0], container=c1)
head = choose("Head", list(range(model.n_heads)), "qk_head", default=best[1], container=c2)
color_by = choose("Colour by", list(COLOR_BY), "qk_color", container=c3, cast=str, format_func=COLOR_BY.get)
card_button(layer, head, "qk-card")
frame = frames[(layer, head)]
n = len(frame) // 2

left, right = st.columns([3, 2])
with right:  # drawn first: the scatter rings the token picked here
    i = choose("Sentence", list(range(len(sentences))), "qk_sentence",
               format_func=lambda i: f"{i + 1}. {short(sentences[i])}")
    rows = np.flatnonzero(frame["sentence"].to_numpy()[:n] == i)           # the sentence's query rows
    labels = frame["token"].iloc[rows].tolist()
    words = [p for p, r in enumerate(rows) if frame["word_class"].iloc[r] != "special"
             and not (frame.attrs["causal"] and p == 0)]  # a decoder's first token is its sink
    q = choose("Query", list(range(len(rows))), "qk_query", default=words[0] if words else 0,
               format_func=lambda p: f"{p}: {labels[p]}")
    weights = cached_attention(ref, sentences[i], False, ()).weights[layer, head]
    fig = head_heatmap(weights, labels, labels, title=f"{head_label(layer, head)} · {short(sentences[i], 50)}",
                       height=420, visible=np.tri(len(rows), dtype=bool) if frame.attrs["causal"] else None)
    fig.add_shape(type="rect", xref="paper", x0=0, x1=1, yref="y", y0=q - 0.5, y1=q + 0.5,
                  line=dict(color="#d62728", width=2))
    chart(fig, "qk_heatmap")
    top = int(weights[q].argmax())
    near = bool(frame["near"].iloc[rows[q]])
    st.caption(plain(f"Query {q} “{labels[q]}” gives most weight ({weights[q, top]:.2f}) to key {top} "
                     f"“{labels[top]}”; in the picture it lies {'nearest that key' if near else 'nearer another key'}."))

with left:
    scatter = qk_scatter(frame, sentences, color_by=color_by, marked=int(rows[q]),
                         title=f"{head_label(layer, head)} · faithfulness {frame.attrs['faithfulness']:.2f} "
                               f"(chance {frame.attrs['chance']:.2f})")
    clicked = fresh_click(chart(scatter, "qk_scatter", on_select="rerun", selection_mode="points"), "qk_scatter")
    if frame.attrs["misleads"]:
        st.warning(f"Do not read this head by nearness: {frame.attrs['misleads']}. Read its attention from the "
                   "heatmap.")
    a = frame.attrs
    if a["word_share"] > 0 and not a["misleads"]:
        st.caption(f"Word to word: of the {a['word_share']:.0%} of queries whose most-attended key is a word (not "
                   f"{'the first token' if a['causal'] else '[CLS] or [SEP]'}, where heads park attention), "
                   f"{a['word_faithfulness']:.0%} lie nearest that key.")
    st.caption("Hover a point for its token and sentence; click one to draw its sentence on the right, its row "
               "framed in red. Drag to pan, scroll to zoom; click a legend entry to hide it.")
    st.download_button("Points · CSV", lambda: frame.to_csv(index=False).encode(),
                       file_name("qk", (layer, head), ext="csv"), "text/csv", on_click="ignore")
if clicked is not None and clicked.get("customdata"):
    row = int(clicked["customdata"][0])
    if 0 <= row < len(frame):
        preset("qk_sentence", int(frame["sentence"].iloc[row]))
        preset("qk_query", int(frame["position"].iloc[row]))
        st.rerun()
