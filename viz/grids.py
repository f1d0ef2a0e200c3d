"""Every head of a model at once: a layers x heads grid of thumbnails (Overview) or of roles (Head roles)."""
from __future__ import annotations

import base64
import io

import numpy as np
import plotly.colors as pc
import plotly.graph_objects as go

from .figures import COLORSCALE, HIDDEN_COLOR, TITLE_CHARS, head_targets, safe, top_margin, wrapped_title

HIDDEN_RGB = pc.hex_to_rgb(HIDDEN_COLOR)


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


def overview_png(weights: np.ndarray, *, shared_scale: bool = True, thumb: int = 96, gap: int = 6,
                 visible: np.ndarray | None = None) -> tuple[bytes, int]:
    """All heads of all layers as one PNG: layers on rows, heads on columns; pixels that no causal
    query could see (``visible``, ``View.visible``: one mask for every layer, or ``(layers, n, n)`` where
    layers see differently, as sliding-window ones do) grey.

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
    masks = None if visible is None else np.asarray(visible, dtype=np.float32)
    if masks is not None and masks.ndim == 2:
        masks = masks[None]
    hiddens = None if masks is None else [_thumbnail(m, thumb) == 0 for m in masks]
    for l in range(layers):
        hidden = None if hiddens is None else hiddens[l if len(hiddens) > 1 else 0]
        for h in range(heads):
            tile = tiles[l][h]
            scale = top if shared_scale else (float(tile.max()) or 1.0)
            idx = np.clip(tile / scale * 255, 0, 255).astype(np.uint8)
            pixels = lut[idx]
            if hidden is not None:
                pixels[hidden] = HIDDEN_RGB
            canvas[l * pitch:l * pitch + t_h, h * pitch:h * pitch + t_w] = pixels
    buf = io.BytesIO()
    Image.fromarray(canvas).save(buf, format="PNG", compress_level=6)
    return buf.getvalue(), pitch


def overview(weights: np.ndarray, stats: dict[str, np.ndarray], *, shared_scale: bool = True, title: str = "",
             thumb: int = 96, visible: np.ndarray | None = None) -> go.Figure:
    """Every layer x head as image thumbnails, one PNG rather than hundreds of SVG heatmaps.

    An invisible square marker over each thumbnail names its head and statistics on hover, and a
    click on it is reported as a point selection whose index is ``layer * heads + head``.
    """
    layers, heads = weights.shape[:2]
    png, pitch = overview_png(weights, shared_scale=shared_scale, thumb=thumb, visible=visible)
    layer_of, head_of = np.divmod(np.arange(layers * heads), heads)
    custom = np.stack([layer_of, head_of, stats["entropy"].ravel(), stats["max_weight"].ravel(),
                       stats["to_special"].ravel()], axis=-1)
    return tile_figure(png, pitch, layers, heads, custom, (
        "layer %{customdata[0]}, head %{customdata[1]}<br>entropy %{customdata[2]:.2f} nats<br>max "
        "%{customdata[3]:.2f}<br>to special %{customdata[4]:.2f}<br>click to open in Explore<extra></extra>"), title)


def tile_figure(png: bytes, pitch: int, layers: int, heads: int, custom: np.ndarray, hovertemplate: str,
                title: str = "") -> go.Figure:
    """A PNG of ``layers`` x ``heads`` tiles, ``pitch`` pixels apart, as a figure: an invisible square marker
    over each tile shows ``hovertemplate`` with its row of ``custom`` (``layer * heads + head``), and a click
    on it is reported as a point selection with that index."""
    width, height = heads * pitch, layers * pitch
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    fig = go.Figure(go.Image(source=uri, x0=0, y0=0, dx=1, dy=1, hoverinfo="skip"))
    centres_x = [h * pitch + (pitch - 1) / 2 for h in range(heads)]
    centres_y = [l * pitch + (pitch - 1) / 2 for l in range(layers)]
    layer_of, head_of = np.divmod(np.arange(layers * heads), heads)
    fig.add_trace(go.Scatter(
        x=[centres_x[h] for h in head_of], y=[centres_y[l] for l in layer_of], mode="markers", name="heads",
        marker=dict(symbol="square", size=max(12, int(pitch * 0.6)), color="rgba(0,0,0,0)"), customdata=custom,
        showlegend=False, hovertemplate=hovertemplate))
    fig.update_xaxes(tickmode="array", tickvals=centres_x, ticktext=[f"H{h}" for h in range(heads)],
                     showgrid=False, range=[-0.5, width - 0.5], side="top")
    fig.update_yaxes(tickmode="array", tickvals=centres_y, ticktext=[f"L{l}" for l in range(layers)],
                     showgrid=False, range=[height - 0.5, -0.5], scaleanchor="x")
    # the image keeps its aspect ratio; size the figure to it for a page about 1100 px wide, and let
    # a deep model (SmolLM2's 30 layers) run longer than a screen rather than shrink its squares
    head = wrapped_title(title)
    fig.update_layout(title=head, height=min(max(1000, 56 * layers + 130), int(1100 * height / width) + 130),
                      margin=dict(t=top_margin(head, room=40), l=40, r=10, b=10))
    return fig


ROLE_COLORS = {
    "previous token": "#1f77b4", "next token": "#17becf", "self": "#aec7e8", "[SEP] / no-op": "#c7c7c7",
    "[CLS]": "#7f7f7f", "first token (sink)": "#7f7f7f", "punctuation": "#e377c2", "sentence type focus": "#d62728",
    "object focus": "#2ca02c",
    "relation focus": "#ff7f0e", "sentiment focus": "#9467bd", "broad": "#f7dc6f", "mixed": "#ffffff",
    # the decoder head detector's labels
    "induction": "#d62728", "duplicate token": "#2ca02c", "sink": "#7f7f7f", "other": "#ffffff",
}


def cell_text(role: str) -> str:
    """A role as a grid cell shows it: without "focus", on two lines from its first space."""
    return safe(role.removesuffix(" focus")).replace(" ", "<br>", 1)
SYNTAX_COLOR = "#8c564b"


def role_grid(layers: np.ndarray, heads: np.ndarray, labels: list[str], hover: list[str], *,
              title: str = "", compact: bool = False, title_chars: int | None = None) -> go.Figure:
    """Layer x head cells coloured by role, each cell naming its role; ``hover`` gives its numbers. ``compact``:
    small cells without their names, a legend of the colours instead (two models side by side)."""
    n_layers, n_heads = int(layers.max()) + 1, int(heads.max()) + 1
    names = sorted(set(labels), key=lambda r: (r.startswith("syntax"), r))
    colors = [ROLE_COLORS.get(r, SYNTAX_COLOR) for r in names]
    if compact:  # without names in the cells, a white "other" would read as a missing head
        colors = ["#e3e3e3" if c == "#ffffff" else c for c in colors]
    index = {r: i for i, r in enumerate(names)}
    z = np.zeros((n_layers, n_heads))
    text = [["" for _ in range(n_heads)] for _ in range(n_layers)]
    tips = [["" for _ in range(n_heads)] for _ in range(n_layers)]
    for l, h, r, tip in zip(layers, heads, labels, hover):
        z[l, h], text[l][h], tips[l][h] = index[r], cell_text(r), tip
    k = len(names)
    scale = [[(i + edge) / k, c] for i, c in enumerate(colors) for edge in (0, 1)]
    fig = go.Figure(go.Heatmap(
        z=z, zmin=-0.5, zmax=k - 0.5, colorscale=scale if k > 1 else [[0, colors[0]], [1, colors[0]]],
        text=None if compact else text, texttemplate=None if compact else "%{text}", textfont=dict(size=9),
        showscale=False, xgap=2, ygap=2, hoverinfo="skip"))  # the numbers are the click targets' hover, sent once
    head_targets(fig, n_layers, n_heads, [tips[l][h] for l in range(n_layers) for h in range(n_heads)],
                 size=10 if compact else 14, action="open its card")
    if compact:
        for name, color in zip(names, colors):  # a legend entry per role: the cells carry no names
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=safe(name),
                                     marker=dict(symbol="square", size=12, color=color)))
    fig.update_xaxes(tickmode="array", tickvals=list(range(n_heads)), ticktext=[f"H{h}" for h in range(n_heads)],
                     side="top", showgrid=False)
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_layers)), ticktext=[f"L{l}" for l in range(n_layers)],
                     showgrid=False)  # layer 0 at the top: ``head_targets`` fixed the range
    head = wrapped_title(title, title_chars or TITLE_CHARS)
    if compact:
        fig.update_xaxes(tickangle=0, tickfont=dict(size=9))
        fig.update_layout(title=head, height=24 * n_layers + top_margin(head, room=40) + 70,
                          margin=dict(t=top_margin(head, room=40), l=40, r=10, b=70), plot_bgcolor="white",
                          legend=dict(orientation="h", yanchor="top", y=-0.02, xanchor="left", x=0))
        return fig
    fig.update_layout(title=head, height=70 * n_layers + 120, margin=dict(t=90, l=40, r=10, b=10),
                      plot_bgcolor="white")
    return fig


def reach_grid(distance: np.ndarray, first: np.ndarray, *, title: str = "") -> go.Figure:
    """Two layers x heads maps side by side: each head's mean attention distance (how far back or away it
    looks, in tokens) and its sink share (the mean weight on the first token)."""
    from plotly.subplots import make_subplots

    layers, heads = distance.shape
    # short subplot titles and bars beside each map: the figure reads in a 564 px column (a 1024 px window)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.2, subplot_titles=["Mean distance (tokens)", "Sink share"])
    for col, (values, scale, bar_x, what) in enumerate(((distance, "Viridis", 0.41, "distance %{z:.1f} tokens"),
                                                        (first, "Blues", 1.0, "on the first token %{z:.2f}")), start=1):
        fig.add_trace(go.Heatmap(
            z=np.asarray(values, dtype=np.float32), x=list(range(heads)), y=list(range(layers)), colorscale=scale,
            zmin=0, zmax=None if col == 1 else 1, colorbar=dict(thickness=10, x=bar_x, len=0.9, tickfont=dict(size=10)),
            hovertemplate=f"layer %{{y}}, head %{{x}}<br>{what}<extra></extra>", name=what.split()[0]),
            row=1, col=col)
    fig.update_xaxes(title_text="head", dtick=1 if heads <= 16 else None, tickfont=dict(size=10))
    fig.update_yaxes(autorange="reversed", dtick=1 if layers <= 16 else None, tickfont=dict(size=10))
    fig.update_yaxes(title_text="layer", row=1, col=1)
    fig.update_annotations(font=dict(size=12))
    head = wrapped_title(title)
    fig.update_layout(title=head, height=max(320, 16 * layers + 170), margin=dict(t=top_margin(head, 40), l=55, r=10, b=50))
    return fig
