"""Figures of which heads matter: a layer x head grid of values, and pruning curves."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .figures import COLORSCALE, wrapped_title

ORDER_STYLE = {
    "importance": dict(name="by importance", color="#1f77b4", dash="solid"),
    "random": dict(name="at random (mean of 3 seeds)", color="#7f7f7f", dash="dot"),
    "proxy": dict(name="by attention alone", color="#ff7f0e", dash="dash"),
}
PRUNED_COLOR = "#d9d9d9"


def head_values_grid(values: np.ndarray, *, marked: np.ndarray | None = None, mark: str = "pruned",
                     mark_text: str | None = None, title: str = "", value_name: str = "importance",
                     digits: int = 3) -> go.Figure:
    """Layer x head cells shaded by ``values`` ``(layers, heads)``, each cell giving its value.

    Cells where ``marked`` is True are drawn grey and show ``mark_text`` (default ``mark``; hover
    says ``mark``); other NaN cells (a head the
    model no longer has) say "gone". Hover names the head, its value and its rank (1 = the largest).
    """
    n_layers, n_heads = values.shape
    finite = np.isfinite(values)
    order = np.argsort(-np.where(finite, values, -np.inf), axis=None, kind="stable")
    rank = np.empty(values.size, dtype=int)
    rank[order] = np.arange(1, values.size + 1)
    rank = rank.reshape(values.shape)
    marked = np.zeros(values.shape, dtype=bool) if marked is None else np.asarray(marked, dtype=bool)
    text = [[((mark if mark_text is None else mark_text) if marked[l, h] else "gone" if not finite[l, h] else f"{values[l, h]:.{digits}f}")
             for h in range(n_heads)] for l in range(n_layers)]
    tips = [[(f"{value_name} {values[l, h]:.{digits + 1}f}, rank {rank[l, h]} of {int(finite.sum())}<br>"
              if finite[l, h] else "" if marked[l, h] else "no longer in the model") + (mark if marked[l, h] else "")
             for h in range(n_heads)] for l in range(n_layers)]
    top = float(np.nanmax(values)) if finite.any() else 1.0
    under = [["" if marked[l, h] or not finite[l, h] else text[l][h] for h in range(n_heads)] for l in range(n_layers)]
    fig = go.Figure(go.Heatmap(
        z=np.where(finite, values, np.nan), zmin=0, zmax=top if top > 0 else 1.0, colorscale=COLORSCALE,
        text=under, texttemplate="%{text}", textfont=dict(size=10), customdata=tips, xgap=2, ygap=2,
        colorbar=dict(title=dict(text=value_name, side="right"), thickness=12),
        hovertemplate="layer %{y}, head %{x}<br>%{customdata}<extra></extra>"))
    if marked.any() or not finite.all():
        grey = np.where(marked | ~finite, 1.0, np.nan)
        grey_text = [[text[l][h] if marked[l, h] or not finite[l, h] else "" for h in range(n_heads)]
                     for l in range(n_layers)]
        fig.add_trace(go.Heatmap(z=grey, colorscale=[[0, PRUNED_COLOR], [1, PRUNED_COLOR]], showscale=False,
                                 text=grey_text, texttemplate="%{text}", textfont=dict(size=10, color="#444"),
                                 customdata=tips, xgap=2, ygap=2, zmin=0, zmax=1,
                                 hovertemplate="layer %{y}, head %{x}<br>%{customdata}<extra></extra>"))
    fig.update_xaxes(tickmode="array", tickvals=list(range(n_heads)), ticktext=[f"H{h}" for h in range(n_heads)],
                     side="top", showgrid=False, ticks="", zeroline=False)
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_layers)), ticktext=[f"L{l}" for l in range(n_layers)],
                     autorange="reversed", showgrid=False, ticks="", zeroline=False)
    head = wrapped_title(title)
    fig.update_layout(title=head, height=44 * n_layers + 150, margin=dict(t=90, l=40, r=10, b=10),
                      plot_bgcolor="white")
    return fig


EMBEDDING_MEASURES = (("fidelity", "Fidelity (mean cosine)"), ("agreement", "Neighbour agreement"))


def pruning_curves(summary, *, at: float | None = None, title: str = "", measures=None) -> go.Figure:
    """Two measures (by default fidelity and neighbour agreement) and forward time (relative to the
    full model) against the share of heads pruned, one line per order; ``at`` (a fraction) draws a
    dashed line there.

    ``summary`` is ``curve_summary``'s: ``order``, ``fraction``, ``forward_s`` and each measure's
    column; ``measures`` are ``(column, name, …)``, for a language model next-token loss and top-1 agreement.
    """
    (first, first_name, *_), (second, second_name, *_) = measures or EMBEDDING_MEASURES
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=(first_name, second_name, "Forward time / full"))
    fig.update_annotations(font=dict(size=13))
    for order, style in ORDER_STYLE.items():
        part = summary[summary["order"] == order].sort_values("fraction")
        if part.empty:
            continue
        x = (100 * part["fraction"]).round(1).tolist()
        full_s = float(part["forward_s"].iloc[0]) or 1.0
        for col, y, fmt in ((1, part[first], ".3f"), (2, part[second], ".2f"),
                            (3, part["forward_s"] / full_s, ".2f")):
            fig.add_trace(go.Scatter(
                x=x, y=y.tolist(), mode="lines+markers", name=style["name"], legendgroup=order, showlegend=col == 1,
                line=dict(color=style["color"], dash=style["dash"], width=2), marker=dict(size=5),
                hovertemplate=f"{style['name']}<br>%{{x:.0f}}% pruned: %{{y:{fmt}}}<extra></extra>"), row=1, col=col)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="% of heads pruned", range=[-3, 103], row=1, col=col)
        if at is not None:
            fig.add_vline(x=100 * at, line=dict(color="#444", dash="dash", width=1), row=1, col=col)
    fig.update_yaxes(rangemode="tozero", row=1, col=3)
    head = wrapped_title(title)
    fig.update_layout(title=head, height=440, margin=dict(t=110, l=50, r=10, b=80),
                      legend=dict(orientation="h", y=-0.3, yanchor="top", x=0, xanchor="left"),
                      plot_bgcolor="white")
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    fig.update_yaxes(showgrid=True, gridcolor="#eee")
    return fig
