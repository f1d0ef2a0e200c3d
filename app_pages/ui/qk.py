"""Queries & keys: every head's picture over a corpus, computed once per model and corpus for every session."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from analysis.profile import corpus_hash
from analysis.qk import iter_qk_heads, qk_embeddings
from models import AttentionModel, HeadLensError
from models.corpus import CORPUS
from viz.qk import qk_overview_png

from .caches import SharedCache, computed_once
from .messages import stop_with
from .models import ModelRef, model_for
from .profiles import uploaded_sentences
from .settings import Settings
from .state import bound

QK_TOKENS = 12_000  # the most tokens of a corpus one page's pictures cover; more are left out with a note
SOURCES = {"corpus": f"Built-in corpus ({len(CORPUS)} sentences)", "sidebar": "The sidebar's sentences",
           "upload": "An uploaded .txt"}
METHODS = {"fitted": "Fitted plane (faithful)", "pca": "PCA (AttentionViz's plain version)"}


def pick_corpus(s: Settings) -> list[str]:
    source = bound(st.segmented_control, "qk_corpus", "corpus", init="default", options=list(SOURCES), cast=str,
                   label="Sentences", format_func=SOURCES.get, required=True)
    return list(CORPUS) if source == "corpus" else list(s.sentences) if source == "sidebar" else uploaded_sentences()


def within_tokens(model: AttentionModel, sentences: list[str]) -> list[str]:
    """The first sentences within ``QK_TOKENS`` tokens, with a note when some are left out."""
    total, keep = 0, 0
    for n in model.token_counts(sentences):
        if total + n > QK_TOKENS and keep:
            break
        total, keep = total + n, keep + 1
    if keep < len(sentences):
        st.warning(f"Drawing the first {keep:,} of {len(sentences):,} sentences: their {total:,} tokens are as "
                   f"many as one picture holds ({QK_TOKENS:,}).")
    return sentences[:keep]


@dataclass(frozen=True)
class Pictures:
    """Every head's picture (``{(layer, head): frame}``) and their thumbnails as one PNG with its pitch,
    drawn once with them rather than on every rerun."""

    frames: dict
    png: tuple[bytes, int]


def _frames_bytes(value: Pictures) -> int:
    return sum(int(f.memory_usage(index=False).sum()) for f in value.frames.values()) + len(value.png[0])


@st.cache_resource
def qk_cache() -> SharedCache:
    """Every head's ``Pictures`` per model, corpus and projection, for every session: the last 4 within 512 MiB.
    Frames are only ever read."""
    return SharedCache(max_entries=4, max_bytes=512 * 2**20, size=_frames_bytes)


def pictures(ref: ModelRef, sentences: list[str], method: str) -> Pictures:
    """``qk_embedding`` of every head of ``ref``'s model over ``sentences``, with a progress bar the first time."""
    key = (ref, corpus_hash(sentences)[1], method)
    return computed_once(qk_cache(), key, lambda: _compute(model_for(ref), sentences, method),
                         "Another session is drawing the same sentences; its pictures will be shown here…")


def _compute(model: AttentionModel, sentences: list[str], method: str) -> Pictures:
    bar = st.progress(0.0, text=f"Reading the queries and keys of {len(sentences):,} sentences…")
    count = model.n_layers * model.n_heads
    drawn = [0]

    def reading(done: int, total: int) -> None:
        bar.progress(drawn[0] / count, text=f"Reading queries and keys… {done:,} of {total:,} sentence passes")

    def drawing(done: int, total: int) -> None:
        drawn[0] = done
        bar.progress(done / total, text=f"Drawing head {done} of {total}…")

    try:
        frames = qk_embeddings(iter_qk_heads(model, sentences, progress=reading), method=method, total=count,
                               progress=drawing)
    except HeadLensError as err:
        bar.empty()
        stop_with(err)
    bar.empty()
    return Pictures(frames, qk_overview_png(frames, model.n_layers, model.n_heads))
