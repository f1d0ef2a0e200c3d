"""Foci: the sentence written once per focus (sentence type, objects, relation, sentiment), each time
shaded by the head that focuses on it most."""
import numpy as np
import pandas as pd
import streamlit as st

from analysis import FOCI, FOCUS_NAMES, focus_tokens, long_view, make_view, received
from analysis.attention.views import set_aside
from app_pages.ui.attention import attention
from app_pages.ui.exports import chart
from app_pages.ui.long import passage, run_layers
from app_pages.ui.page import start
from app_pages.ui.pickers import pick_sentence
from app_pages.ui.profiles import CONTENT_ATTENTION, page_profile
from app_pages.ui.state import choose, head_from_url, head_to_url
from models import head_label
from models.long import LongAttention
from viz import text_shading

LINE_CHARS = 46  # characters a line of shaded text holds in the right-hand column at a 1024 px window

s, _ = start("foci")
st.caption(f"{CONTENT_ATTENTION} Each focus names the head whose content attention lifts that class of words "
           "most above what uniform attention would give, measured over the profiled sentences; its 95% interval "
           "is a bootstrap over them.")
sentence = pick_sentence(s)
profiled = page_profile(s)
frame = profiled.frame
counts = {f: int(frame[f"{f}_n"].iloc[0]) for f in FOCI}
st.caption(f"Foci found over {profiled.n_sentences:,} sentences. Sentences with a word of each class: "
           + ", ".join(f"{FOCUS_NAMES[f]} {counts[f]}" for f in FOCI) + "; the others are left out of that class.")

att = attention(s, sentence, long=True)
aside = set_aside(att)  # special tokens, and a decoder's sink
if aside.all():
    st.info("This text has no token besides the model's special tokens, so it has no content attention to show. "
            "Pick or type a sentence with words in it.")
    st.stop()
members = focus_tokens(att)
if isinstance(att, LongAttention):  # a long document: content attention computed per head, a passage shaded
    lv = long_view(att, hide_special=True)
    labels, spans = lv.labels, [(int(i), int(i) + 1) for i in lv.keep]
    first, last = passage(len(labels), "foci_from")

    def values_of(layer: int, head: int) -> np.ndarray:
        run_layers(att, layer)
        out = np.zeros(len(att.tokens))
        with st.spinner(f"Computing {head_label(layer, head)}'s content attention over {len(att.tokens):,} tokens…"):
            out[lv.keep] = lv.received(layer, head)
        return out
else:
    v = make_view(att, hide_special=True, merge_words=s.merge_words)
    labels, spans, first, last = v.key_labels, v.key_spans, 0, len(v.key_labels)

    def values_of(layer: int, head: int) -> np.ndarray:
        return received(att.weights[layer, head], aside)
n_heads = int(frame["head"].max()) + 1
rows = {}

for f in FOCI:
    name = FOCUS_NAMES[f]
    st.subheader(name.capitalize(), divider="gray")
    if counts[f] == 0:
        st.info(f"None of the profiled sentences has a {name} word, so no head is measured on it. "
                "Profile more sentences, or the built-in corpus.")
        continue
    ranked = frame.sort_values([f"{f}_lift_lo", f"{f}_lift"], ascending=False)
    options = list(zip(ranked["layer"].tolist(), ranked["head"].tolist()))
    left, right = st.columns([2, 5])
    layer, head = choose("Head", options, profiled.key(f"focus_{f}"), cast=head_from_url, to_url=head_to_url,
                         container=left, format_func=lambda h, strongest=options[0]: head_label(*h)
                         + (" (strongest)" if h == strongest else ""))
    r = frame.iloc[layer * n_heads + head]
    verdict = (f"labelled {r.label}" if r.label == f"{name} focus"
               else f"also clears the bar (labelled {r.label})" if name in r.secondary.split(", ")
               else f"below the bar; labelled {r.label}")
    left.markdown(f"Lift **{r[f'{f}_lift']:.2f}**, 95% interval {r[f'{f}_lift_lo']:.2f} to "
                  f"{r[f'{f}_lift_hi']:.2f}, over {counts[f]} sentences: {verdict}.")
    left.caption(f"Share of its content attention on {name} words {r[f]:.2f}, uniform {r[f'{f}_base']:.2f}; "
                 + (f"to the first token (a sink) {r.cls:.2f} of its raw attention." if att.causal else
                    f"to [CLS] {r.cls:.2f} and [SEP] {r.sep:.2f} of its raw attention."))
    values = values_of(layer, head)
    shown = np.array([values[a:b].sum() for a, b in spans])
    marked = [i for i, (a, b) in enumerate(spans) if members[f][a:b].any()]
    where = "" if (first, last) == (0, len(labels)) else f" · tokens {first}–{last - 1} of {len(labels):,}"
    with right:
        chart(text_shading(labels[first:last], shown[first:last], highlight=[i - first for i in marked if first <= i < last],
                           line_chars=LINE_CHARS, title=f"{name.capitalize()} · {head_label(layer, head)}{where}"),
              f"foci-{f}")
        if not marked:
            st.caption(f"This sentence has no {name} word; the shading shows where the head looks instead.")
        else:
            st.caption(f"In bold: the sentence's {name} words. They get {shown[marked].sum():.2f} of this head's "
                       f"content attention; uniform attention would give {members[f][~aside].mean():.2f}.")
    rows[f"{f} {head_label(layer, head)}"] = shown

table = pd.DataFrame({"token": labels, **rows})
st.download_button("Shading · CSV", lambda: table.to_csv(index=False), "headlens-foci.csv", "text/csv",
                   key="foci-csv", on_click="ignore")
