"""The Head page's sections, each read from the head's card (``analysis.cards.card``) or from the result its own
page shares, each linking to that page."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis import DETECTORS, EXPLAINED, EXPLAINED_LIFT, FOCI, FOCUS_NAMES, make_view
from analysis.cards.atlas import METRICS
from analysis.effects import own_readout
from analysis.cards.card import HeadCard
from analysis.effects.routes import flow_heads
from analysis.attention.views import token_label
from analysis.cards.card import snippet
from analysis.explanations import misses, read_on
from analysis.roles.rules import rule_named
from models import DETECTOR, VOCABULARY, HeadLensError, head_label
from viz import head_heatmap, text_shading
from viz.effects import vocabulary_bars
from viz.qk import qk_tile

from ..results.card import importance_args
from ..results.effects import cheap_copying, copying, flow, vocabulary
from ..results.messages import markdown_table, plain
from ..results.models import ModelRef, cached_model
from ..results.pruning import importance
from ..results.qk import first_pictures, pictures
from .attention import attention
from .card_links import card_button
from .detector import NAMES
from .exports import chart
from .settings import Settings
from .state import bound

QK_PIXELS = 240
PAGES = {"explore": ("app_pages/explore.py", "Explore"), "roles": ("app_pages/roles.py", "Head roles"),
         "effects": ("app_pages/effects.py", "Effects"), "pruning": ("app_pages/pruning.py", "Pruning"),
         "qk": ("app_pages/queries_keys.py", "Queries & keys")}


def deeper(*pages: str) -> None:
    """Links to the pages that go deeper into a section."""
    for col, page in zip(st.columns(len(pages) + 2), pages):
        path, title = PAGES[page]
        col.page_link(path, label=f"{title} →")


def on_text(s: Settings, layer: int, head: int, text: str, shown: tuple[str, str] | None = None,
            yours: str = "sentence") -> None:
    """The head on the user's sentence (``yours``: what the user typed, "input" for a compiled program's tokens): its
    heatmap, and the sentence shaded by the attention each token receives. With ``shown`` (``HeadCard.showcase``: a
    text and why), the head on that text instead, the first token (a sink) set aside, and a sentence saying so. It
    needs no card: a page draws it before the card is gathered."""
    if shown is None:
        st.subheader("On your text" if yours == "sentence" else f"On your {yours}")
        v = make_view(attention(s, text), hide_special=s.hide_special, merge_words=s.merge_words)
        where = f"on your {yours}"
    else:
        st.subheader("Its habit, on a text that shows it")
        v = make_view(attention(s, shown[0]), hide_special=True, merge_words=s.merge_words)
        where = "on a text that shows its habit"
        st.caption(f"{shown[1]} The first token (a sink) is set aside and each query's other weights renormalised. "
                   "Type a sentence in the sidebar to see the head on yours.")
    left, right = st.columns(2)
    with left:
        chart(head_heatmap(v.head(layer, head), v.query_labels, v.key_labels, height=420,
                           visible=v.visible(layer), title=f"{head_label(layer, head)} {where}"), "card-heatmap")
    with right:
        received = v.head(layer, head).mean(axis=0)
        chart(text_shading(v.key_labels, received, title="What it looks at, mean over queries",
                           line_chars=40), "card-shading")
    deeper("explore")


CONTRADICTS = 0.15  # a score this far under the held-out one: the user's text does not bear the program out


def _on_your_text(s: Settings, e, text: str, layer: int, head: int) -> None:
    """The head's program read on the user's sentence beside its held-out reading, a warning where the sentence
    does not bear it out, and the queries of the sentence where its rules fail most."""
    att = attention(s, text)
    try:
        mine = read_on(pd.DataFrame([e]), [att], replicates=200).iloc[0]
    except HeadLensError:  # a sentence with no query to read (a decoder's single token)
        return
    said = (f"On your text: {mine['score']:.2f} (IoU {mine['iou']:.2f}); on the held-out {held_out(e)}: "
            f"{e['score']:.2f} [{e['lo']:.2f}, {e['hi']:.2f}] (IoU {e['iou']:.2f}).")
    if mine["score"] < e["score"] - CONTRADICTS:
        st.warning(said + " Your text does not bear this explanation out: on it the head gives its rules' keys "
                   "less of its weight.", icon=":material/report:")
    else:
        st.caption(said)
    missed = misses([att], rule_named(e["rule"]), layer, head)
    _misses("your text", [snippet(att, r.query, r.key) for r in missed.itertuples()], missed)


def _misses(where: str, snippets: list[str], missed: pd.DataFrame) -> None:
    """The queries ``where`` (each in its context, ``snippets``) whose weight on the program's keys is least
    (``analysis.explanations.misses``), when there are any."""
    if missed.empty:
        return
    st.caption(f"Where its rules fail most on {where}: a «query» that gives their keys little weight, and the [key] "
               "it attends to instead.")
    rows = zip(snippets, missed.itertuples())
    st.markdown(markdown_table([{"context": text, "weight": f"{r.weight:.2f}", "on its rules' keys": f"{r.on_rule:.2f}"}
                                for text, r in rows]))


def held_out(e) -> str:
    """What a head's explanation ``e`` was read on: "paragraphs", "sentences" or "text"."""
    return str(e.get("held_out_texts", "text"))


