"""Files a user uploads: within a size limit, text decoded with a sentence for what is wrong."""
from __future__ import annotations

import streamlit as st

from models import HeadLensError
from models.corpus import sentences_of

from ..results.messages import stop_with


UPLOAD_LIMIT = 1_000_000  # bytes


UPLOAD_SENTENCES = 2000


def uploaded(label: str, kind: str, prompt: str) -> tuple[str, bytes]:
    """The name and bytes of a file the user uploads, within ``UPLOAD_LIMIT``; ``prompt`` until there is one."""
    file = st.file_uploader(label, type=[kind], max_upload_size=1)
    if file is None:
        st.info(prompt)
        st.stop()
    data = file.getvalue()
    if len(data) > UPLOAD_LIMIT:
        stop_with(HeadLensError(f"That file has {len(data):,} bytes; the limit is {UPLOAD_LIMIT:,}."))
    return file.name, data


def uploaded_sentences() -> list[str]:
    _, data = uploaded("A .txt file, one sentence per line", "txt", "Upload a text file to profile its sentences.")
    if b"\x00" in data:
        stop_with(HeadLensError("That file is binary, not text; upload a .txt with one sentence per line."))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        stop_with(HeadLensError("That file is not UTF-8 text; save it as UTF-8 and upload it again."))
    lines = sentences_of(text)
    if not lines:
        stop_with(HeadLensError("That file has no sentences in it."))
    return lines[:UPLOAD_SENTENCES]
