"""Plotly figures of attention: arrays and labels in, ``go.Figure`` out.

Every label is HTML-escaped: plotly renders a subset of HTML in text (tick labels, hover,
titles), and tokens come from what a user typed. Axes are categorical with one category per
position (``"3: the"``), so repeated words stay apart, and the tick text shows the token alone.
"""
from __future__ import annotations

import base64
import html
import io
import math

import numpy as np
import plotly.colors as pc
import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLORSCALE = "Blues"
DIVERGING = "RdBu"
MAX_TICKS = 64  # beyond this many tokens an axis shows no tick labels (hover still names them)
TICK_CHARS = 12  # longer tick labels are cut; hover shows them whole
GRID_LABELS = 20  # most tick labels on an axis of a grid cell (about 12 px a label)
SINGLE_LABELS = 40  # most on an axis of a figure with one heatmap
TICK_PX = 6.5  # width of one character of a 10 px tick label, for margins fixed in advance


# Control characters become visible symbols (a NUL would also break an SVG export); bidi
# overrides and isolates, which would reorder the text after them, are dropped. Joiners stay:
# emoji sequences and several scripts need them.
_WHITESPACE = dict.fromkeys(map(ord, "\t\n\r"), " ")
_C0 = {c: chr(0x2400 + c) for c in range(0x20) if chr(c) not in "\t\n\r"}
_OTHER_CONTROLS = {0x7F: "\u2421", **dict.fromkeys(range(0x80, 0xA0), "\ufffd")}
_BIDI = dict.fromkeys(map(ord, "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"), None)
_DISPLAY = {**_WHITESPACE, **_C0, **_OTHER_CONTROLS, **_BIDI}


def visible(text: str) -> str:
    """``text`` with control characters shown as symbols and bidi overrides removed."""
    return text.translate(_DISPLAY)


def safe(text: str) -> str:
    """Text as plotly should show it, literally: visible, then HTML-escaped."""
    return html.escape(visible(text), quote=False)


def categories(labels: list[str]) -> list[str]:
    return [f"{i}: {safe(label)}" for i, label in enumerate(labels)]


def _tick(label: str) -> str:
    return safe(label if len(label) <= TICK_CHARS else label[: TICK_CHARS - 1] + "…")


def tick_step(n: int, max_labels: int) -> int:
    """Label every ``step``-th token so that at most ``max_labels`` labels share an axis."""
    return max(1, math.ceil(n / max_labels))


def _axis(labels: list[str], cats: list[str], max_labels: int) -> dict:
    if len(labels) > MAX_TICKS:
        return dict(showticklabels=False, type="category", categoryorder="array", categoryarray=cats)
    step = tick_step(len(labels), max_labels)
    return dict(type="category", categoryorder="array", categoryarray=cats, tickmode="array",
                tickvals=cats[::step], ticktext=[_tick(label) for label in labels[::step]], tickfont=dict(size=10))


def _label_px(labels: list[str]) -> int:
    """Room that tick labels need beside an axis (rotated -60 degrees for x labels, about as tall)."""
    if len(labels) > MAX_TICKS or not labels:
        return 10
    return int(min(TICK_CHARS, max(len(label) for label in labels)) * TICK_PX) + 12


def _heatmap(w: np.ndarray, q_cats, k_cats, name: str, zmax: float | None, coloraxis: str | None = None,
             colorscale=COLORSCALE, zmid=None) -> go.Heatmap:
    return go.Heatmap(
        z=np.asarray(w, dtype=np.float32), x=k_cats, y=q_cats, name=name,
        coloraxis=coloraxis, colorscale=None if coloraxis else colorscale, zmin=None if zmid is not None else 0,
        zmax=zmax, zmid=zmid, showscale=False,
        hovertemplate="%{y} → %{x}<br>weight %{z:.3f}<extra>" + safe(name) + "</extra>")


