"""Continuations generated in this session: each page shows a prompt with its continuation, the
generated tokens marked (``views.GENERATED_MARK``)."""
from __future__ import annotations

import streamlit as st

KEY = "continuations"  # session state: prompt -> generated continuation


def continuations() -> dict[str, str]:
    return st.session_state.setdefault(KEY, {})


def with_continuations(sentences: list[str]) -> list[str]:
    """The sidebar's sentences, each followed by its continuation where one was generated."""
    kept = continuations()
    return [s + kept.get(s, "") for s in sentences]


def generated_from(text: str) -> int | None:
    """Where the generated part of ``text`` starts, or None when ``text`` has none."""
    for prompt, more in continuations().items():
        if more and text == prompt + more:
            return len(prompt)
    return None
