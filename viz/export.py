"""Figures as files: standalone HTML always; PNG and SVG where a headless Chrome is available."""
from __future__ import annotations

import plotly.graph_objects as go


def figure_html(fig: go.Figure) -> str:
    """A self-contained page: plotly.js is inlined, so it opens offline."""
    return fig.to_html(include_plotlyjs=True, full_html=True)


def figure_image(fig: go.Figure, fmt: str, scale: float = 2.0) -> bytes:
    """PNG or SVG through kaleido, which drives a local Chrome or Chromium.

    Raises:
        RuntimeError: no usable browser, with a sentence saying what to do instead.
    """
    try:
        return fig.to_image(format=fmt, scale=scale if fmt == "png" else 1)
    except Exception as err:  # noqa: BLE001 - kaleido reports a missing browser in several ways
        raise RuntimeError(
            f"{fmt.upper()} export needs Chrome or Chromium on the server ({type(err).__name__}). "
            "Use the camera button in the chart's toolbar instead, or download the HTML.") from err
