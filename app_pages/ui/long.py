"""Long prompts in the app: a ``LongAttention`` shared by every session, layers run with a progress bar,
and pooled grids cached so that a rerun redraws without recomputing."""
from __future__ import annotations


import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analysis import FLOW_MAX_TOKENS, Grid, LongView, long_view, zoom_window
from analysis.attention.long import CELLS, ZOOM
from analysis.attention.views import first_token_sink
from models import HeadLensError, head_label
from models.long import LongAttention
from viz import head_grid, head_heatmap, text_shading, token_lines
from viz.figures import HIDDEN_NOTE, block_categories

from ..results.long import climb, pooled, rolled, throttled
from ..results.messages import plain, stop_with
from .exports import chart, exports
from .pickers import title_for
from .state import bound, choose, flag, fresh_click, preset
from .views import special_words

ZOOM_REGIONS = 16  # click targets along each axis of a head's heatmap


def run_layers(att: LongAttention, layer: int) -> None:
    """Run ``att``'s forward pass up to ``layer`` under a progress bar (nothing when it has run that far); the server
    then runs it to the top once this page is drawn (``climb``)."""
    climb(att)
    if att.layers_done > layer:
        return
    bar = st.progress(0.0, text=f"Running the prompt's {len(att.tokens):,} tokens through layers 0–{layer}…")
    try:
        att.run_to(layer, progress=throttled(lambda done, total: bar.progress(
            done / total, text=f"Running the prompt's {len(att.tokens):,} tokens: layer {done - 1} of 0–{layer}")))
    except HeadLensError as err:
        stop_with(err)
    bar.empty()


def nearest_ready(att: LongAttention, layer: int) -> int:
    """``layer`` once the prompt has run up to it; else the nearest layer below it that has (layer 0 at once: the
    embeddings alone), for the page to draw first, before it runs the layers up to ``layer`` (``catch_up``)."""
    climb(att)
    if att.layers_done == 0:
        att.run_to(0)
    return max(0, min(layer, att.layers_done - 1))  # 0: the budget took its layers meanwhile (it runs them again)


def catch_up(att: LongAttention, layer: int, slot) -> None:
    """Run the prompt up to ``layer`` under a progress bar in ``slot`` (the page's nearest ready layer drawn
    meanwhile), then draw the page again with ``layer``: a switch never waits blind on the layers below."""
    with slot:
        run_layers(att, layer)
    st.rerun()


