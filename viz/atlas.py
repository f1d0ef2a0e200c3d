"""Every head of a model as a point (the atlas), and the small figures of one head's card."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .figures import safe, top_margin, wrapped_title
from .grids import ROLE_COLORS, SYNTAX_COLOR

HALF_TITLE = 38  # title characters a line in a chart half a 1024 px window wide


FAMILY_COLORS = {"positional": "#1f77b4", "lexical": "#d62728", "syntactic": "#2ca02c", "focus": "#9467bd"}
UNION_COLORS = ("#17becf", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f")  # the families of a union


def _colour(role: str, column: str = "role", order: int = 0) -> str:
    if column == "rule_family":
        return FAMILY_COLORS.get(role, UNION_COLORS[order % len(UNION_COLORS)])
    colour = ROLE_COLORS.get(role, SYNTAX_COLOR)
    return "#e3e3e3" if colour == "#ffffff" else colour  # a white point on white would vanish


def _sizes(values: np.ndarray | None, n: int) -> np.ndarray:
    """Marker diameters from 6 to 26 px by ``|values|`` over their largest; 9 px each without values."""
    if values is None:
        return np.full(n, 9.0)
    size = np.abs(np.nan_to_num(values.astype(float)))
    top = size.max() or 1.0
    return 6 + 20 * size / top


def atlas_scatter(frame: pd.DataFrame, x: str, y: str, *, colour: str = "role", size: str | None = "effect",
                  labels: dict[str, str] | None = None, title: str = "", marked: tuple[int, int] | None = None,
                  height: int = 560, title_chars: int = HALF_TITLE) -> go.Figure:
    """Each head of ``frame`` (``analysis.cards.atlas``) at ``(x, y)``, coloured by ``colour`` (a role column), sized by
    ``|size|``; hover names the head, its role, its rule and its figures. Every point's ``customdata`` is ``[layer, head]``
    (a click opens that head); ``marked`` is ringed."""
    labels = labels or {}
    shown = [c for c in dict.fromkeys([x, y, *([size] if size else [])]) if c in frame]
    sizes = _sizes(frame[size].to_numpy() if size and size in frame else None, len(frame))
    fig = go.Figure()
    unions = 0
    for role in sorted(frame[colour].astype(str).unique()):
        part = (frame[colour].astype(str) == role).to_numpy()
        rows = frame[part]
        text = ["<br>".join([f"<b>{r['name']}</b> · {safe(role)}",
                             *([f"rule: {safe(r['rule'])} ({r['explained']:.2f} held out)"]
                               if "rule" in r and isinstance(r["rule"], str) else []),
                             *(f"{safe(labels.get(c, c))}: {r[c]:.3f}" for c in shown)]) for _, r in rows.iterrows()]
        tint = _colour(role, colour, unions)
        unions += colour == "rule_family" and role not in FAMILY_COLORS
        fig.add_trace(go.Scatter(
            x=rows[x], y=rows[y], mode="markers", name=safe(role), text=text,
            customdata=rows[["layer", "head"]].to_numpy(), hovertemplate="%{text}<br>click to open its card<extra></extra>",
            marker=dict(color=tint, size=sizes[part], line=dict(width=0.5, color="#333"), opacity=0.85)))
    if marked is not None:
        row = frame[(frame["layer"] == marked[0]) & (frame["head"] == marked[1])]
        if not row.empty:
            fig.add_trace(go.Scatter(x=row[x], y=row[y], mode="markers", name="this head", hoverinfo="skip",
                                     marker=dict(symbol="circle-open", size=30, color="#000", line=dict(width=2))))
    head = wrapped_title(title, title_chars)
    fig.update_layout(title=head, height=height, margin=dict(t=top_margin(head), l=60, r=10, b=100),
                      plot_bgcolor="white", clickmode="event+select", dragmode="pan", hovermode="closest",
                      legend=dict(orientation="h", yanchor="top", y=-0.14, x=0, font=dict(size=10)))
    fig.update_xaxes(title=safe(labels.get(x, x)), showgrid=True, gridcolor="#eee", zeroline=False)
    fig.update_yaxes(title=safe(labels.get(y, y)), showgrid=True, gridcolor="#eee", zeroline=False)
    return fig

