"""Figures of which heads make a prediction: a layer x head grid centred on zero, the residual stream
patched by position, and one head's effect at each position."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .figures import DIVERGING, _tick, safe, top_margin, wrapped_title

HALF_TITLE = 38  # title characters a line in a chart half a 1024 px window wide

ROW_PX = 22  # a layer's row in a grid: SmolLM2's 30 layers fit in about 800 px


def _bound(values: np.ndarray, zmax: float | None) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(zmax or (finite.max() if finite.size else 0.0) or 1.0)


def effect_grid(values: np.ndarray, *, title: str = "", value_name: str = "recovered", zmax: float | None = None,
                digits: int = 2, selected: tuple[int, int] | None = None) -> go.Figure:
    """Layer x head cells of ``values`` ``(layers, heads)`` on a red-blue scale centred on zero; hover names the
    head, its value and its rank by size (a cell is too narrow for its number in half a 1024 px window, so
    the page lists the strongest heads in a table); ``selected`` is outlined. An
    invisible marker over each cell (the trace "heads", point ``layer * heads + head``) takes clicks."""
    n_layers, n_heads = values.shape
    bound = _bound(values, zmax)
    order = np.argsort(-np.abs(np.nan_to_num(values)), axis=None, kind="stable")
    rank = np.empty(values.size, dtype=int)
    rank[order] = np.arange(1, values.size + 1)
    rank = rank.reshape(values.shape)
    tips = [[f"{value_name} {values[l, h]:+.{digits + 2}f}, rank {rank[l, h]} of {values.size} by size"
             for h in range(n_heads)] for l in range(n_layers)]
    fig = go.Figure(go.Heatmap(
        z=values, zmin=-bound, zmax=bound, zmid=0, colorscale=DIVERGING, reversescale=True, customdata=tips,
        xgap=1, ygap=1,
        colorbar=dict(title=dict(text=safe(value_name), side="right"), thickness=12),
        hovertemplate="layer %{y}, head %{x}<br>%{customdata}<extra></extra>"))
    layer_of, head_of = np.divmod(np.arange(values.size), n_heads)
    fig.add_trace(go.Scatter(  # click targets: plotly selects points of a scatter, not cells of a heatmap
        x=head_of, y=layer_of, mode="markers", name="heads", showlegend=False,
        marker=dict(symbol="square", size=14, color="rgba(0,0,0,0)"),
        customdata=[[int(l), int(h)] for l, h in zip(layer_of, head_of)],
        text=[tips[l][h] for l, h in zip(layer_of, head_of)],
        hovertemplate="layer %{y}, head %{x}<br>%{text}<br>click to open this head<extra></extra>"))
    if selected is not None:
        layer, head = selected
        fig.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=layer - 0.5, y1=layer + 0.5,
                      line=dict(color="#111", width=2))
    fig.update_xaxes(tickmode="array", tickvals=list(range(n_heads)), ticktext=[f"H{h}" for h in range(n_heads)],
                     side="top", showgrid=False, ticks="", zeroline=False)
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_layers)), ticktext=[f"L{l}" for l in range(n_layers)],
                     autorange="reversed", showgrid=False, ticks="", zeroline=False)
    head = wrapped_title(title, HALF_TITLE)
    fig.update_layout(title=head, height=ROW_PX * n_layers + top_margin(head, room=40) + 20,
                      margin=dict(t=top_margin(head, room=40), l=44, r=10, b=10), plot_bgcolor="white",
                      clickmode="event+select", dragmode="pan")
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
