"""Queries and keys of a head in one 2-D picture (``analysis.qk_attribution.pictures``): every head as thumbnails, one head as a scatter."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
import plotly.colors as pc
import plotly.graph_objects as go

from .figures import safe, top_margin, wrapped_title
from .grids import ROLE_COLORS, tile_figure

QUERY_COLOR = "#1f77b4"   # blue: queries
KEY_COLOR = "#e6550d"     # orange: keys
UNTRUSTED_COLOR = "#fde0dd"  # the background of a head whose picture does not show its attention
FOCI = ("sentence_type", "object", "relation", "sentiment")  # analysis.roles.foci.FOCI, which viz does not import
CLASS_NAMES = {"special": "special token", "sentence_type": "sentence type", "object": "object",
               "relation": "relation", "sentiment": "sentiment", "other": "other word"}
# a word class in the colour of its focus on Head roles
CLASS_COLORS = {"special": ROLE_COLORS["[CLS]"],
                **{c: ROLE_COLORS[f"{CLASS_NAMES[c]} focus"] for c in FOCI},
                "other": "#bcbd22"}
COLOR_BY = {"position": "Position", "word_class": "Word class", "token": "Token", "sentence": "Sentence"}
TOP_TOKENS = 10  # colouring by token names the most frequent ones; the rest are "other tokens"
SNIPPET = 60


def _pixels(x: np.ndarray, y: np.ndarray, lo: np.ndarray, span: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    col = np.clip(((x - lo[0]) / span * (size - 1)).round().astype(int), 0, size - 1)
    row = np.clip(((lo[1] + span - y) / span * (size - 1)).round().astype(int), 0, size - 1)
    return row, col


def qk_tile(frame: pd.DataFrame, size: int = 96) -> np.ndarray:
    """One head's picture as ``(size, size, 3)`` pixels: keys in orange under queries in blue, each pixel as
    dark as the points on it; a pink ground when the picture misleads (``attrs["misleads"]``)."""
    xy = frame[["x", "y"]].to_numpy(np.float64)
    lo, hi = np.percentile(xy, 1, axis=0), np.percentile(xy, 99, axis=0)
    span = float(max(hi - lo)) * 1.1 or 1.0
    lo = (lo + hi) / 2 - span / 2
    ground = UNTRUSTED_COLOR if frame.attrs.get("misleads") else "#ffffff"
    tile = np.ones((size, size, 3)) * np.array(pc.hex_to_rgb(ground)) / 255
    for kind, color in (("key", KEY_COLOR), ("query", QUERY_COLOR)):
        part = frame["kind"].to_numpy() == kind
        row, col = _pixels(xy[part, 0], xy[part, 1], lo, span, size)
        counts = np.zeros((size, size))
        np.add.at(counts, (row, col), 1.0)
        alpha = (1 - np.exp(-counts / 2))[..., None]
        tile = tile * (1 - alpha) + alpha * np.array(pc.hex_to_rgb(color)) / 255
    return (tile * 255).round().astype(np.uint8)


class QkCanvas:
    """Every head's picture on one canvas, layers on rows and heads on columns, painted head by head as each is
    ready (an unpainted head is blank); ``png()`` encodes it as it stands."""

    def __init__(self, layers: int, heads: int, thumb: int = 96, gap: int = 6):
        self.thumb, self.pitch = thumb, thumb + gap
        self.pixels = np.full((layers * self.pitch - gap, heads * self.pitch - gap, 3), 255, dtype=np.uint8)

    def paint(self, layer: int, head: int, frame: pd.DataFrame) -> None:
        t, p = self.thumb, self.pitch
        self.pixels[layer * p:layer * p + t, head * p:head * p + t] = qk_tile(frame, t)

    def png(self) -> tuple[bytes, int]:
        """The canvas as a PNG, and the tile pitch."""
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(self.pixels).save(buf, format="PNG", compress_level=6)
        return buf.getvalue(), self.pitch


def qk_overview_png(frames: dict[tuple[int, int], pd.DataFrame], layers: int, heads: int, *, thumb: int = 96,
                    gap: int = 6) -> tuple[bytes, int]:
    """Every head's picture as one PNG, layers on rows and heads on columns; the PNG and the tile pitch."""
    canvas = QkCanvas(layers, heads, thumb, gap)
    for (layer, head), frame in frames.items():
        canvas.paint(layer, head, frame)
    return canvas.png()


def qk_overview(frames: dict[tuple[int, int], pd.DataFrame], layers: int, heads: int, *, title: str = "",
                png: tuple[bytes, int] | None = None) -> go.Figure:
    """Every head's queries and keys as thumbnails; hover gives a head's faithfulness, a click is a point
    selection whose index is ``layer * heads + head``. ``png``: ``qk_overview_png``'s result, when kept."""
    png, pitch = png or qk_overview_png(frames, layers, heads)
    custom = np.full((layers * heads, 6), np.nan)
    for (layer, head), frame in frames.items():
        a = frame.attrs
        custom[layer * heads + head] = (layer, head, a["faithfulness"], a["chance"], a["word_faithfulness"],
                                        a["word_share"])
    return tile_figure(png, pitch, layers, heads, custom, (
        "layer %{customdata[0]}, head %{customdata[1]}<br>faithfulness %{customdata[2]:.2f} "
        "(chance %{customdata[3]:.2f})<br>word to word: %{customdata[4]:.2f} of %{customdata[5]:.0%} of queries"
        "<br>click to open its picture<extra></extra>"), title)


