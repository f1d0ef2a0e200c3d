"""Figures of which heads make a prediction: a layer x head grid centred on zero, the residual stream
patched by position, and one head's effect at each position."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from models import head_label

from .figures import DIVERGING, _tick, head_targets, safe, top_margin, visible, wrapped_title

HALF_TITLE = 38  # title characters a line in a chart half a 1024 px window wide

ROW_PX = 22  # a layer's row in a grid: SmolLM2's 30 layers fit in about 800 px


def _bound(values: np.ndarray, zmax: float | None) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(zmax or (finite.max() if finite.size else 0.0) or 1.0)


def effect_grid(values: np.ndarray, *, title: str = "", value_name: str = "recovered", zmax: float | None = None,
                digits: int = 2, selected: tuple[int, int] | None = None, tips: list[list[str]] | None = None) -> go.Figure:
    """Layer x head cells of ``values`` ``(layers, heads)`` on a red-blue scale centred on zero; hover names the
    head, its value and its rank by size (a cell is too narrow for its number in half a 1024 px window, so
    the page lists the strongest heads in a table), or ``tips`` per cell; ``selected`` is outlined. An
    invisible marker over each cell (the trace "heads", point ``layer * heads + head``) takes clicks."""
    n_layers, n_heads = values.shape
    bound = _bound(values, zmax)
    order = np.argsort(-np.abs(np.nan_to_num(values)), axis=None, kind="stable")
    rank = np.empty(values.size, dtype=int)
    rank[order] = np.arange(1, values.size + 1)
    rank = rank.reshape(values.shape)
    tips = tips or [[f"{value_name} {values[l, h]:+.{digits + 2}f}, rank {rank[l, h]} of {values.size} by size"
                     for h in range(n_heads)] for l in range(n_layers)]
    fig = go.Figure(go.Heatmap(
        z=np.nan_to_num(values), zmin=-bound, zmax=bound, zmid=0, colorscale=DIVERGING, reversescale=True,
        customdata=tips, xgap=1, ygap=1,
        colorbar=dict(title=dict(text=safe(value_name), side="right"), thickness=12),
        hovertemplate="layer %{y}, head %{x}<br>%{customdata}<extra></extra>"))
    head_targets(fig, n_layers, n_heads, [tips[l][h] for l in range(n_layers) for h in range(n_heads)])
    if selected is not None:
        layer, head = selected
        fig.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=layer - 0.5, y1=layer + 0.5,
                      line=dict(color="#111", width=2))
    fig.update_xaxes(tickmode="array", tickvals=list(range(n_heads)), ticktext=[f"H{h}" for h in range(n_heads)],
                     side="top", showgrid=False, ticks="", zeroline=False, tickangle=0,  # upright: not into the title
                     tickfont=dict(size=9 if n_heads > 6 else 10))
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_layers)), ticktext=[f"L{l}" for l in range(n_layers)],
                     showgrid=False, ticks="")  # layer 0 at the top: ``head_targets`` fixed the range
    head = wrapped_title(title, HALF_TITLE)
    fig.update_layout(title=head, height=ROW_PX * n_layers + top_margin(head, room=40) + 20,
                      margin=dict(t=top_margin(head, room=40), l=44, r=10, b=10), plot_bgcolor="white")
    return fig


def position_grid(values: np.ndarray, tokens: list[str], *, title: str = "", rows: list[str] | None = None,
                  value_name: str = "recovered", zmax: float | None = None, title_chars: int = HALF_TITLE) -> go.Figure:
    """``values`` ``(rows, positions)`` on a red-blue scale centred on zero, one column per token of the
    prompt (tick: the token; hover: its position too); rows named by ``rows`` (default: layers)."""
    n_rows, n = values.shape
    rows = rows or [f"L{l}" for l in range(n_rows)]
    bound = _bound(values, zmax)
    tips = [[f"{safe(rows[r])} · {i}: {safe(tokens[i])}<br>{safe(value_name)} {values[r, i]:+.3f}" for i in range(n)]
            for r in range(n_rows)]
    fig = go.Figure(go.Heatmap(
        z=values, x=list(range(n)), y=list(range(n_rows)), zmin=-bound, zmax=bound, zmid=0, colorscale=DIVERGING,
        reversescale=True, customdata=tips, xgap=1, ygap=1,
        colorbar=dict(title=dict(text=safe(value_name), side="right"), thickness=12),
        hovertemplate="%{customdata}<extra></extra>"))
    longest = max((len(_tick(t)) for t in tokens), default=1)
    fig.update_xaxes(tickmode="array", tickvals=list(range(n)), ticktext=[_tick(t) for t in tokens], tickangle=-60,
                     showgrid=False, ticks="", zeroline=False, fixedrange=True)
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_rows)), ticktext=[safe(r) for r in rows],
                     autorange="reversed", showgrid=False, ticks="", zeroline=False, fixedrange=True)
    head = wrapped_title(title, title_chars)
    bottom = 20 + int(6.5 * longest * 0.87) + 10
    fig.update_layout(title=head, height=ROW_PX * n_rows + top_margin(head, room=10) + bottom,
                      margin=dict(t=top_margin(head, room=10), l=70, r=10, b=bottom), plot_bgcolor="white")
    return fig


def parts_bars(parts: dict[str, float], *, title: str = "", value_name: str = "logit difference",
               title_chars: int = HALF_TITLE) -> go.Figure:
    """Horizontal bars of what each part of the residual stream adds to the prediction, largest first."""
    names = sorted(parts, key=lambda k: -abs(parts[k]))
    values = [parts[k] for k in names]
    fig = go.Figure(go.Bar(x=values, y=[safe(n) for n in names], orientation="h",
                           marker_color=["#b2182b" if v > 0 else "#2166ac" for v in values],
                           hovertemplate="%{y}: %{x:+.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title=safe(value_name), zeroline=True, zerolinecolor="#888")
    head = wrapped_title(title, title_chars)
    fig.update_layout(title=head, height=26 * len(names) + top_margin(head) + 60,
                      margin=dict(t=top_margin(head), l=150, r=10, b=50), plot_bgcolor="white")
    return fig


def vocabulary_bars(frame, *, title: str = "", title_chars: int = HALF_TITLE) -> go.Figure:
    """A head's vocabulary (``analysis.head_vocabulary``): the tokens it pushes up (red, top) and down (blue,
    bottom), each bar the logit it adds, each token written in quotes as it decodes."""
    up = frame[frame["direction"] == "up"]
    down = frame[frame["direction"] == "down"].iloc[::-1]
    rows = list(up.itertuples()) + list(down.itertuples())
    labels = [f"{r.direction} {r.rank}" for r in rows]  # one category a bar: two tokens may read alike
    names = [f"“{visible(r.text)}”" for r in rows]
    values = [r.logit for r in rows]
    fig = go.Figure(go.Bar(x=values, y=labels, orientation="h", customdata=[[r.token] for r in rows],
                           marker_color=["#b2182b" if r.direction == "up" else "#2166ac" for r in rows],
                           hovertext=[safe(n) for n in names], hovertemplate="%{hovertext} · id %{customdata[0]}: %{x:+.3f}<extra></extra>"))
    ticks = [_tick(n, 16) for n in names]
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=labels, ticktext=ticks)
    fig.update_xaxes(title="logit it adds", zeroline=True, zerolinecolor="#888")
    head = wrapped_title(title, title_chars)
    left = 16 + int(6.5 * max((len(t) for t in ticks), default=4))
    fig.update_layout(title=head, height=20 * len(rows) + top_margin(head) + 60,
                      margin=dict(t=top_margin(head), l=left, r=10, b=50), plot_bgcolor="white", bargap=0.25)
    return fig


FLOW_COLORS = {"head": "#7b3294", "mlp": "#e66101", "residual": "#b8b8b8"}
LEGEND_PX = 80  # the legend's rows above the graph, under the title: three at 1024 px
LEVEL_PX = 14  # a half-layer of the flow graph: SmolLM2's 60 levels in about 840 px


def flow_figure(graph, tokens: list[str], n_layers: int, *, route=None, title: str = "",
                title_chars: int = 90) -> go.Figure:
    """The routes of a prediction (``analysis.flow_graph``): tokens across, residual states up (the embeddings
    at the bottom, each layer's attention then MLP above), each edge a line as thick as its share: heads
    (purple, from an earlier token), MLPs (orange, a bend beside the stream), the stream itself (grey).
    Hover a line's middle for the head and its share (the trace "edges", whose ``customdata`` is the
    ``(layer, head)`` of a head's line, ``(-1, -1)`` for others); ``route`` (``analysis.strongest_route``) is
    drawn on top."""
    fig = go.Figure()
    labels = [_tick(t) for t in tokens]
    hover_x, hover_y, hover_text, opens = [], [], [], []  # opens: (layer, head) a click on the line opens
    if len(graph):
        edges = graph.groupby(["kind", "layer", "source", "target", "from_level", "to_level"], sort=False)
        drawn = []
        for (kind, layer, source, target, lo, hi), rows in edges:
            share = float(rows["share"].sum())
            if kind == "mlp":
                xs, ys = [source, source + 0.22, target], [lo, (lo + hi) / 2, hi]
            else:
                xs, ys = [source, target], [lo, hi]
            drawn.append((kind, share, xs, ys))
            names = (", ".join(f"{head_label(layer, h)} {v:.3f}" for h, v in zip(rows["head"], rows["share"]))
                     if kind == "head" else f"L{layer} {'MLP' if kind == 'mlp' else 'stream'} {share:.3f}")
            where = (f"{safe(tokens[source])} → {safe(tokens[target])}" if kind == "head"
                     else safe(tokens[target]))
            hover_x.append(xs[len(xs) // 2] if kind == "mlp" else (source + target) / 2)
            hover_y.append(ys[len(ys) // 2] if kind == "mlp" else (lo + hi) / 2)
            hover_text.append(f"{names}<br>{where}")
            strongest = rows.loc[rows["share"].idxmax()]
            opens.append([int(layer), int(strongest["head"])] if kind == "head" else [-1, -1])
        for kind in ("residual", "mlp", "head"):  # heads drawn last, over the stream
            for width in range(1, 9):
                xs, ys = [], []
                for k, share, ex, ey in drawn:
                    if k == kind and _width(share) == width:
                        xs += ex + [None]
                        ys += ey + [None]
                if xs:
                    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                             line=dict(color=FLOW_COLORS[kind], width=width)))
    if route is not None and len(route):
        xs, ys = [], []
        for r in route.itertuples():
            if r.kind == "mlp":
                xs += [r.source, r.source + 0.22, r.target]
                ys += [r.from_level, (r.from_level + r.to_level) / 2, r.to_level]
            else:
                xs += [r.source, r.target]
                ys += [r.from_level, r.to_level]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="strongest route through a head", hoverinfo="skip",
                                 line=dict(color="#111", width=1.5, dash="dot")))
    for kind, name in (("head", "a head, from an earlier token"), ("mlp", "an MLP"), ("residual", "the stream")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=name, line=dict(color=FLOW_COLORS[kind],
                                                                                         width=4)))
    fig.add_trace(go.Scatter(x=hover_x, y=hover_y, mode="markers", name="edges", showlegend=False,
                             marker=dict(size=9, color="rgba(0,0,0,0)"), hovertext=hover_text, customdata=opens,
                             hovertemplate="%{hovertext}<extra></extra>"))
    end = graph.attrs.get("position", len(tokens) - 1)
    fig.add_trace(go.Scatter(x=[end], y=[2 * n_layers], mode="markers", name="the prediction", hoverinfo="skip",
                             marker=dict(size=11, color="#111", symbol="diamond")))
    n = len(tokens)
    fig.update_xaxes(tickmode="array", tickvals=list(range(n)), ticktext=labels, tickangle=-60, range=[-0.6, n - 0.4],
                     showgrid=True, gridcolor="#f0f0f0", zeroline=False, fixedrange=True)
    every = 1 if n_layers <= 16 else 2
    fig.update_yaxes(tickmode="array", tickvals=[0] + [2 * l + 1.5 for l in range(0, n_layers, every)],
                     ticktext=["embed"] + [f"L{l}" for l in range(0, n_layers, every)], range=[-0.8, 2 * n_layers + 0.8],
                     showgrid=False, zeroline=False, fixedrange=True)
    head = {**wrapped_title(title, title_chars), "yref": "container", "y": 1, "yanchor": "top", "pad": dict(t=12)}
    longest = max((len(t) for t in labels), default=1)
    bottom = 20 + int(6.5 * longest * 0.87) + 10
    top = top_margin(head, room=LEGEND_PX)
    fig.update_layout(title=head, height=LEVEL_PX * (2 * n_layers + 2) + top + bottom,
                      margin=dict(t=top, l=50, r=10, b=bottom), plot_bgcolor="white",
                      legend=dict(orientation="h", yanchor="bottom", y=1.01, xanchor="left", x=0),
                      hovermode="closest", clickmode="event+select", dragmode="pan")
    return fig


def _width(share: float) -> int:
    """A line's width for a share: 1 px at the smallest, 8 px for a whole update."""
    return int(np.clip(round(1 + 7 * share), 1, 8))