def over_corpus(card: HeadCard, n_sentences: int) -> None:
    """What the head does over the built-in corpus: its measures and its role, with the role's scores."""
    st.subheader("Over the built-in corpus")
    m = card.measures
    cols = st.columns(5)
    cols[0].metric("Entropy", f"{m['entropy']:.2f} nats", help="Of each query's attention, averaged (Clark et al. 2019).")
    cols[1].metric("Mean distance", f"{m['distance']:.1f} tokens", help="|query − key| weighted by attention.")
    cols[2].metric("On the first token", f"{m['cls']:.0%}", help="[CLS], or a decoder's first token (often a sink).")
    cols[3].metric("On the last token", f"{m['sep']:.0%}", help="[SEP] or </s> in an encoder; in a decoder the "
                   "query's own sentence end.")
    cols[4].metric("Keys it sees", "all" if card.window is None else f"last {card.window:,}",
                   help="A sliding-window layer lets a query see only its last keys; a global one sees them all.")
    detected = card.detector_role is not None  # the head detector's label first, where the model has one
    role = card.detector_role if detected else card.role
    st.markdown(plain(f"Role: {role}" + (f" (Head roles' label over the corpus: {card.role})" if detected else
                                         (f"; also {m['secondary']}" if m.get("secondary") else ""))))
    if card.detector is not None:
        d = card.detector
        rows = [{"head detector": NAMES[n], "score": f"{d[n]:.3f}", "95% interval": f"{d[f'{n}_lo']:.3f} to "
                 f"{d[f'{n}_hi']:.3f}"} for n in DETECTORS]
    else:
        rows = [{"seed focus": FOCUS_NAMES[f], "lift over uniform": f"{m[f'{f}_lift']:.2f}",
                 "95% interval": f"{m[f'{f}_lift_lo']:.2f} to {m[f'{f}_lift_hi']:.2f}"} for f in FOCI]
    st.markdown(markdown_table(rows))
    st.caption(f"Measured over {n_sentences:,} sentences of the built-in corpus, as Head roles measures them."
               + (f" No head detector: {card.detector_why}" if card.detector_why else ""))
    deeper("roles")


def explained(card: HeadCard, s: Settings | None = None, text: str | None = None) -> None:
    """The program of rules that best predicts where the head attends, fitted on half of the built-in paragraphs (or
    sentences, first) and read on the other half, read on the user's ``text`` too, and the queries where its rules
    fail most, held out and in that text."""
    st.subheader("Explained in a sentence")
    e = card.explanation
    if e is None:
        st.caption("Its explanation is being prepared.")
        return
    st.markdown(plain(f"{card.name} {e['sentence']}."))
    cols = st.columns(4)
    cols[0].metric("Held-out score", f"{e['score']:.2f}", help="The mean over queries of its attention on its rules' "
                   f"keys, on {held_out(e)} the program was not fitted on" + (" (the first token set aside, each "
                   "query's other weights renormalised)" if DETECTOR in card.offers else "")
                   + f". Explained from {EXPLAINED} with a lift of {EXPLAINED_LIFT:g} or more.")
    cols[0].caption(f"[{e['lo']:.2f}, {e['hi']:.2f}], 95% interval")
    cols[1].metric("Lift over uniform", f"{e['lift']:.1f}×", help="Its score over that of attention spread evenly "
                   "over the keys each query sees.")
    cols[2].metric("IoU of its rows", f"{e['iou']:.2f}", help="How much of each held-out row the program predicts: "
                   "Σ min / Σ max of the predicted and the actual weights on the content keys (whole rows: "
                   f"{e['iou_full']:.2f}). Over the best program of positional rules ({e['positional']}): "
                   f"{e['lift_positional']:.2f}×.")
    cols[3].metric("Queries it names keys for", f"{e['coverage']:.0%}", help="A query its rules name no key for "
                   "counts 0.")
    if s is not None and text:
        _on_your_text(s, e, text, card.layer, card.head)
    if card.misses is not None:
        _misses("the held-out sentences", list(card.misses["snippet"]), card.misses)
    deeper("roles")


