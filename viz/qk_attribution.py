"""Why a head attends there (``analysis.qk_attribution``): the top query-side writers against the top key-side
writers, each cell's part of the score; and each side's writers as bars that a click turns into their card."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .figures import DIVERGING, safe, top_margin, wrapped_title

BLUE, RED = "#2166ac", "#b2182b"


def writer_grid(rows: list[str], cols: list[str], parts: np.ndarray, score: float, *, title: str = "",
                height: int = 430) -> go.Figure:
    """``parts`` ``(len(rows), len(cols))``: query-side writers on rows, key-side writers on columns, centred on 0
    (blue raises the score, red lowers it); each cell's hover gives its part and its share of ``score``."""
    bound = float(np.abs(parts).max()) or 1.0
    share = parts / score if score else np.full(parts.shape, np.nan)
    text = [[f"{v:+.2f}" for v in row] for row in parts]
    x, y = [safe(c) for c in cols], [safe(r) for r in rows]
    fig = go.Figure(go.Heatmap(
        z=parts, x=x, y=y, colorscale=DIVERGING, zmid=0, zmin=-bound, zmax=bound, name="parts",
        text=text, texttemplate="%{text}", customdata=share, xgap=1, ygap=1,
        colorbar=dict(title="part", thickness=12),
        hovertemplate="query side: %{y}<br>key side: %{x}<br>part: %{z:+.3f}<br>share of the score: "
                      "%{customdata:.1%}<extra></extra>"))
    head = wrapped_title(title)
    left = 8 + 7 * max(len(r) for r in y)
    fig.update_layout(title=head, height=height, margin=dict(t=top_margin(head, room=40), l=left, r=10, b=90),
                      xaxis=dict(title="key side", tickangle=-40, side="bottom", type="category"),
                      yaxis=dict(title="query side", autorange="reversed", type="category"))
    return fig


def writer_bars(sides: dict[str, tuple[list[str], np.ndarray, list]], *, title: str = "",
                height: int = 380) -> go.Figure:
    """One panel of horizontal bars per side (``{"Query side": (writers, parts, nodes)}``), largest first; a
    head's bar carries ``[layer, head]`` as its customdata (a click opens its card), other writers none."""
    fig = make_subplots(rows=1, cols=len(sides), subplot_titles=list(sides), horizontal_spacing=0.22)
    for i, (name, (writers, parts, nodes)) in enumerate(sides.items()):
        data = [[layer, head] if kind == "head" else None for kind, layer, head in nodes]
        fig.add_trace(go.Bar(
            x=parts, y=[safe(w) for w in writers], orientation="h", name=name, showlegend=False,
            marker_color=[BLUE if p >= 0 else RED for p in parts], customdata=data,
            hovertemplate="%{y}: %{x:+.3f}<extra></extra>"), row=1, col=i + 1)
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=i + 1)
        fig.update_xaxes(title_text="part of the score", zeroline=True, row=1, col=i + 1)
    head = wrapped_title(title)
    fig.update_layout(title=head, height=height, margin=dict(t=top_margin(head, room=40), l=80, r=10, b=50),
                      bargap=0.25)
    return fig


def cell_targets(fig: go.Figure, heads: list[int], visible: np.ndarray | None, cols: int = 4) -> None:
    """Invisible markers over each cell a query sees in a head grid (``head_grid``, unpooled, its first traces the
    heads' heatmaps in order), the trace "cells", customdata ``[head, query, key]``: a click on one is a click on
    that weight."""
    for i, h in enumerate(heads):
        grid = fig.data[i]
        q_cats, k_cats = list(grid.y), list(grid.x)
        cells = [(q, k) for q in range(len(q_cats)) for k in range(len(k_cats))
                 if visible is None or visible[q, k]]
        z = np.asarray(grid.z, dtype=np.float64)
        fig.add_trace(go.Scatter(
            x=[k_cats[k] for _, k in cells], y=[q_cats[q] for q, _ in cells], mode="markers", name="cells",
            showlegend=False, marker=dict(symbol="square", size=8, color="rgba(0,0,0,0)"),
            customdata=[[h, q, k] for q, k in cells],
            # the grid's categories are escaped already (``block_categories``)
            text=[f"{q_cats[q]} → {k_cats[k]}<br>weight {z[q, k]:.3f}<br>click: why it attends here"
                  for q, k in cells], hovertemplate="%{text}<extra>head " + str(h) + "</extra>"),
            row=i // cols + 1, col=i % cols + 1)
