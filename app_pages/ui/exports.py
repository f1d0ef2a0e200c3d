"""Charts on the page, and the downloads under them: figure, attention, one head."""
from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path

import streamlit as st

from analysis import View
from analysis.attention.export import attention_json, attention_npz, head_csv
from models import Attention, head_label
from viz.export import figure_html, figure_image

from ..results.messages import plain


def model_zip(model, top: str) -> bytes:
    """``model`` saved (safetensors, config.json, tokenizer) and zipped under the folder ``top``."""
    out = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        folder = model.save(Path(tmp) / "model")
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for file in sorted(folder.rglob("*")):
                if file.is_file():
                    z.write(file, f"{top}/{file.relative_to(folder)}")
    return out.getvalue()


def file_name(*parts, ext: str) -> str:
    """A download's name: "headlens-", its ``parts`` joined by dashes, a head given as ``(layer, head)`` written "L3H11"
    ("headlens-why-L3H11-q4-k2.csv"), the same form on every page."""
    words = [f"L{p[0]}H{p[1]}" if isinstance(p, tuple) else str(p) for p in parts]
    return "-".join(["headlens", *words]) + f".{ext}"


def chart(fig, key: str, **kwargs):
    """A plotly chart in plotly's own theme (Streamlit's costs a quarter second a render)."""
    return st.plotly_chart(fig, key=key, theme=None, config={"displaylogo": False, "toImageButtonOptions": {"scale": 2}},
                           **kwargs)


def exports(key: str, fig, att: Attention | None, v: View | None = None, layer: int | None = None,
            head: int | None = None, sig: str = "") -> None:
    """Download buttons: the figure (HTML, and PNG/SVG on request), the attention, one head as CSV.

    ``sig`` names what the figure shows; rendered images are offered only while it is unchanged.
    """
    stem = f"headlens-{key}"
    cols = st.columns(5)
    cols[0].download_button("Figure · HTML", lambda: figure_html(fig), f"{stem}.html", "text/html",
                            key=f"{key}-html", on_click="ignore")
    if att is not None:
        cols[1].download_button("Attention · NPZ", lambda: attention_npz(att), f"{stem}.npz",
                                "application/octet-stream", key=f"{key}-npz", on_click="ignore")
        cols[2].download_button("Attention · JSON", lambda: attention_json(att), f"{stem}.json", "application/json",
                                key=f"{key}-json", on_click="ignore")
    if v is not None and layer is not None and head is not None:
        cols[3].download_button(f"{head_label(layer, head)} · CSV", lambda: head_csv(v, layer, head),
                                file_name(key, (layer, head), ext="csv"), "text/csv", key=f"{key}-csv", on_click="ignore")
    stored = st.session_state.get(f"{key}-images")
    images = stored[1] if stored and stored[0] == sig else None
    if cols[4].button("PNG and SVG…", key=f"{key}-render", help="Renders on the server with Chromium; "
                      "the camera in the chart's toolbar saves a PNG too."):
        try:
            with st.spinner("Rendering images…"):
                images = {fmt: figure_image(fig, fmt) for fmt in ("png", "svg")}
            st.session_state[f"{key}-images"] = (sig, images)
        except RuntimeError as err:
            st.warning(plain(str(err)))
    if images:
        a, b, _ = st.columns([1, 1, 3])
        a.download_button("Download PNG", images["png"], f"{stem}.png", "image/png", key=f"{key}-png",
                          on_click="ignore")
        b.download_button("Download SVG", images["svg"], f"{stem}.svg", "image/svg+xml", key=f"{key}-svg",
                          on_click="ignore")
