"""Figures of a training run: the loss and each head's scores over the steps."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from models import head_label

from .figures import wrapped_title

SCORES = {"prev_token": "previous-token score", "induction": "induction score"}


def head_colour(layer: int, head: int, n_heads: int) -> str:
    palette = qualitative.Dark24
    return palette[(layer * n_heads + head) % len(palette)]


def training_curves(history: pd.DataFrame, *, title: str = "", height: int = 640) -> go.Figure:
    """Three panels over the logged steps: the training loss, then each head's previous-token and
    induction score (one line a head, the same colour in both; layer 0's heads dashed)."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["training loss (mean over the steps since the last point)",
                                        *(f"{name} of each head" for name in SCORES.values())])
    loss = history.groupby("step", sort=True)["loss"].first().dropna()
    fig.add_trace(go.Scatter(x=loss.index.to_list(), y=loss.to_list(), mode="lines", name="loss",
                             line=dict(color="#444444"), showlegend=False,
                             hovertemplate="step %{x}<br>loss %{y:.3f}<extra></extra>"), row=1, col=1)
    n_heads = int(history["head"].max()) + 1 if len(history) else 1
    for (layer, head), rows in history.groupby(["layer", "head"], sort=True):
        rows = rows.sort_values("step")
        name = head_label(layer, head)
        style = dict(color=head_colour(int(layer), int(head), n_heads), dash="dash" if layer == 0 else "solid")
        for row, column in enumerate(SCORES, start=2):
            fig.add_trace(go.Scatter(x=rows["step"].to_list(), y=rows[column].to_list(), mode="lines", name=name,
                                     legendgroup=name, showlegend=row == 2, line=style,
                                     hovertemplate=f"{name}<br>step %{{x}}<br>{SCORES[column]} %{{y:.2f}}<extra></extra>"),
                          row=row, col=1)
    for row in (2, 3):
        fig.update_yaxes(range=[0, 1], row=row, col=1)
    fig.update_xaxes(title_text="step", row=3, col=1)
    head = wrapped_title(title)
    fig.update_layout(title=head, height=height, margin=dict(t=90 if title else 40, l=50, r=10, b=50),
                      legend=dict(title="head", orientation="v"), hovermode="closest")
    return fig
