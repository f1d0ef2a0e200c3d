"""The sidebar's settings as one value every page reads."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from models import Head
from models.corpus import sentences_of

from ..results.models import LLM, ModelRef
from .generation import with_continuations
from .models import ref_for

MAX_CHARS = 32_000  # a 4,096-token prompt is about 18,000 characters of English
MAX_SENTENCES = 24


@dataclass(frozen=True)
class Settings:
    model: ModelRef
    sentences: list[str]
    hide_special: bool
    merge_words: bool
    shared_scale: bool
    causal: bool                 # the from-scratch engine only
    heads_off: tuple[Head, ...]  # the from-scratch engine only
    moved: bool = False          # weights scaled by what each key sends (value_norms), rows renormalised


def settings() -> Settings:
    """The sidebar's current values, read from session state (the sidebar has already run)."""
    ss = st.session_state
    model = ref_for(ss.get("model", "minilm"), ss.get("device", "auto"))
    compiled = model.program is not None  # its own inputs, its mask as compiled
    text = ss.get(f"tokens_{model.choice}" if compiled else "text") or ""
    sentences = sentences_of(text)
    if not sentences:
        if text.strip():
            st.warning("None of these lines has anything to read: only spaces, control or invisible characters. "
                       "Type a sentence in the sidebar, then press Ctrl+Enter.")
        else:
            st.info("Type a sentence in the sidebar, one per line, then press Ctrl+Enter.")
        st.stop()
    if len(sentences) > MAX_SENTENCES:
        st.warning(f"Showing the first {MAX_SENTENCES} of {len(sentences)} lines.")
        sentences = sentences[:MAX_SENTENCES]
    return Settings(model, sentences if compiled else with_continuations(sentences), bool(ss.get("hide_special")),
                    bool(ss.get("merge_words")), bool(ss.get("shared_scale", True)),
                    # a decoder is causal anyway, a compiled program as compiled
                    model.is_scratch and model.choice not in LLM and not compiled and bool(ss.get("causal")),
                    tuple(ss.get("heads_off") or ()) if model.is_scratch else (),
                    bool(ss.get("moved")) and model.editable() is not None)
