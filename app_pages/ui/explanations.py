"""Every head explained in a sentence, on Head roles: how many heads a rule explains on held-out text, each head's
program, and what the model loses when its best-explained heads are replaced by their programs."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis import EXPLAINED, EXPLAINED_LIFT
from analysis import explained as explained_heads
from analysis.explanations import read_on
from models import HeadLensError
from viz.explanations import explained_grid, replacement_chart

from ..results.explanations import (PARAGRAPHS, SENTENCES, explained_for, explanations, first_replacement,
                                   paragraphs, replacement, whole_replacement)
from ..results.models import ModelRef
from .card_links import click_picks_head
from .exports import chart, file_name

SHOWN = ["layer", "head", "program", "score", "lo", "hi", "coverage", "lift", "iou", "iou_full", "positional",
         "lift_positional", "sink_share"]


def explained_now(ref: ModelRef, causal: bool, heads_off: tuple) -> tuple[pd.DataFrame, bool]:
    """Every head's explanation on the built-in paragraphs once computed (the server prepares them); until then on the
    built-in sentences (seconds), and whether the paragraphs' are drawn in their place when the server's preparation
    has them (True), or computed on a button (``every_head_explained``)."""
    args, coming = explained_for(ref, causal, heads_off)
    return explanations(*args), coming


def every_head_explained(ref: ModelRef, causal: bool, heads_off: tuple, found: pd.DataFrame, coming: bool = False,
                         sentences: list[str] = (), attend=None) -> None:
    """The section: a summary, the grid of held-out scores (a click opens a card), the table (with each program's
    score on the user's ``sentences``, read from ``attend(text)``'s attention), the replacement curve, and the
    exports; ``found`` and ``coming``: ``explained_now``'s."""
    st.subheader("Every head explained in a sentence")
    on = found.attrs.get("held_out_texts", SENTENCES)
    n, explained = len(found), int(explained_heads(found).sum())
    cols = st.columns(4)
    cols[0].metric("Heads explained", f"{explained} of {n}", help=f"On the held-out {on}: a score of {EXPLAINED} or "
                   f"more, on keys few enough for a lift of {EXPLAINED_LIFT:g} or more over uniform attention.")
    if on == PARAGRAPHS:
        short = explanations(ref, causal, heads_off, SENTENCES)
        cols[1].metric("On short sentences", f"{int(explained_heads(short).sum())} of {n}", help="The same measure "
                       "with each program fitted and read on the built-in 8-word sentences: a query there sees so few "
                       "keys that a rule naming some of them scores high by chance, and the lift rules it out.")
    else:  # the first form: the paragraphs' count is on its way, or on request
        cols[1].metric("On paragraphs", "…", help="Every head explained on the built-in paragraphs: its count takes "
                       "this place once computed.")
    cols[2].metric("Median held-out score", f"{found['score'].median():.2f}")
    cols[3].metric("Mean IoU of the rows", f"{found['iou'].mean():.2f}", help="How much of each query's row the "
                   "program predicts: Σ min / Σ max of the predicted and the actual rows on the content keys, over "
                   "the held-out queries (1: every row exactly).")
    aside = (", the first token set aside (its share is the sink share) and each query's other weights renormalised"
             if found.attrs.get("causal") else "")
    texts = (f"alternate paragraphs of the built-in prose ({found.attrs.get('fit', 0)} + "
             f"{found.attrs.get('held_out', 0)} paragraphs of 80-130 words)" if on == PARAGRAPHS else
             "alternate sentences of the built-in corpus")
    st.caption(f"Each head's program is at most three rules with their weights, fitted to its attention on {texts}, "
               "plus the first token's share and an even spread for the rest; its score is the mean over queries of "
               f"the head's attention on the rules' keys on the other {on}, with a 95% interval{aside}. A query the "
               "rules name no key for counts 0.")
    if on == SENTENCES and not coming:  # no preparation brings the paragraphs'
        _explain_paragraphs(ref, causal, heads_off)
    grid = explained_grid(found, threshold=EXPLAINED, lift=EXPLAINED_LIFT,
                          title=f"Held-out score of each head's program on {on} · {explained} of {n} explained")
    click_picks_head(chart(grid, "explained-grid", on_select="rerun", selection_mode="points"), "explained-grid",
                     grid, int(found["head"].max()) + 1)
    table = found[SHOWN]
    if sentences:
        table = _on_your_text(table, found, sentences, attend)
    st.dataframe(table.sort_values("score", ascending=False).style.format(precision=2), hide_index=True,
                 key="explained-table")
    left, right, _ = st.columns([1, 1, 2])
    left.download_button("Explanations · CSV", lambda: found.to_csv(index=False), file_name("explanations", ext="csv"),
                         "text/csv", key="explained-csv", on_click="ignore")
    right.download_button("Explanations · JSON", lambda: found.to_json(orient="records", indent=1),
                          file_name("explanations", ext="json"), "application/json", key="explained-json",
                          on_click="ignore")
    _replaced(ref, on == PARAGRAPHS)