def zoom_targets(fig, v: LongView, g: Grid, heads: list[int], cols: int = 4) -> int:
    """Invisible markers over each head's heatmap, one per region of the prompt, that a click turns into
    a zoom there (customdata: head, first query, first key). Returns the region's size in tokens."""
    m = len(v)
    region = max(ZOOM, -(-m // ZOOM_REGIONS))
    q_cats, k_cats = block_categories(v.labels, g.q_starts), block_categories(v.labels, g.k_starts)
    q_lo, q_hi = g.rows
    spots = []
    for q in range(q_lo, q_hi, region):
        for k in range(0, m, region):
            if v.causal and v.keep[k] > v.keep[min(q + region, q_hi) - 1]:
                continue  # no query of the region sees its keys
            qi = min(len(q_cats) - 1, int(np.searchsorted(g.q_starts, min(q + region // 2, q_hi - 1), "right")) - 1)
            ki = min(len(k_cats) - 1, int(np.searchsorted(g.k_starts, min(k + region // 2, m - 1), "right")) - 1)
            spots.append((q, k, q_cats[qi], k_cats[ki]))
    for i, h in enumerate(heads):
        fig.add_trace(go.Scatter(
            x=[s[3] for s in spots], y=[s[2] for s in spots], mode="markers", name=f"zoom {h}", showlegend=False,
            marker=dict(symbol="square", size=9, color="rgba(0,0,0,0)"),
            customdata=[[h, s[0], s[1]] for s in spots],
            hovertemplate="click to zoom here<extra></extra>"), row=i // cols + 1, col=i % cols + 1)
    return region


def explore_long(s, att: LongAttention, layer: int, focus: int, heads: list[int]) -> None:
    """Explore for a prompt longer than ``attend`` keeps: pooled heatmaps of the layer's heads, a "last
    queries" mode, a zoom drawn weight by weight (chosen by a click or sliders, kept in the URL) and each
    head's figures."""
    v = long_view(att, hide_special=s.hide_special)
    m = len(v)
    asked, layer = layer, nearest_ready(att, layer)
    slot = st.container()  # the progress of the layers up to the one asked, at the top, the nearest ready drawn below
    if layer != asked:
        slot.caption(f"Layer {asked} is on its way: the prompt has run up to layer {layer}, drawn below until "
                     f"{asked} comes.")
    elif att.layers_done < att.n_layers:
        slot.caption(f"Layers 0–{att.layers_done - 1} of {att.n_layers} are ready; a higher one runs when asked, the "
                     "nearest ready drawn first.")
    if s.merge_words:
        st.caption("Words are not merged in a long prompt: it is drawn in blocks of tokens.")
    a, b, _ = st.columns([1, 1, 2], vertical_alignment="bottom")
    last_only = bound(a.toggle, "last_only", False, cast=flag, label="Last queries only",
                      help="Draw only the last queries, one row each, against every key.")
    last = None
    if last_only:
        last = bound(b.number_input, "last_k", min(32, m), cast=int, label="How many", min_value=1,
                     max_value=min(m, CELLS), step=8, valid=lambda k: 1 <= k <= min(m, CELLS))
    g = pooled(v, layer, heads, last)
    rows = g.rows
    what = f"last {rows[1] - rows[0]} queries" if last else f"{m:,} tokens"
    nearest = "" if layer == asked else f" · the nearest ready layer to {asked}"
    fig = head_grid(g.weights, v.labels, v.labels, heads, shared_scale=s.shared_scale, starts=(g.q_starts, g.k_starts),
                    hidden=g.hidden, title=title_for(att, f"Layer {layer} · {what}{nearest}"))
    region = zoom_targets(fig, v, g, heads)
    event = chart(fig, "explore-grid", on_select="rerun", selection_mode="points")
    q_step = int(g.q_starts[1] - g.q_starts[0]) if len(g.q_starts) > 1 else 1
    k_step = int(g.k_starts[1] - g.k_starts[0]) if len(g.k_starts) > 1 else 1
    st.caption(f"A long prompt: each cell is the largest weight of a block of {q_step} "
               f"quer{'y' if q_step == 1 else 'ies'} by {k_step} keys, computed for this layer alone. "
               f"Click a head's heatmap to zoom into the {region} × {region} tokens there.")
    if v.causal:
        window = v.window(layer)
        st.caption(f"A decoder's attention: {HIDDEN_NOTE}" + ("." if window is None else
                   f"; in this layer a query sees only the last {window:,} tokens (a sliding window), so older ones "
                   "are grey too."))
    picked = fresh_click(event, "explore-grid-click")
    if picked is not None and "customdata" in picked:
        head, q, k = (int(x) for x in picked["customdata"])
        preset("zoom_head", head)
        preset("zoom_q", zoom_window(m, q + (region - ZOOM) // 2)[0])
        preset("zoom_k", zoom_window(m, k + (region - ZOOM) // 2)[0])
        st.rerun()

    st.subheader("Zoom: every weight")
    size = min(ZOOM, m)
    za, zb, zc = st.columns([1, 2, 2])
    zoom_head = choose("Head", heads, "zoom_head", default=focus if focus in heads else heads[0], container=za)
    top = m - size
    q0 = bound(zb.slider, "zoom_q", max(0, rows[1] - size), cast=int, label="Queries from", min_value=0,
               max_value=max(1, top), valid=lambda x: 0 <= x <= top, disabled=top == 0)
    k0 = bound(zc.slider, "zoom_k", max(0, min(q0, top)), cast=int, label="Keys from", min_value=0,
               max_value=max(1, top), valid=lambda x: 0 <= x <= top, disabled=top == 0)
    queries, keys = zoom_window(m, q0, size), zoom_window(m, k0, size)
    exact = v.exact(layer, zoom_head, queries, keys)
    zoom = head_heatmap(exact, v.labels[queries[0]:queries[1]], v.labels[keys[0]:keys[1]], max_cells=None, height=760,
                        visible=v.visible(queries, keys, layer), zmax=float(g.weights.max()) if s.shared_scale else None,
                        title=title_for(att, f"{head_label(layer, zoom_head)}, queries {queries[0]}–{queries[1] - 1}, "
                                             f"keys {keys[0]}–{keys[1] - 1}"))
    chart(zoom, "explore-zoom")

    if g.figures is not None:
        f = g.figures
        columns = {"head": heads, "entropy (nats)": f.entropy, "largest weight": f.max_weight,
                   special_words(att): f.aside, "to the first token": f.first, "mean distance (tokens)": f.distance}
        if first_token_sink(att):
            del columns["to the first token"]  # the column before already is
        table = pd.DataFrame(columns)
        st.subheader(f"Heads of layer {layer}")
        st.caption(f"Entropy and largest weight are of the rows as shown; “{special_words(att)}” is the mean share each "
                   f"query gives {special_words(att, long=True)}, before hiding them; mean distance is how far back "
                   "a query looks, weighted by its attention (Vig & Belinkov 2019).")
        st.dataframe(table.style.format(precision=3).highlight_between(subset=["head"], left=focus, right=focus),
                     hide_index=True, key="explore-stats")
    exports("explore", fig, None, sig=f"{att.text}|{layer}|{heads}|{last}|{s}")
    exports("explore-zoom", zoom, None, sig=f"{att.text}|{layer}|{zoom_head}|{queries}|{keys}|{s}")
    if layer != asked:
        catch_up(att, asked, slot)


PASSAGE = 400  # tokens of a long prompt that Text shades at once


def passage(m: int, key: str, end: int | None = None) -> tuple[int, int]:
    """``(start, stop)`` of the ``PASSAGE`` tokens of ``m`` that a page shades, from a slider kept in the URL;
    by default the passage ends at ``end`` (else it starts the text)."""
    size = min(PASSAGE, m)
    top = m - size
    default = 0 if end is None else max(0, min(top, end - size + 1))
    start = bound(st.slider, key, default, cast=int, label="Passage from token", min_value=0, max_value=max(1, top),
                  valid=lambda x: 0 <= x <= top, disabled=top == 0,
                  help=f"A long text is shaded {size} tokens at a time.")
    return start, start + size


def text_long(s, att: LongAttention, layer: int, head: int, query: int | None, v: LongView) -> None:
    """Text for a long prompt: a passage of it shaded by the weight each token gets from ``query``
    (or, for every query, the mean), the passage chosen by a slider and kept in the URL."""
    m = len(v)
    run_layers(att, layer)
    with st.spinner(f"Computing layer {layer}'s weights…"):
        values = v.received(layer, head) if query is None else v.rows(layer, [head], (query, query + 1))[0, 0]
    start, stop = passage(m, "text_from", query)
    size = stop - start
    source = "every token (mean)" if query is None else f"“{v.labels[query]}” (token {query})"
    inside = query if query is not None and start <= query < stop else None
    fig = text_shading(v.labels[start:stop], values[start:stop], highlight=None if inside is None else inside - start,
                       title=title_for(att, f"Attention from {source} · {head_label(layer, head)} · tokens "
                                            f"{start}–{stop - 1} of {m:,}"))
    chart(fig, "text-shading")
    strongest = np.argsort(-values, kind="stable")[:10]
    st.caption(f"A long prompt: {size} of its {m:,} tokens are shaded at once, on one scale for the passage. "
               "The ten tokens that get the most weight: " + ", ".join(
                   f"{int(j)} “{plain(v.labels[j])}” {values[j]:.3f}" for j in strongest) + ".")
    exports("text", fig, None, sig=f"{att.text}|{layer}|{head}|{query}|{start}|{s}")


def tokens_long(s, att: LongAttention, layer: int, heads: list[int], query: int, v: LongView) -> None:
    """Tokens for a long prompt: the query's lines to its strongest keys, and each head's strongest keys."""
    run_layers(att, layer)
    with st.spinner(f"Computing layer {layer}'s weights…"):
        table = v.strongest(layer, heads, query, k=8)
        w = v.rows(layer, heads, (query, query + 1))                          # (heads, 1, keys)
    keys = sorted(set(table["key"]))
    weights = np.zeros((att.n_heads, 1, len(keys)), dtype=np.float32)
    weights[heads] = w[:, :, keys]
    fig = token_lines(weights, [v.labels[query]], [f"{j}: {v.labels[j]}" for j in keys], heads, 0,
                      title=title_for(att, f"Layer {layer} · from token {query} of {len(v):,}"))
    chart(fig, "tokens-lines")
    st.caption("A long prompt: the query on the left, on the right only the keys among each head's eight strongest, "
               "in the order they come (numbered); a line's opacity is its weight relative to the head's largest.")
    st.dataframe(table.style.format({"weight": "{:.3f}"}), hide_index=True, key="tokens-strongest")
    exports("tokens", fig, None, sig=f"{att.text}|{layer}|{heads}|{query}|{s}")


def layers_long(s, att: LongAttention, v: LongView, query: int, window: tuple[int, int], residual: float) -> None:
    """Across layers for a long prompt: the query's raw attention at the window's last layer and its rollout
    through the window, each shown on a passage ending at the query, with the tokens that reach it most."""
    lo, hi = window
    run_layers(att, hi)
    with st.spinner(f"Computing layer {hi}'s weights…"):
        raw = v.rows(hi, list(range(att.n_heads)), (query, query + 1))[:, 0].mean(axis=0)
    rolled_up = rolled(v, query, window, residual)
    m = len(v)
    start, stop = passage(m, "layers_from", query)
    inside = query - start if start <= query < stop else None
    token = f"“{v.labels[query]}” (token {query})"
    st.subheader(f"What reaches {token}")
    for what, values, key in ((f"Raw attention from {token} · layer {hi}, mean of heads", raw, "layers-raw-text"),
                              (f"Rollout to {token} through layers {lo}–{hi}", rolled_up, "layers-rollout-text")):
        chart(text_shading(v.labels[start:stop], values[start:stop], highlight=inside,
                           title=title_for(att, f"{what} · tokens {start}–{stop - 1} of {m:,}")), key)
        strongest = np.argsort(-values, kind="stable")[:10]
        st.caption("Most: " + ", ".join(f"{int(j)} “{plain(v.labels[j])}” {values[j]:.3f}" for j in strongest) + ".")
    st.caption(f"A long prompt: rollout carries the query's row down through each layer of the window, one pass "
               f"over each layer's weights; flow (a max-flow per pair of tokens) is for texts of at most "
               f"{FLOW_MAX_TOKENS} tokens.")
