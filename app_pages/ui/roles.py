"""Head roles: where a head is strongest over the profiled sentences, and the heads that behave like it."""
from __future__ import annotations

import numpy as np
import streamlit as st

from analysis import long_view, make_view, similar_heads
from analysis.roles.labels import strongest
from analysis.attention.long import ZOOM
from analysis.roles.long import SIMILARITY_ROWS
from models import head_label
from viz import head_heatmap

from ..results.messages import plain
from .exports import chart
from .long import run_layers
from .profiles import PageProfile
from .settings import Settings


def strongest_sentences(s: Settings, profiled: PageProfile, layer: int, head: int, measure: str,
                        higher: bool) -> None:
    """The three sentences where the head's measure is strongest, each as the sidebar's view shows it."""
    name = head_label(layer, head)
    values = profiled.per_sentence[measure][:, layer, head]
    order = strongest(values, higher)[:3]
    st.markdown(f"**Where {name} is strongest**")
    for tab, i in zip(st.tabs([f"{measure} {values[i]:.2f}" for i in order]), order):
        with tab:
            st.caption(plain(profiled.attentions[i].text))  # a typed or uploaded sentence: shown literally
            v = make_view(profiled.attentions[i], hide_special=s.hide_special, merge_words=s.merge_words)
            fig = head_heatmap(v.head(layer, head), v.query_labels, v.key_labels, height=460, visible=v.visible(layer),
                               title=f"{name} · {measure} {values[i]:.2f}")
            chart(fig, f"roles-example-{i}")


def similar(profiled: PageProfile, layer: int, head: int) -> None:
    """The heads whose patterns are nearest this one's over the profile's sentences."""
    frame, name = profiled.frame, head_label(layer, head)
    st.subheader(f"Heads that behave like {name}")
    near = similar_heads(profiled.divergences(layer, head), layer, head, n_heads=int(frame["head"].max()) + 1)
    near = near.merge(frame[["layer", "head", "label"]], on=["layer", "head"], how="left")
    st.dataframe(near[["layer", "head", "label", "divergence"]]
                 .rename(columns={"divergence": "Jensen-Shannon divergence (nats)"}).style.format(precision=3),
                 hide_index=True, key="roles-similar")
    rows = (f"{SIMILARITY_ROWS} query rows spread over the text" if profiled.document is not None
            else "the query rows of the first 100 sentences")
    st.caption("0 means the same pattern on every sentence; ln 2 = 0.69 means the two never look at the same "
               f"tokens. Averaged over {rows}.")


CONTEXT = 32  # tokens before a sentence drawn beside it


def strongest_in_document(s: Settings, profiled: PageProfile, layer: int, head: int, measure: str,
                          higher: bool) -> None:
    """The document's sentences where the head's measure is strongest: each sentence's queries (its last 96)
    against it and the ``CONTEXT`` tokens before it, every weight as the sidebar's view shows it."""
    name = head_label(layer, head)
    values = profiled.per_sentence[measure][:, layer, head]
    order = strongest(values, higher)[:3]
    lv = long_view(profiled.document, hide_special=s.hide_special)
    st.markdown(f"**Where {name} is strongest in the text**")
    for tab, i in zip(st.tabs([f"{measure} {values[i]:.2f}" for i in order]), order):
        text, a, b = profiled.spans[i]
        q0, q1 = (int(x) for x in np.searchsorted(lv.keep, [a, b]))
        if q1 <= q0:
            continue
        q0 = max(q0, q1 - ZOOM + CONTEXT)
        keys = (max(0, q0 - CONTEXT), q1)                    # the sentence and the tokens just before it
        with tab:
            st.caption(plain(f"Sentence {i + 1} of {len(profiled.spans)}: {text}"))
            run_layers(profiled.document, layer)
            fig = head_heatmap(lv.exact(layer, head, (q0, q1), keys), lv.labels[q0:q1], lv.labels[keys[0]:keys[1]],
                               height=460, visible=lv.visible((q0, q1), keys, layer),
                               title=f"{name} · {measure} {values[i]:.2f} · tokens {keys[0]}–{keys[1] - 1}")
            chart(fig, f"roles-example-{i}")
            st.caption(f"Each row is one of the sentence's queries against the sentence and the {CONTEXT} tokens "
                       "before it; what it gives earlier tokens is not drawn, so a row may sum to less than 1.")
