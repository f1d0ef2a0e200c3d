"""A circuit drawn layer by layer (the input below, heads and MLPs in their layers, the logits above; edges coloured
by sign, wider by |score|, dashed by the input they enter) and its faithfulness against its size."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from models import head_label

from .figures import safe, top_margin, wrapped_title

POSITIVE, NEGATIVE = "#1f5fa8", "#c0392b"   # an edge that carries the task, one that works against it
DASHES = {"q": "solid", "k": "dash", "v": "dot", "mlp": "solid", "logits": "solid"}
KIND_NAMES = {"q": "into a query", "k": "into a key", "v": "into a value", "mlp": "into an MLP", "logits": "into the logits"}
WIDTHS = (1.0, 2.5, 5.0)   # line widths of the thirds of |score|
NODE_COLOURS = {"head": "#4c78a8", "mlp": "#72b7b2", "input": "#666666", "logits": "#666666"}


def node_xy(node: tuple, n_layers: int, n_heads: int, reads=None) -> tuple[float, float]:
    """Where a node is drawn: a head at (head, layer), a layer's MLP right of its heads half a layer up, a
    key/value input at the middle of the heads reading it, the input below the middle and the logits above."""
    kind, layer, index = node
    middle = (n_heads - 1) / 2 + 0.5
    if kind == "head":
        return float(index), float(layer)
    if kind == "kv":
        heads = reads[layer][index]
        return float(np.mean(heads)), float(layer) - 0.18
    if kind == "mlp":
        return float(n_heads) + 0.3, float(layer) + 0.45
    return middle, (-1.3 if kind == "input" else n_layers + 0.3)


def hover_point(start: tuple[float, float], end: tuple[float, float]) -> tuple[float, float]:
    """Where an edge's hover sits: its middle, moved along it to a third of a layer off the nearest layer's row where
    it falls nearer than that (an edge spanning two layers would sit on the head between its ends, and a click meant
    for that head would open the edge)."""
    (x0, y0), (x1, y1) = start, end
    t, middle = 0.5, (y0 + y1) / 2
    row = round(middle)
    if y1 != y0 and abs(middle - row) < 1 / 3:
        t = float(np.clip((row + (1 / 3 if middle >= row else -1 / 3) - y0) / (y1 - y0), 0.15, 0.85))
    return x0 + t * (x1 - x0), y0 + t * (y1 - y0)


def circuit_figure(frame: pd.DataFrame, graph, n_heads: int, *, title: str = "", height: int | None = None,
                   value_name: str = "score") -> go.Figure:
    """The edges of ``frame`` (``analysis.circuits.EdgeScores.frame``'s rows) between their nodes. Each head node's
    ``customdata`` is ``[layer, head]`` (a click opens it); each edge's hover names it and its score."""
    L = graph.n_layers
    fig = go.Figure()
    if len(frame):
        top = float(frame.score.abs().max()) or 1.0
        third = np.minimum((frame.score.abs().to_numpy() / top * 3).astype(int), 2)
        for kind in DASHES:
            for sign, colour in ((1, POSITIVE), (-1, NEGATIVE)):
                for w in range(3):
                    part = frame[(frame.kind == kind) & (np.sign(frame.score) == sign) & (third == w)]
                    if part.empty:
                        continue
                    xs, ys = [], []
                    for s, r in zip(part.sender_index, part.receiver_index):
                        (x0, y0), (x1, y1) = (node_xy(graph.senders[s], L, n_heads),
                                              node_xy(graph.receiver_node(r), L, n_heads, graph.reads))
                        xs += [x0, x1, None]
                        ys += [y0, y1, None]
                    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                             line=dict(color=colour, width=WIDTHS[w], dash=DASHES[kind]),
                                             opacity=0.75))
        # an invisible point near each edge's middle carries its hover, off the layers' rows of heads
        mids = [hover_point(node_xy(graph.senders[s], L, n_heads),
                            node_xy(graph.receiver_node(r), L, n_heads, graph.reads))
                for s, r in zip(frame.sender_index, frame.receiver_index)]
        text = [f"{safe(a)} → {safe(b)}<br>{safe(value_name)} {v:+.3f} ({sh:+.1%} of the clean − corrupted span)"
                for a, b, v, sh in zip(frame.sender, frame.receiver, frame.score, frame.share)]
        fig.add_trace(go.Scatter(x=[m[0] for m in mids], y=[m[1] for m in mids], mode="markers", name="edges",
                                 showlegend=False, text=text, hovertemplate="%{text}<extra></extra>",
                                 marker=dict(size=8, color="rgba(0,0,0,0)")))
    nodes = _nodes(frame, graph)
    for kind in ("input", "mlp", "logits", "head"):
        part = [n for n in nodes if n[0] == kind]
        if not part:
            continue
        xy = [node_xy(n, L, n_heads) for n in part]
        label = {"head": lambda n: head_label(n[1], n[2]), "mlp": lambda n: f"MLP {n[1]}",
                 "input": lambda n: "input", "logits": lambda n: graph.output}[kind]
        fig.add_trace(go.Scatter(
            x=[p[0] for p in xy], y=[p[1] for p in xy], mode="markers+text", name=kind,
            text=[label(n) for n in part], textposition="middle right", textfont=dict(size=10),
            customdata=[[n[1], n[2]] for n in part] if kind == "head" else None,
            hovertemplate="%{text}" + ("<br>click to open its card" if kind == "head" else "") + "<extra></extra>",
            marker=dict(size=12 if kind == "head" else 14, color=NODE_COLOURS[kind],
                        symbol={"head": "circle", "mlp": "square", "input": "diamond", "logits": "star"}[kind],
                        line=dict(width=1, color="#222")), showlegend=False))
    for kind, dash in (("q", "solid"), ("k", "dash"), ("v", "dot")):  # a legend of what the dashes mean
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{KIND_NAMES[kind]}",
                                 line=dict(color="#555", dash=dash, width=2)))
    for colour, name in ((POSITIVE, "carries the task"), (NEGATIVE, "works against it")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=name, line=dict(color=colour, width=3)))
    head = wrapped_title(title, 70)
    fig.update_layout(title=head, height=height or max(480, 26 * (L + 3)), plot_bgcolor="white",
                      margin=dict(t=top_margin(head), l=70, r=20, b=80), clickmode="event+select", dragmode="pan",
                      hovermode="closest",
                      legend=dict(orientation="h", yanchor="top", y=-0.06, x=0, font=dict(size=11)))
    fig.update_xaxes(title="head", range=[-0.7, n_heads + 1.6], tickmode="array", tickvals=list(range(n_heads)),
                     showgrid=False, zeroline=False)
    fig.update_yaxes(title="layer", range=[-2, L + 1], tickmode="array", tickvals=list(range(L)), showgrid=True,
                     gridcolor="#f0f0f0", zeroline=False)
    return fig


