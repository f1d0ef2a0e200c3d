"""Figures of heads explained by rules: every head's held-out score on a layer x head grid, and what a model loses
when its best-explained heads are replaced by their programs, beside the same heads mean-ablated."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .figures import COLORSCALE, head_targets, safe, top_margin, wrapped_title

ROW_PX = 22
MEASURES = {"loss": "next-token loss (nats)", "cosine": "cosine to the unedited embedding"}


def explained_grid(frame: pd.DataFrame, *, threshold: float, lift: float = 0.0, title: str = "") -> go.Figure:
    """Each head's held-out score (``explain_heads``'s frame) as a cell, 0 to 1; a head at ``threshold`` or more,
    with a ``lift`` of at least that, is explained and marked with a dot; hover names its program's rules, score and
    lift; a click opens its card (``head_targets``)."""
    n_layers, n_heads = int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1
    score, lifted = np.full((n_layers, n_heads), np.nan), np.zeros((n_layers, n_heads), dtype=bool)
    tips = [[""] * n_heads for _ in range(n_layers)]
    for r in frame.itertuples():
        score[r.layer, r.head] = r.score
        lifted[r.layer, r.head] = r.lift >= lift
        tips[r.layer][r.head] = f"{safe(r.rule)}: {r.score:.2f} [{r.lo:.2f}, {r.hi:.2f}] held out, lift {r.lift:.1f}"
    fig = go.Figure(go.Heatmap(z=score, zmin=0, zmax=1, colorscale=COLORSCALE, xgap=1, ygap=1, hoverinfo="skip",
                               colorbar=dict(title=dict(text="held-out score", side="right"), thickness=12)))
    layer, head = np.nonzero((score >= threshold) & lifted)
    fig.add_trace(go.Scatter(x=head, y=layer, mode="markers", name="explained", hoverinfo="skip", showlegend=False,
                             marker=dict(size=4, color="#fff", line=dict(width=0.5, color="#333"))))
    head_targets(fig, n_layers, n_heads, [tips[l][h] for l in range(n_layers) for h in range(n_heads)],
                 action="open its card")
    fig.update_xaxes(tickmode="array", tickvals=list(range(n_heads)), ticktext=[f"H{h}" for h in range(n_heads)],
                     side="top", showgrid=False, ticks="", tickangle=0, tickfont=dict(size=9 if n_heads > 6 else 10))
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_layers)), ticktext=[f"L{l}" for l in range(n_layers)],
                     showgrid=False, ticks="")
    top = wrapped_title(title)
    fig.update_layout(title=top, height=ROW_PX * n_layers + top_margin(top, room=40) + 20,
                      margin=dict(t=top_margin(top, room=40), l=44, r=10, b=10), plot_bgcolor="white")
    return fig


def replacement_chart(curve: pd.DataFrame, *, title: str = "") -> go.Figure:
    """``replacement_curve``'s rows: the measure with the ``k`` best-explained heads replaced by their programs and
    mean-ablated, against ``k``, the unedited model's as a dashed line."""
    measure = str(curve["measure"].iloc[0])
    fig = go.Figure()
    for column, name, colour in (("replaced", "replaced by their programs", "#1f5fa8"),
                                 ("mean_ablated", "mean-ablated", "#c0392b")):
        fig.add_trace(go.Scatter(x=curve["k"], y=curve[column], mode="lines+markers", name=name,
                                 line=dict(color=colour, width=2),
                                 hovertemplate=f"{name}<br>%{{x}} heads: %{{y:.4f}}<extra></extra>"))
    fig.add_hline(y=float(curve["unedited"].iloc[0]), line=dict(color="#444", dash="dash", width=1),
                  annotation_text="unedited", annotation_position="bottom right")
    top = wrapped_title(title)
    fig.update_layout(title=top, height=380, margin=dict(t=top_margin(top), l=60, r=10, b=90), plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.25, yanchor="top", x=0))
    fig.update_xaxes(title="best-explained heads replaced (k)", showgrid=True, gridcolor="#eee")
    fig.update_yaxes(title=MEASURES.get(measure, measure), showgrid=True, gridcolor="#eee")
    return fig
