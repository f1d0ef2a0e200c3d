"""The sidebar's settings as one value every page reads, and the choices behind them."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from .messages import sentences_of
from .training import trained_job

ASSETS = Path(__file__).resolve().parents[2] / "assets"
EXAMPLES: dict[str, str] = json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
DEFAULT_TEXT = next(iter(EXAMPLES.values()))
MAX_CHARS = 20_000
MAX_SENTENCES = 24

MODELS = {
    "minilm": "all-MiniLM-L6-v2 · transformers",
    "scratch": "all-MiniLM-L6-v2 · from-scratch engine",
    "untrained": "Untrained encoder · from scratch, seed 0",
    "custom": "Custom model (id or folder) · transformers",
}
TRAINED = {
    "trained": "Your trained decoder · this session",
    "trained_start": "Your trained decoder at step 0 · this session",
}
SCRATCH = {"scratch", "untrained", *TRAINED}  # the choices that run our engine: head masks and causal apply


def model_names() -> dict[str, str]:
    """The sidebar's models: the bundled ones, and this session's trained decoder once there is one."""
    return {**MODELS, **TRAINED} if trained_job() is not None else dict(MODELS)


def custom_for(choice: str) -> str:
    """What names the model beyond its choice: the custom id or folder, or the trained run's id."""
    ss = st.session_state
    if choice in TRAINED:
        job = ss.get("trained_job")
        return job.id if job is not None else ""
    return ss.get("custom_model", "") or ""


@dataclass(frozen=True)
class Settings:
    choice: str
    custom: str
    device: str
    sentences: list[str]
    hide_special: bool
    merge_words: bool
    shared_scale: bool
    causal: bool
    heads_off: tuple[str, ...]


def settings() -> Settings:
    """The sidebar's current values, read from session state (the sidebar has already run)."""
    ss = st.session_state
    text = ss.get("text") or ""
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
    choice = ss.get("model", "minilm")
    scratch = choice in SCRATCH
    return Settings(choice, custom_for(choice), ss.get("device", "auto"), sentences,
                    bool(ss.get("hide_special")), bool(ss.get("merge_words")), bool(ss.get("shared_scale", True)),
                    scratch and bool(ss.get("causal")), tuple(ss.get("heads_off") or ()) if scratch else ())