def examples(card: HeadCard) -> None:
    """The corpus contexts where the head is most concentrated, and (a decoder) where it writes most."""
    st.subheader("Top examples")
    st.caption("The sentences where its attention is most concentrated on one token other than the sink and special "
               "tokens: «query» and [key] marked, with the query's weight on that key.")
    st.markdown(markdown_table([{"weight": f"{r.weight:.3f}", "context": r.snippet, "query − key": r.distance}
                                for r in card.top.itertuples()]))
    if card.writes is not None:
        st.caption("Where it writes most: the largest norm of its output (its value-weighted sum through its slice of "
                   "the output projection) at any «query» of a sentence.")
        st.markdown(markdown_table([{"norm": f"{r.norm:.1f}", "context": r.snippet} for r in card.writes.itertuples()]))


def what_it_writes(s: Settings, ref: ModelRef, card: HeadCard, text: str) -> None:
    """A decoder head's vocabulary at a position of the user's text, and its OV copying and suppression."""
    st.subheader("What it writes")
    scratch = ref.analysed
    if VOCABULARY not in card.offers:
        st.caption("What a head writes into the vocabulary is read through a language model's unembedding: on the "
                   "bundled decoders (SmolLM2, Gemma 3). This model's heads are measured by what they do to its "
                   "own prediction, below." if card.pairs is not None else
                   "What a head writes, and what it does to the built-in pairs and task, are read on the bundled "
                   "decoders (SmolLM2, Gemma 3); for a decoder trained here, open Effects.")
        return
    tokens = attention(s, text).tokens
    at = bound(st.selectbox, "card_at", len(tokens) - 1, init="index", options=list(range(len(tokens))), cast=int,
               label="At", format_func=lambda p: f"{p}: {token_label(tokens[p])}")
    words = vocabulary(scratch, text, card.layer, card.head, at)
    left, right = st.columns(2)
    with left:
        chart(vocabulary_bars(words, title=f"The logits it adds at “{token_label(tokens[at])}”"), "card-vocabulary")
    with right:
        c = card.copying
        if c is None and cheap_copying(ref):
            st.caption("Its OV copying and suppression scores are being prepared.")
            return
        if c is None:
            if st.button("Read every head's OV circuit", key="card-copying", help="Copying and suppression scores "
                         "over the whole vocabulary, computed once per server (Gemma 3's 262,144 tokens: about 100 s "
                         "on two cores)."):
                copying(scratch)
                st.rerun()
            return
        st.metric("OV copying", f"{c['copying']:.2f}", help="Share of sampled tokens its OV circuit raises among the "
                  "logits it raises most.")
        st.caption(f"Rank {int(c['copying_rank'])} of {int(c['of'])}; suppression {c['suppression']:.2f}, rank "
                   f"{int(c['suppression_rank'])}.")
    deeper("effects")


