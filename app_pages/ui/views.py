"""How a page shows attention: the sidebar's view of it, and the notes under its heatmaps."""
from __future__ import annotations

import streamlit as st


from analysis import View, make_view
from analysis.attention.views import first_token_sink, token_label
from models import Attention
from viz.figures import HIDDEN_NOTE

from ..results.messages import plain
from .settings import Settings


def view(s: Settings, att: Attention) -> View:
    """``att`` as the sidebar's view options show it."""
    return make_view(att, hide_special=s.hide_special, merge_words=s.merge_words)


def causal_note(v: View, layer: int | None = None, any_layer: bool = False) -> None:
    """A caption under a causal view's heatmaps: what their grey cells are, in the model's ``layer`` (or, with
    ``any_layer``, in any of its layers)."""
    if not v.causal:
        return
    window = v.window(layer)
    said = f"A decoder's attention: {HIDDEN_NOTE}"
    if window is not None:
        said += f"; in this layer a query sees only the last {window:,} tokens (a sliding window), so older ones are grey too"
    elif any_layer and v.windows is not None:
        sliding = [i for i, w in enumerate(v.windows) if w is not None]
        said += (f"; layers {', '.join(map(str, sliding))} see only the last {v.windows[sliding[0]]:,} tokens (a "
                 "sliding window), so older ones are grey there too")
    st.caption(f"{said}. Those cells are not zero attention; the query never saw them.")


def special_words(att: Attention, long: bool = False) -> str:
    """What ``views.set_aside`` leaves out of ``att``, in words: a column name, or (``long``) a phrase."""
    if first_token_sink(att):
        return f"the first token, “{token_label(att.tokens[0])}”, where most attention parks (a sink)" if long \
            else "to the first token (sink)"
    if long and att.causal:  # a decoder's own special tokens, such as Gemma's <bos>
        named = list(dict.fromkeys(t for t, special in zip(att.tokens, att.special) if special))
        if named:
            return "its special tokens (" + ", ".join(f"“{plain(t)}”" for t in named[:3]) + ")"  # <bos>, literally
    return "[CLS], [SEP] and the like" if long else "to special tokens"