def head_grid(weights: np.ndarray, query_labels: list[str], key_labels: list[str], heads: list[int], *,
              shared_scale: bool = True, title: str = "", cols: int = 4, cell_px: int = 260) -> go.Figure:
    """One heatmap per head of one layer: queries on rows, keys on columns.

    Args:
        weights: ``(heads_in_layer, n_queries, n_keys)``.
        heads: which heads to draw, in order.
        shared_scale: one colour scale for every head (0 to the largest weight shown), else
            each head from 0 to its own largest weight.
    """
    cols = max(1, min(cols, len(heads)))
    rows = math.ceil(len(heads) / cols)
    # Margins are fixed from the labels rather than measured by plotly (automargin): measuring
    # every subplot's ticks and laying out again costs more than drawing the heatmaps.
    x_room, y_room = _label_px(key_labels), _label_px(query_labels)
    width, height = 1100, rows * cell_px + 120
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"Head {h}" for h in heads],
                        horizontal_spacing=min(0.3 / cols, (y_room + 12) / width),
                        vertical_spacing=min(0.3 / rows, (x_room + 30) / height))
    q_cats, k_cats = categories(query_labels), categories(key_labels)
    zmax = float(weights[heads].max()) if heads else 1.0
    for i, h in enumerate(heads):
        w = weights[h]
        fig.add_trace(_heatmap(w, q_cats, k_cats, f"head {h}", None if shared_scale else float(w.max()) or 1.0,
                               coloraxis="coloraxis" if shared_scale else None), row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(**_axis(key_labels, k_cats, GRID_LABELS), tickangle=-60, automargin=False)
    fig.update_yaxes(**_axis(query_labels, q_cats, GRID_LABELS), autorange="reversed", automargin=False)
    if shared_scale:
        fig.update_layout(coloraxis=dict(colorscale=COLORSCALE, cmin=0, cmax=zmax or 1.0,
                                         colorbar=dict(title="weight", thickness=12)))
    fig.update_layout(title=dict(text=safe(title)), height=height,
                      margin=dict(t=90, l=y_room + 10, r=10, b=x_room + 10))
    return fig


def head_heatmap(weights: np.ndarray, query_labels: list[str], key_labels: list[str], *, title: str = "",
                 zmax: float | None = None, diverging: bool = False, height: int = 460) -> go.Figure:
    """A single ``(n_queries, n_keys)`` heatmap with its colour bar; diverging centres 0 (differences)."""
    q_cats, k_cats = categories(query_labels), categories(key_labels)
    if diverging:
        bound = zmax or float(np.abs(weights).max()) or 1.0
        trace = _heatmap(weights, q_cats, k_cats, "difference", None, colorscale=DIVERGING, zmid=0)
        trace.update(zmin=-bound, zmax=bound, reversescale=True)
    else:
        trace = _heatmap(weights, q_cats, k_cats, "weight", zmax if zmax is not None else float(weights.max()) or 1.0)
    trace.update(showscale=True, colorbar=dict(thickness=12))
    fig = go.Figure(trace)
    fig.update_xaxes(**_axis(key_labels, k_cats, SINGLE_LABELS), tickangle=-60)
    fig.update_yaxes(**_axis(query_labels, q_cats, SINGLE_LABELS), autorange="reversed")
    fig.update_layout(title=dict(text=safe(title)), height=height, margin=dict(t=60, l=10, r=10, b=10))
    return fig


def _lut(colorscale: str = COLORSCALE) -> np.ndarray:
    """256 RGB colours sampled along a plotly colour scale."""
    samples = pc.sample_colorscale(colorscale, np.linspace(0, 1, 256), colortype="tuple")
    return (np.array(samples) * 255).round().astype(np.uint8)


def _thumbnail(w: np.ndarray, size: int) -> np.ndarray:
    """A square map of ``size`` pixels or fewer: max-pooled when larger, repeated when smaller."""
    n_q, n_k = w.shape
    if max(n_q, n_k) > size:
        edges_q = np.unique(np.linspace(0, n_q, size + 1).astype(int))[:-1]
        edges_k = np.unique(np.linspace(0, n_k, size + 1).astype(int))[:-1]
        return np.maximum.reduceat(np.maximum.reduceat(w, edges_q, axis=0), edges_k, axis=1)
    f = max(1, size // max(n_q, n_k))
    return np.repeat(np.repeat(w, f, axis=0), f, axis=1)


def overview_png(weights: np.ndarray, *, shared_scale: bool = True, thumb: int = 96, gap: int = 6) -> tuple[bytes, int]:
    """All heads of all layers as one PNG: layers on rows, heads on columns.

    Returns the PNG bytes and the pitch in pixels from one thumbnail to the next.
    """
    from PIL import Image

    layers, heads = weights.shape[:2]
    tiles = [[_thumbnail(weights[l, h], thumb) for h in range(heads)] for l in range(layers)]
    t_h, t_w = tiles[0][0].shape
    pitch = max(t_h, t_w) + gap
    canvas = np.full((layers * pitch - gap, heads * pitch - gap, 3), 255, dtype=np.uint8)
    lut = _lut()
    top = float(weights.max()) or 1.0
    for l in range(layers):
        for h in range(heads):
            tile = tiles[l][h]
            scale = top if shared_scale else (float(tile.max()) or 1.0)
            idx = np.clip(tile / scale * 255, 0, 255).astype(np.uint8)
            canvas[l * pitch:l * pitch + t_h, h * pitch:h * pitch + t_w] = lut[idx]
    buf = io.BytesIO()
    Image.fromarray(canvas).save(buf, format="PNG", compress_level=6)
    return buf.getvalue(), pitch


def overview(weights: np.ndarray, stats: dict[str, np.ndarray], *, shared_scale: bool = True, title: str = "",
             thumb: int = 96) -> go.Figure:
    """Every layer x head as image thumbnails, one PNG rather than hundreds of SVG heatmaps.

    An invisible square marker over each thumbnail names its head and statistics on hover, and a
    click on it is reported as a point selection whose index is ``layer * heads + head``.
    """
    layers, heads = weights.shape[:2]
    png, pitch = overview_png(weights, shared_scale=shared_scale, thumb=thumb)
    width, height = heads * pitch, layers * pitch
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    fig = go.Figure(go.Image(source=uri, x0=0, y0=0, dx=1, dy=1, hoverinfo="skip"))
    centres_x = [h * pitch + (pitch - 1) / 2 for h in range(heads)]
    centres_y = [l * pitch + (pitch - 1) / 2 for l in range(layers)]
    # One invisible square marker over each thumbnail names it on hover and can be clicked.
    layer_of, head_of = np.divmod(np.arange(layers * heads), heads)
    custom = np.stack([layer_of, head_of, stats["entropy"].ravel(), stats["max_weight"].ravel(),
                       stats["to_special"].ravel()], axis=-1)
    fig.add_trace(go.Scatter(
        x=[centres_x[h] for h in head_of], y=[centres_y[l] for l in layer_of], mode="markers", name="heads",
        marker=dict(symbol="square", size=max(12, int(pitch * 0.6)), color="rgba(0,0,0,0)"), customdata=custom,
        showlegend=False, hovertemplate=("layer %{customdata[0]}, head %{customdata[1]}<br>entropy "
                                         "%{customdata[2]:.2f} nats<br>max %{customdata[3]:.2f}<br>to special "
                                         "%{customdata[4]:.2f}<br>click to open in Explore<extra></extra>")))
    fig.update_xaxes(tickmode="array", tickvals=centres_x, ticktext=[f"H{h}" for h in range(heads)],
                     showgrid=False, range=[-0.5, width - 0.5], side="top")
    fig.update_yaxes(tickmode="array", tickvals=centres_y, ticktext=[f"L{l}" for l in range(layers)],
                     showgrid=False, range=[height - 0.5, -0.5], scaleanchor="x")
    # the image keeps its aspect ratio; size the figure to it for a page about 1100 px wide
    fig.update_layout(title=dict(text=safe(title)), height=min(1000, int(1100 * height / width) + 130),
                      margin=dict(t=90, l=40, r=10, b=10))
    return fig


def token_lines(weights: np.ndarray, query_labels: list[str], key_labels: list[str], heads: list[int],
                query: int | None, *, title: str = "", levels: int = 8, floor: float = 0.02) -> go.Figure:
    """BertViz's head view: tokens in two columns, a line from query to key per head.

    Opacity follows the weight (in ``levels`` steps), colour the head. ``query=None`` draws every
    query's lines. Lines below ``floor`` times a head's largest weight are left out.

    Args:
        weights: ``(heads_in_layer, n_queries, n_keys)``.
    """
    palette = pc.qualitative.Plotly + pc.qualitative.D3
    n_q, n_k = len(query_labels), len(key_labels)
    fig = go.Figure()
    rows = range(n_q) if query is None else [query]
    for h in heads:
        w = weights[h]
        top = float(w[list(rows)].max()) or 1.0
        color = pc.hex_to_rgb(palette[h % len(palette)])
        for level in range(1, levels + 1):
            lo, hi = (level - 1) / levels, level / levels
            xs, ys = [], []
            for q in rows:
                share = w[q] / top
                for k in np.flatnonzero((share > max(lo, floor)) & (share <= hi)):
                    xs += [0, 1, None]
                    ys += [-q, -k, None]
            if xs:
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=level == levels,
                                         legendgroup=f"h{h}", name=f"head {h}",
                                         line=dict(width=2, color=f"rgba({color[0]},{color[1]},{color[2]},{hi:.3f})")))
    q_weight = None if query is None else weights[heads][:, query].mean(axis=0)
    fig.add_trace(go.Scatter(
        x=[0] * n_q, y=[-i for i in range(n_q)], mode="text", text=[safe(t) for t in query_labels],
        textposition="middle left", showlegend=False, name="queries",
        textfont=dict(color=["#d62728" if i == query else "#333" for i in range(n_q)], size=13),
        hovertemplate="%{text}<extra>query</extra>"))
    fig.add_trace(go.Scatter(
        x=[1] * n_k, y=[-i for i in range(n_k)], mode="text", text=[safe(t) for t in key_labels],
        textposition="middle right", showlegend=False, name="keys", textfont=dict(size=13),
        customdata=q_weight, hovertemplate="%{text}" + ("" if query is None else "<br>mean weight %{customdata:.3f}")
        + "<extra>key</extra>"))
    fig.update_xaxes(visible=False, range=[-0.9, 1.9])
    fig.update_yaxes(visible=False, range=[-max(n_q, n_k) + 0.5, 0.5])
    fig.update_layout(title=dict(text=safe(title)), height=max(360, 22 * max(n_q, n_k) + 170),
                      margin=dict(t=60, l=10, r=10, b=70), legend=dict(orientation="h", y=-0.02, yanchor="top"),
                      plot_bgcolor="white")
    return fig