def predictions(ref: ModelRef, card: HeadCard, text: str) -> None:
    """What the head does to predictions: each built-in pair, the task, its flow share, its importance."""
    st.subheader("What it does to predictions")
    vocabulary = VOCABULARY in card.offers  # a language model's pairs and task, prepared or on their way
    encoder = not vocabulary and (card.pairs is not None or card.task is not None or bool(card.left_out))
    readout = own_readout(cached_model(ref.analysed))  # what the pairs measure, in its words
    if encoder:
        st.caption("Each built-in pair is the founding sentence with one focus changed; the head's clean output put "
                   "into the corrupted run, and its direct part, measured on the "
                   f"{readout.metrics[readout.metric].replace(': ', ' ')} (Effects).")
    if vocabulary or encoder:
        if card.pairs is not None:
            direct = "attribution" + (" (logits)" if readout.units == "logits" else "")
            st.markdown(markdown_table([{"built-in pair": r.pair,
                                         direct: "—" if r.attribution != r.attribution else f"{r.attribution:+.3f}",
                                         "rank": r.attribution_rank, "patching recovers": f"{r.recovered:+.3f}",
                                         "rank ": r.recovered_rank} for r in card.pairs.itertuples()]))
            if readout.not_linear:
                st.caption(readout.not_linear)
        elif not card.left_out:
            st.caption("The built-in pairs, each head patched, are being prepared.")
        for name, why in card.left_out.items():
            st.caption(f"Left out: {name}. {why}")
        t = card.task
        cols = st.columns(3)
        if t is None:
            cols[0].caption("The task's mean effects are being prepared.")
        else:
            cols[0].metric(f"{card.task_name}: mean recovered", f"{t['mean']:+.3f}",
                           help=f"95% interval {t['low']:.3f} to {t['high']:.3f}; q = {t['q']:.3g}; rank "
                                f"{int(t['rank'])} by size, attribution patching.")
            cols[0].caption(f"[{t['low']:.3f}, {t['high']:.3f}], rank {int(t['rank'])}")
        where = cols[1]
        if vocabulary:  # the routes of a prediction: a language model's
            shares = flow_heads(flow(ref.analysed, text))
            rank = int((shares > shares[card.layer, card.head]).sum()) + 1
            cols[1].metric("Flow share on your text", f"{shares[card.layer, card.head]:.3f}",
                           help="How much of your sentence's last token passes through it (every route, shares "
                                "multiplied).")
            cols[1].caption(f"rank {rank} of {shares.size}")
            where = cols[2]
    else:
        where = st
    _importance(ref, card, where)
    deeper("effects", "pruning")


def _importance(ref: ModelRef, card: HeadCard, where) -> None:
    if card.importance is not None:
        i = card.importance
        where.metric("Importance", f"{i['importance']:.3g}", help="As Pruning measures it by default.")
        where.caption(f"rank {int(i['rank'])} of {int(i['of'])}")
    elif where.button("Measure every head's importance", key="card-importance",
                      help="Each head switched off in turn on Pruning's sentences (a minute or so), then shared."):
        importance(*importance_args(ref.analysed))
        st.rerun()


def queries_keys(ref: ModelRef, card: HeadCard) -> None:
    """The head's queries and keys in one plane, small."""
    st.subheader("Queries and keys")
    if card.qk is None:
        if st.button("Draw every head's queries and keys", key="card-qk",
                     help="Every head over the built-in corpus, as Queries & keys draws them (then shared)."):
            pictures(*first_pictures(ref.analysed)[0])
            st.rerun()
        return
    f = card.qk
    st.image(qk_tile(f, QK_PIXELS), width=QK_PIXELS, caption=f"{card.name}: queries blue, keys orange, over "
             f"{int(f['sentence'].max()) + 1} sentences; faithfulness {f.attrs['faithfulness']:.2f}"
             + (" (a pink ground: nearness here does not show attention)" if f.attrs.get("misleads") else ""))
    deeper("qk")


def like_it(card: HeadCard, choices: dict[str, str]) -> None:
    """The heads nearest this one by their measures, in its model and the other bundled models of its kind, each
    opening its card; ``choices``: a model's title -> the sidebar's key for it."""
    st.subheader(f"Heads like {card.name}")
    like = card.like
    st.caption("Nearest by their measures (" + "; ".join(METRICS.get(c, c) for c in like.attrs["columns"])
               + "), each z-scored over the heads compared; the number is the Euclidean distance.")
    for model, group in like.groupby("model", sort=False):
        st.markdown(f"**{plain(model)}**")
        cols = st.columns(len(group))
        for col, r in zip(cols, group.itertuples()):
            card_button(r.layer, r.head, f"like-{model}-{r.layer}-{r.head}", col, choice=choices.get(model),
                        label=f"{head_label(r.layer, r.head)} · {r.distance:.2f}")
            col.caption(plain(r.role))
