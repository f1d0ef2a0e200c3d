"""Pickers for a sentence, a layer, heads and a query token; each choice lives in the session and the URL."""
from __future__ import annotations

import streamlit as st

from analysis import View
from models import Attention

from ..results.messages import short
from .settings import Settings
from viz.figures import MAX_CELLS

from .state import bound, choose


def pick_sentence(s: Settings, key: str = "sentence", container=st, label: str = "Sentence") -> str:
    i = choose(label, list(range(len(s.sentences))), key, container=container,
               format_func=lambda i: f"{i + 1}. {short(s.sentences[i])}")
    return s.sentences[i]


def pick_layer(n_layers: int, key: str = "layer", container=st, windows: tuple | None = None,
               default: int | None = None) -> int:
    """A layer (``default`` first, else the first); with ``windows`` (``Attention.windows``) each option says
    whether it slides or sees every key."""
    if windows is None:
        return choose("Layer", list(range(n_layers)), key, default, container=container)
    full = [i for i, w in enumerate(windows) if w is None]
    return choose("Layer", list(range(n_layers)), key, default, container=container,
                  format_func=lambda i: f"{i} {'global' if windows[i] is None else 'local'}",  # fits a narrow box
                  help=f"Layers {', '.join(map(str, full)) or 'none'} are global: a query sees every earlier token. "
                       f"The others are local: a query sees only the last {max(w or 0 for w in windows):,} tokens "
                       "(a sliding window).")


def pick_head(n_heads: int, key: str = "head", container=st, label: str = "Head") -> int:
    return choose(label, list(range(n_heads)), key, container=container)


def pick_heads(n_heads: int, key: str = "heads", container=st) -> list[int]:
    options = list(range(n_heads))
    heads = bound(container.multiselect, key, options, init="default", options=options, multi=True, cast=int,
                  label="Heads")
    if not heads:
        st.info("Pick at least one head.")
        st.stop()
    return sorted(heads)


def pick_query(v: View, key: str = "query", container=st, allow_all: bool = True, last: bool = False) -> int | None:
    """A query token of ``v`` (a ``View`` or ``LongView``), "all tokens" as None; the first word by default,
    or with ``last`` the last token (a prompt's, whose next token the model predicts)."""
    options = ([-1] if allow_all else []) + list(range(len(v.query_labels)))
    words = [i for i in range(len(v.query_labels)) if not v.query_special[i]]
    default = (words[-1] if last else words[0]) if words else options[-1 if last else 0]
    q = choose("Query token", options, key, default=default, container=container,
               format_func=lambda i: "all tokens" if i == -1 else f"{i}: {v.query_labels[i]}")
    return None if q == -1 else q


def pick_full_resolution(views: list[View], options: list, key: str, label: str, what: str, format_func):
    """Where a view is longer than its heatmaps draw (``MAX_CELLS``), say so and offer one of
    ``options`` at full resolution; the choice, or None."""
    if all(max(len(v.query_labels), len(v.key_labels)) <= MAX_CELLS for v in views):
        return None
    st.caption(f"Long texts are drawn in blocks of a few tokens, each showing its largest weight; hover names "
               f"a block's tokens. Click a {what} below to see all its weights.")
    return bound(st.segmented_control, key, None, init="default", options=options, cast=int,
                 valid=lambda o: o is None or o in options, label=label, format_func=format_func)


def title_for(att: Attention, what: str) -> str:
    return f"{what} · {short(att.text, 70)}"