def _nodes(frame: pd.DataFrame, graph) -> list[tuple]:
    """The nodes the edges touch (a key/value input drawn at its group, its heads not added), in drawing order."""
    out = []
    for s, r in zip(frame.sender_index, frame.receiver_index):
        for node in (graph.senders[s], graph.receiver_node(r)):
            if node[0] != "kv" and node not in out:
                out.append(node)
    return out


def curve_figure(curve: pd.DataFrame, *, target: float = 0.8, smallest: int | None = None, chosen: int | None = None,
                 title: str = "") -> go.Figure:
    """Faithfulness (``curve``: edges, faithfulness, low, high) against the circuit's size, log-scaled, with its
    95% interval as a band, the target as a line and the circuit shown marked."""
    fig = go.Figure()
    x = curve.edges.clip(lower=1)
    fig.add_trace(go.Scatter(x=list(x) + list(x[::-1]), y=list(curve.high) + list(curve.low[::-1]), fill="toself",
                             fillcolor="rgba(31,95,168,0.15)", line=dict(width=0), hoverinfo="skip",
                             name="95% interval"))
    fig.add_trace(go.Scatter(x=x, y=curve.faithfulness, mode="lines+markers", name="faithfulness",
                             line=dict(color=POSITIVE), customdata=np.c_[curve.low, curve.high],
                             hovertemplate="%{x:,} edges: %{y:.1%} [%{customdata[0]:.1%}, %{customdata[1]:.1%}]"
                                           "<extra></extra>"))
    fig.add_hline(y=target, line=dict(color="#888", dash="dash", width=1),
                  annotation_text=f"{target:.0%}", annotation_position="bottom right")
    for n, name, symbol in ((smallest, f"smallest reaching {target:.0%}", "star"), (chosen, "the circuit drawn", "circle-open")):
        if n is not None and n in set(curve.edges):
            y = float(curve.faithfulness[curve.edges == n].iloc[0])
            fig.add_trace(go.Scatter(x=[max(n, 1)], y=[y], mode="markers", name=name,
                                     marker=dict(symbol=symbol, size=14, color="#111", line=dict(width=2))))
    head = wrapped_title(title, 70)
    fig.update_layout(title=head, height=380, plot_bgcolor="white", margin=dict(t=top_margin(head), l=70, r=20, b=90),
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0, font=dict(size=11)))
    fig.update_xaxes(title="edges in the circuit", type="log", showgrid=True, gridcolor="#eee")
    fig.update_yaxes(title="faithfulness", tickformat=".0%", showgrid=True, gridcolor="#eee", zeroline=True,
                     zerolinecolor="#bbb")
    return fig