def _explain_paragraphs(ref: ModelRef, causal: bool, heads_off: tuple) -> None:
    """A button computing every head's program on the built-in paragraphs, then shared with every session."""
    st.caption("Short sentences leave a query so few keys that a rule naming some of them scores high by chance: "
               "prose tells more.")
    if st.button("Explain every head on the built-in paragraphs", key="explain-paragraphs", type="primary",
                 icon=":material/article:", help="130 paragraphs of 80-130 words, half fitted on and half read "
                 "(about 10 s for MiniLM and 45 s for SmolLM2 on two cores), then shared with every session."):
        explanations(*paragraphs(ref, causal, heads_off))
        st.rerun()


ON_YOURS = 0.15  # a program scoring this far under its held-out score on the user's sentences is flagged


def _on_your_text(table: pd.DataFrame, found: pd.DataFrame, sentences: list[str], attend) -> pd.DataFrame:
    """The table with each head's score and IoU on the user's sentences, and a caption counting the explained heads
    those sentences do not bear out."""
    try:
        mine = read_on(found, [attend(t) for t in sentences], replicates=200)
    except HeadLensError:  # no query to read on the sentences
        return table
    table = table.assign(on_your_text=mine["score"].to_numpy(), iou_on_your_text=mine["iou"].to_numpy())
    told = explained_heads(found).to_numpy()
    worse = told & (mine["score"].to_numpy() < found["score"].to_numpy() - ON_YOURS)
    st.caption(f"On your {len(sentences)} sentence{'s' if len(sentences) > 1 else ''}: "
               f"{int(worse.sum())} of the {int(told.sum())} explained heads score {ON_YOURS} or more under their "
               "held-out score (the table's on_your_text column): there, your text does not bear their "
               "explanation out.")
    return table


def explained_in(s, layer: int, att=None) -> dict[int, str]:
    """Each head of ``layer``'s explanation, in a line, once computed for the sidebar's model (Head roles, a card or
    the server's preparation computes it; Explore does not wait for it); with ``att`` (the text shown), its program's
    score on that text too."""
    found = next((f for f in (explanations.peek(s.model, s.causal, s.heads_off, on) for on in (PARAGRAPHS, SENTENCES))
                  if f is not None), None)
    if found is None:
        return {}
    rows = found[found["layer"] == layer]
    mine = {}
    if att is not None:
        try:
            read = read_on(rows, [att], replicates=1)
            mine = {int(r.head): f"; on this text {r.score:.2f}" for r in read.itertuples()}
        except HeadLensError:  # no query to read on this text
            pass
    return {int(r.head): f"explained: {r.rule} ({r.score:.2f} held out, IoU {r.iou:.2f}{mine.get(int(r.head), '')})"
            for r in rows.itertuples()}


def _replaced(ref: ModelRef, ready: bool) -> None:
    """What the model loses with its best-explained heads replaced: a quarter of them on a few held-out paragraphs
    first, the whole curve on request; once the paragraphs' programs are ``ready``."""
    st.markdown("**Replaced by their programs**")
    if not ready:
        st.caption("The best-explained heads are replaced by their paragraphs' programs here once those are ready.")
        return
    whole = whole_replacement(ref)
    curve = replacement.peek(*whole)
    if curve is None:
        first = first_replacement(ref)
        if replacement.later(*first):
            st.caption("The best-explained quarter replaced is being prepared for every session and takes its place "
                       "here when it is ready.")
            return
        curve = replacement(*first)
        if st.button(f"The whole curve, on {len(whole[1])} held-out paragraphs", key="explained-whole",
                     icon=":material/show_chart:", help="The 1, 2, 4 best-explained heads, a tenth, a quarter, a half "
                     "and all of them replaced, each beside the same heads mean-ablated (SmolLM2: about a minute on "
                     "two cores), then shared."):
            replacement(*whole)
            st.rerun()
    measure = str(curve["measure"].iloc[0])
    if len(curve) > 1:
        chart(replacement_chart(curve, title="The best-explained heads replaced by their programs"),
              "explained-replaced")
    k = int(curve["k"].iloc[-1] if len(curve) == 1 else curve["k"].iloc[len(curve) // 2])
    row = curve[curve["k"] == k].iloc[0]
    said = "next-token loss" if measure == "loss" else "cosine to the unedited embedding"
    cols = st.columns(3)
    cols[0].metric(f"Unedited · {said}", f"{row['unedited']:.3f}")
    worse = "inverse" if measure == "loss" else "normal"  # a higher loss is worse, a higher cosine better
    cols[1].metric(f"{k} best-explained replaced", f"{row['replaced']:.3f}",
                   f"{row['replaced'] - row['unedited']:+.3f}", delta_color=worse)
    cols[2].metric(f"The same {k} mean-ablated", f"{row['mean_ablated']:.3f}",
                   f"{row['mean_ablated'] - row['unedited']:+.3f}", delta_color=worse)
    st.caption("Each head's attention replaced by the rows its program predicts (its rules' keys by their weights, "
               "the rest evenly, the first token keeping the head's mean share), against the same heads "
               f"mean-ablated, on {curve.attrs.get('texts', '')} held-out paragraphs. Heads are replaced best "
               "predicted first (the IoU of their whole rows).")
    st.dataframe(curve.style.format(precision=4), hide_index=True, key="explained-curve")
    st.download_button("Replacement · CSV", lambda: curve.to_csv(index=False), file_name("replacement", ext="csv"),
                       "text/csv", key="replaced-csv", on_click="ignore")