def _hover_rows(frame: pd.DataFrame, sentences: list[str]) -> np.ndarray:
    snippets = [safe(t if len(t) <= SNIPPET else t[:SNIPPET - 1] + "…") for t in sentences]
    return np.stack([
        np.arange(len(frame)), frame["sentence"].to_numpy(), frame["position"].to_numpy(),
        [safe(t) for t in frame["token"]], [snippets[i] for i in frame["sentence"]],
        [CLASS_NAMES.get(c, str(c)) for c in frame["word_class"]],
    ], axis=-1).astype(object)


HOVER = ("<b>%{customdata[3]}</b> · %{meta}<br>sentence %{customdata[1]}, position %{customdata[2]}<br>"
         "%{customdata[4]}<br>%{customdata[5]}<extra></extra>")
SYMBOLS = {"query": "circle", "key": "x"}
PLURAL = {"query": "queries", "key": "keys"}


def _groups(frame: pd.DataFrame, color_by: str) -> list[tuple[str, np.ndarray, str]]:
    """``(name, row mask, colour)`` per legend entry, for a categorical colouring."""
    if color_by == "word_class":
        values = frame["word_class"].astype(str).to_numpy()
        return [(CLASS_NAMES[c], values == c, color) for c, color in CLASS_COLORS.items() if (values == c).any()]
    tokens = frame["token"].to_numpy()
    top = frame.loc[frame["kind"] == "query", "token"].value_counts().index[:TOP_TOKENS]
    palette = pc.qualitative.D3 + pc.qualitative.Set2
    groups = [(f"“{safe(t)}”", tokens == t, palette[i % len(palette)]) for i, t in enumerate(top)]
    rest = ~np.isin(tokens, top)
    return groups + ([("other tokens", rest, "#c7c7c7")] if rest.any() else [])


def qk_scatter(frame: pd.DataFrame, sentences: list[str], *, color_by: str = "position", title: str = "",
               marked: int | None = None) -> go.Figure:
    """One head's queries (circles) and keys (crosses) in the plane of ``analysis.qk_embedding``.

    ``color_by``: "position", "word_class", "token" or "sentence". Every point's ``customdata[0]`` is its row
    in ``frame``, so a clicked point names its token; ``marked`` (a row) is ringed.
    """
    rows = _hover_rows(frame, sentences)
    fig = go.Figure()
    kinds = frame["kind"].to_numpy()
    if color_by in ("position", "sentence"):
        values = frame[color_by].to_numpy()
        for kind in ("query", "key"):
            part = kinds == kind
            fig.add_trace(go.Scattergl(
                x=frame["x"].to_numpy()[part], y=frame["y"].to_numpy()[part], mode="markers", name=PLURAL[kind],
                meta=kind, customdata=rows[part], hovertemplate=HOVER,
                marker=dict(symbol=SYMBOLS[kind], size=6 if kind == "query" else 7, color=values[part],
                            coloraxis="coloraxis", line=dict(width=1) if kind == "key" else dict(width=0))))
        fig.update_layout(coloraxis=dict(colorscale="Viridis" if color_by == "position" else "Turbo",
                                         colorbar=dict(title=COLOR_BY[color_by], thickness=12)))
    else:
        for kind in ("query", "key"):
            for name, members, color in _groups(frame, color_by):
                part = members & (kinds == kind)
                if not part.any():
                    continue
                fig.add_trace(go.Scattergl(
                    x=frame["x"].to_numpy()[part], y=frame["y"].to_numpy()[part], mode="markers",
                    name=f"{name} · {PLURAL[kind]}", legendgroup=name, meta=kind, customdata=rows[part],
                    hovertemplate=HOVER, marker=dict(symbol=SYMBOLS[kind], size=6 if kind == "query" else 7,
                                                     color=color, line=dict(width=1 if kind == "key" else 0))))
    if marked is not None:
        point = frame.iloc[marked]
        fig.add_trace(go.Scatter(x=[point["x"]], y=[point["y"]], mode="markers", name="picked",
                                 hoverinfo="skip", showlegend=False,
                                 marker=dict(symbol="circle-open", size=18, color="#000000", line=dict(width=2))))
    head = wrapped_title(title)
    fig.update_layout(title=head, height=640, margin=dict(t=top_margin(head), l=10, r=10, b=10),
                      plot_bgcolor="white", legend=dict(orientation="h", yanchor="top", y=-0.02, x=0),
                      clickmode="event+select", dragmode="pan")
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, scaleanchor="x")
    return fig
