"""Queries & keys: every head's picture over a corpus, computed once per model and corpus for every session."""
from __future__ import annotations


import streamlit as st

from models import AttentionModel
from models.corpus import CORPUS

from ..results.qk import QK_TOKENS, _within
from .uploads import uploaded_sentences
from .settings import Settings
from .state import bound

SOURCES = {"corpus": f"Built-in corpus ({len(CORPUS)} sentences)", "sidebar": "The sidebar's sentences",
           "upload": "An uploaded .txt"}
METHODS = {"fitted": "Fitted plane (faithful)", "pca": "PCA (AttentionViz's plain version)"}


def pick_corpus(s: Settings) -> list[str]:
    source = bound(st.segmented_control, "qk_corpus", "corpus", init="default", options=list(SOURCES), cast=str,
                   label="Sentences", format_func=SOURCES.get, required=True)
    return list(CORPUS) if source == "corpus" else list(s.sentences) if source == "sidebar" else uploaded_sentences()


def within_tokens(model: AttentionModel, sentences: list[str]) -> list[str]:
    """The first sentences within ``QK_TOKENS`` tokens, with a note when some are left out."""
    keep, total = _within(model, sentences)
    if keep < len(sentences):
        st.warning(f"Drawing the first {keep:,} of {len(sentences):,} sentences: their {total:,} tokens are as "
                   f"many as one picture holds ({QK_TOKENS:,}).")
    return sentences[:keep]


