"""Head-role profiles over many sentences: computed once for every session, with a progress bar."""
from __future__ import annotations

import hashlib

import numpy as np
import streamlit as st

from analysis import RANKING_MEASURES, head_similarity, measure_heads
from models import AttentionModel, HeadLensError

from .caches import SharedCache, head_mask, model_for
from .messages import sentences_of, stop_with
from .settings import ASSETS, Settings
from .state import bound

CORPUS = sentences_of((ASSETS / "corpus.txt").read_text(encoding="utf-8"))
PROFILE_BYTES = 512 * 2**20  # attention weights one head-role profile may hold
CONTENT_ATTENTION = ("Content attention is a head's attention with the special tokens ([CLS], [SEP]) dropped and "
                     "each row rescaled to 1: attention to them works as a no-op (Clark et al. 2019) and hides what "
                     "the head does with the words.")
UPLOAD_LIMIT = 1_000_000  # bytes
UPLOAD_SENTENCES = 2000
SOURCES = {"corpus": f"Built-in corpus ({len(CORPUS)} sentences)", "sidebar": "The sidebar's sentences",
           "upload": "An uploaded .txt"}


def profile_sentences(s: Settings) -> list[str]:
    """The sentences to profile, as the user picks them: the built-in corpus, the sidebar's, or an upload."""
    source = bound(st.segmented_control, "corpus", "corpus", init="default", options=list(SOURCES), cast=str,
                   label="Sentences to profile", format_func=SOURCES.get, required=True)
    return CORPUS if source == "corpus" else s.sentences if source == "sidebar" else uploaded_sentences()


def uploaded_sentences() -> list[str]:
    file = st.file_uploader("A .txt file, one sentence per line", type=["txt"], max_upload_size=1)
    if file is None:
        st.info("Upload a text file to profile its sentences.")
        st.stop()
    data = file.getvalue()
    if len(data) > UPLOAD_LIMIT:
        stop_with(ValueError(f"That file has {len(data):,} bytes; the limit is {UPLOAD_LIMIT:,}."))
    if b"\x00" in data:
        stop_with(ValueError("That file is binary, not text; upload a .txt with one sentence per line."))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        stop_with(ValueError("That file is not UTF-8 text; save it as UTF-8 and upload it again."))
    lines = sentences_of(text)
    if not lines:
        stop_with(ValueError("That file has no sentences in it."))
    return lines[:UPLOAD_SENTENCES]


@st.cache_resource
def profile_cache() -> SharedCache:
    """Head-role profiles, (frame, per-sentence measures, attentions), for every session.

    st.cache_data cannot drive a progress bar from inside a cached function, so profiles are
    computed outside it and kept here. Values are only ever read; the frame is copied on the way out.
    """
    return SharedCache(max_entries=4)


def profile(s: Settings, sentences: list[str]):
    """Head roles over ``sentences`` for the sidebar's model, with a progress bar while it runs.

    Returns the per-head frame, per-sentence measures (``(sentences, layers, heads)`` each, and
    ``"similarity"``: the heads' Jensen-Shannon divergences), and the attentions.
    """
    key = (s.choice, s.custom, s.device, s.causal, s.heads_off,
           hashlib.sha256("\n".join(sentences).encode("utf-8", "surrogatepass")).hexdigest())
    cache = profile_cache()
    cached = cache.get(key)
    if cached is None:
        model = model_for(s.choice, s.custom, s.device)
        lock = cache.computing(key)
        if not lock.acquire(blocking=False):
            with st.spinner("Another session is profiling the same sentences; its result will be shown here…"):
                lock.acquire()
        try:
            cached = cache.get(key) or _compute_profile(model, s, sentences, key)
        finally:
            lock.release()
    frame, per_sentence, attentions = cached
    return frame.copy(), per_sentence, attentions


def _compute_profile(model: AttentionModel, s: Settings, sentences: list[str], key):
    try:
        sentences = within_budget(model, sentences)
    except HeadLensError as err:
        stop_with(err)
    bar = st.progress(0.0, text=f"Profiling {len(sentences)} sentences…")
    try:
        attentions = model.attend(sentences, head_mask=head_mask(model, s.heads_off), causal=s.causal,
                                  progress=lambda done, total: bar.progress(
                                      done / total, text=f"Profiling… {done} of {total} sentences"))
    except HeadLensError as err:
        stop_with(err)
    bar.progress(1.0, text="Measuring every head…")
    measures = measure_heads(attentions)
    per_sentence = {name: measures.per_sentence(name) for name in RANKING_MEASURES}
    per_sentence["similarity"] = head_similarity(attentions)
    bar.empty()
    value = (measures.frame(), per_sentence, attentions)
    profile_cache().put(key, value)
    return value


def within_budget(model: AttentionModel, sentences: list[str]) -> list[str]:
    """The first sentences whose attention weights fit ``PROFILE_BYTES``, with a note when some are left out."""
    sizes = np.cumsum([n * n * model.bytes_per_token_pair for n in model.token_counts(sentences)])
    keep = max(1, int(np.searchsorted(sizes, PROFILE_BYTES, side="right")))
    if keep < len(sentences):
        st.warning(f"Profiling the first {keep:,} of {len(sentences):,} sentences: their attention weights "
                   f"fill the {PROFILE_BYTES // 2**20} MiB a profile may hold.")
    return sentences[:keep]