def text_shading(labels: list[str], values: np.ndarray, *, title: str = "", highlight: int | None = None,
                 line_chars: int = 72) -> go.Figure:
    """The text as a strip of cells, each token shaded by its value, wrapped like a paragraph."""
    lines, current, width = [], [], 0
    for i, label in enumerate(labels):
        if current and width + len(label) + 1 > line_chars:
            lines.append(current)
            current, width = [], 0
        current.append(i)
        width += len(label) + 1
    if current:
        lines.append(current)
    n_cols = max(len(line) for line in lines)
    z = np.full((len(lines), n_cols), np.nan, dtype=np.float32)
    text = [["" for _ in range(n_cols)] for _ in lines]
    for r, line in enumerate(lines):
        for c, i in enumerate(line):
            z[r, c] = values[i]
            text[r][c] = safe(labels[i]) if i != highlight else f"<b>{safe(labels[i])}</b>"
    fig = go.Figure(go.Heatmap(
        z=z, text=text, texttemplate="%{text}", textfont=dict(size=14), colorscale=COLORSCALE, zmin=0,
        zmax=float(np.nanmax(z)) or 1.0, xgap=3, ygap=6, colorbar=dict(title="weight", thickness=12),
        hovertemplate="%{text}: %{z:.3f}<extra></extra>"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_layout(title=dict(text=safe(title)), height=70 * len(lines) + 110, margin=dict(t=60, l=10, r=10, b=10),
                      plot_bgcolor="white")
    return fig


ROLE_COLORS = {
    "previous token": "#1f77b4", "next token": "#17becf", "self": "#aec7e8", "[SEP] / no-op": "#c7c7c7",
    "[CLS]": "#7f7f7f", "punctuation / sentence type": "#d62728", "object focus": "#2ca02c",
    "relation focus": "#ff7f0e", "modifier / sentiment focus": "#9467bd", "broad": "#f7dc6f", "mixed": "#ffffff",
}
SYNTAX_COLOR = "#8c564b"


def role_grid(layers: np.ndarray, heads: np.ndarray, labels: list[str], hover: list[str], *,
              title: str = "") -> go.Figure:
    """Layer x head cells coloured by role, each cell naming its role; ``hover`` gives its numbers."""
    n_layers, n_heads = int(layers.max()) + 1, int(heads.max()) + 1
    names = sorted(set(labels), key=lambda r: (r.startswith("syntax"), r))
    colors = [ROLE_COLORS.get(r, SYNTAX_COLOR) for r in names]
    index = {r: i for i, r in enumerate(names)}
    z = np.zeros((n_layers, n_heads))
    text = [["" for _ in range(n_heads)] for _ in range(n_layers)]
    tips = [["" for _ in range(n_heads)] for _ in range(n_layers)]
    for l, h, r, tip in zip(layers, heads, labels, hover):
        z[l, h], text[l][h], tips[l][h] = index[r], safe(r.replace(" / ", "/")), tip
    k = len(names)
    scale = [[(i + edge) / k, c] for i, c in enumerate(colors) for edge in (0, 1)]
    fig = go.Figure(go.Heatmap(
        z=z, zmin=-0.5, zmax=k - 0.5, colorscale=scale if k > 1 else [[0, colors[0]], [1, colors[0]]],
        text=text, texttemplate="%{text}", textfont=dict(size=9), customdata=tips, showscale=False, xgap=2, ygap=2,
        hovertemplate="layer %{y}, head %{x}<br>%{customdata}<extra></extra>"))
    fig.update_xaxes(tickmode="array", tickvals=list(range(n_heads)), ticktext=[f"H{h}" for h in range(n_heads)],
                     side="top", showgrid=False)
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_layers)), ticktext=[f"L{l}" for l in range(n_layers)],
                     autorange="reversed", showgrid=False)
    fig.update_layout(title=dict(text=safe(title)), height=70 * n_layers + 120, margin=dict(t=90, l=40, r=10, b=10),
                      plot_bgcolor="white")
    return fig
