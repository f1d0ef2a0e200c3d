"""Figures of effects over a task's pairs: a head grid of means with the significant heads marked, one head's
per-pair values as a strip, its attention from the last token to each role, and a metric against heads kept."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .effects import HALF_TITLE, effect_grid
from .figures import safe, top_margin, wrapped_title

MARK = "#111"


def task_grid(mean: np.ndarray, low: np.ndarray, high: np.ndarray, q: np.ndarray, significant: np.ndarray, *,
              value_name: str, title: str = "", selected: tuple[int, int] | None = None) -> go.Figure:
    """``effect_grid`` of the means ``(layers, heads)``, each cell's hover giving its 95% interval and q, and a
    dot on each head whose q passes (the trace "significant")."""
    L, H = mean.shape
    tips = [[f"{value_name} {mean[l, h]:+.3f}, 95% interval [{low[l, h]:+.3f}, {high[l, h]:+.3f}]<br>"
             f"q = {q[l, h]:.3g}{' (significant)' if significant[l, h] else ''}" for h in range(H)] for l in range(L)]
    fig = effect_grid(mean, value_name=value_name, title=title, selected=selected, tips=tips)
    layer, head = np.nonzero(significant)
    fig.add_trace(go.Scatter(x=head, y=layer, mode="markers", name="significant", showlegend=False,
                             marker=dict(symbol="circle", size=5, color=MARK), hoverinfo="skip"))
    return fig


def strip_figure(values: np.ndarray, groups: list[str], *, value_name: str, title: str = "",
                 texts: list[str] | None = None) -> go.Figure:
    """Each pair's value as a point, one column per group (its box behind), hover naming the pair."""
    fig = go.Figure()
    for group in sorted(set(groups)):
        idx = [i for i, g in enumerate(groups) if g == group]
        fig.add_trace(go.Box(
            y=values[idx], name=safe(group), boxpoints="all", jitter=0.5, pointpos=0, marker=dict(size=5),
            line=dict(width=1), text=None if texts is None else [safe(texts[i]) for i in idx],
            hovertemplate=f"%{{text}}<br>{safe(value_name)} %{{y:+.3f}}<extra></extra>" if texts else None))
    fig.add_hline(y=0, line=dict(color="#888", width=1))
    head = wrapped_title(title, HALF_TITLE)
    fig.update_layout(title=head, height=360, showlegend=False, yaxis_title=safe(value_name),
                      margin=dict(t=top_margin(head), l=60, r=10, b=40), plot_bgcolor="white")
    return fig


def role_bars(mean: np.ndarray, low: np.ndarray, high: np.ndarray, roles: list[str], *, title: str = "") -> go.Figure:
    """A head's mean attention from the last token to each role's token, with 95% intervals."""
    fig = go.Figure(go.Bar(
        x=[safe(r) for r in roles], y=mean, marker_color="#4c78a8",
        error_y=dict(type="data", symmetric=False, array=high - mean, arrayminus=mean - low, thickness=1),
        hovertemplate="END → %{x}: %{y:.3f}<extra></extra>"))
    head = wrapped_title(title, HALF_TITLE)
    fig.update_layout(title=head, height=360, yaxis=dict(title="attention", range=[0, 1]),
                      margin=dict(t=top_margin(head), l=60, r=10, b=60), plot_bgcolor="white")
    return fig


def kept_curve(curves: dict[str, tuple[np.ndarray, np.ndarray]], *, value_name: str, title: str = "",
               full: float | None = None) -> go.Figure:
    """The task's metric against the number of heads kept, one line per ranking; ``full``: the whole model's."""
    fig = go.Figure()
    for name, (kept, values) in curves.items():
        fig.add_trace(go.Scatter(x=kept, y=values, mode="lines+markers", name=safe(name),
                                 hovertemplate=f"{safe(name)}<br>%{{x}} heads kept: %{{y:.3f}}<extra></extra>"))
    if full is not None:
        fig.add_hline(y=full, line=dict(color="#888", dash="dot", width=1), annotation_text="every head",
                      annotation_position="bottom right")
    head = wrapped_title(title)
    fig.update_xaxes(type="category")  # 0, 1, 2, 5 … every head: evenly spaced, as the counts are chosen
    fig.update_layout(title=head, height=380, xaxis_title="heads kept (the rest mean-ablated)",
                      yaxis_title=safe(value_name), legend=dict(orientation="h", y=-0.25),
                      margin=dict(t=top_margin(head), l=60, r=10, b=90), plot_bgcolor="white")
    return fig
