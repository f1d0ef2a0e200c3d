"""Effects: the pair of prompts a page patches, and what it computes on them, once for every session."""
from __future__ import annotations


import pandas as pd
import streamlit as st

from analysis.defaults import Pair

from analysis.effects import own_readout, readout_for, repeated_pair
from models import AttentionModel, HeadLensError

from ..results.effects import candidates
from ..results.messages import plain, stop_with
from ..results.models import ModelRef, TRAINED
from .state import bound
from ..results.models import trained_job

SOURCES = {"builtin": "A built-in pair", "own": "Your own prompts"}


def builtin_pairs(ref: ModelRef, model: AttentionModel) -> dict[str, Pair]:
    """The pairs offered for ``model``: a trained decoder's held-out sequence made an induction pair, written in
    its own tokens; an encoder's, the founding sentence's four foci; for other models, the built-in English pairs."""
    if ref.choice in TRAINED:
        job = trained_job()
        if job is not None and job.run.held_out:
            pair = repeated_pair(model, job.run.held_out[0].split(" "))
            return {pair.name: pair}
    return own_readout(model).builtin_pairs()


def pick_pair(ref: ModelRef, model: AttentionModel) -> Pair:
    """The clean and corrupted prompts and the two tokens compared, from the page's widgets (kept in the URL)."""
    pairs = builtin_pairs(ref, model)
    source = bound(st.segmented_control, "effects_source", "builtin", init="default", options=list(SOURCES),
                   cast=str, label="Prompts", format_func=SOURCES.get, required=True)
    if source == "builtin":
        names = list(pairs)
        name = bound(st.selectbox, "effects_pair", names[0], init="index", options=names, cast=str, label="Pair",
                     help=own_readout(model).pairs_help)
        pair = pairs[name]
        show_pair(model, pair)
        return pair
    first = next(iter(pairs.values()))
    left, right = st.columns(2)
    clean = bound(left.text_input, "effects_clean", first.clean, label="Clean prompt", max_chars=2000,
                  help="The prompt whose prediction is explained.")
    corrupted = bound(right.text_input, "effects_corrupted", first.corrupted, label="Corrupted prompt",
                      max_chars=2000, help="The same number of tokens, changed where it decides the answer.")
    if not clean.strip() or not corrupted.strip():
        st.info("Type a clean prompt and a corrupted one of the same number of tokens.")
        st.stop()
    return own_pair(ref, model, readout_for(model, clean), clean, corrupted, first)


def own_pair(ref: ModelRef, model: AttentionModel, readout, clean: str, corrupted: str, first: Pair) -> Pair:
    """A typed pair's answer and distractor, as its readout asks for them (``Readout.asks``): chosen from its
    options (a language model's likely next tokens and the prompts' tokens, a classifier's labels), else typed (an
    encoder's probe texts, a masked token's two tokens)."""
    asks, left, right = readout.asks, *st.columns(2)
    key = f"effects_{asks.key}_" if asks.key else "effects_"
    try:
        options = candidates(ref, clean, corrupted)
    except HeadLensError as err:
        stop_with(err)
    if not options:
        answer, distractor = readout.typed(first)
        answer = bound(left.text_input, key + "answer", answer, label=asks.answer, max_chars=500,
                       help=asks.answer_help).strip()
        distractor = bound(right.text_input, key + "distractor", distractor, label=asks.distractor, max_chars=500,
                           help=asks.distractor_help).strip()
        if not answer or not distractor:
            st.info(asks.empty)
            st.stop()
    else:
        kind, ids = type(next(iter(options))), list(options)
        answer = bound(left.selectbox, key + "answer", readout.first_option(options), init="index", options=ids,
                       cast=kind, label=asks.answer, format_func=lambda o: readout.option_label(o, options[o]),
                       help=asks.answer_help)
        rest = [o for o in ids if o != answer]
        distractor = bound(right.selectbox, key + "distractor", readout.against(options, answer), init="index",
                           options=rest, cast=kind, label=asks.distractor,
                           format_func=lambda o: readout.option_label(o, options[o]), help=asks.distractor_help)
    pair = Pair("Your prompts", "yours", clean, corrupted, answer, distractor)
    show_pair(model, pair)
    return pair


def compared(model: AttentionModel, pair: Pair) -> str:
    """What a pair's figures measure, in words (its readout's): logit(“ Mary”) − logit(“ John”), an encoder's
    cosines, a classifier's classes."""
    readout = readout_for(model, pair.clean)
    try:
        answer, distractor = readout.words(model.tokenize(pair.clean, verbose=False)["input_ids"], pair.answer,
                                           pair.distractor)
    except HeadLensError as err:
        stop_with(err)
    return readout.compared(answer, distractor) + readout.compared_note


def show_pair(model: AttentionModel, pair: Pair) -> None:
    """The pair's tokens as the model reads them, where the two prompts differ, and what is compared."""
    tok = model.tokenizer
    said = compared(model, pair)
    clean, corrupted = (tok.convert_ids_to_tokens(tok(t)["input_ids"]) for t in (pair.clean, pair.corrupted))
    differ = [i for i, (a, b) in enumerate(zip(clean, corrupted)) if a != b]
    where = (f"they differ at token{'s' if len(differ) > 1 else ''} {', '.join(map(str, differ))}" if differ else
             "they read the same") if len(clean) == len(corrupted) else "their lengths differ"
    st.caption(plain(f"Clean: {len(clean)} tokens, corrupted: {len(corrupted)}; {where}. Compared: {said}."))


def frame_csv(frame: pd.DataFrame) -> str:
    return frame.to_csv(index=False)


def parts_frame(attribution: pd.DataFrame) -> pd.DataFrame:
    """Every part of the attribution, one row each: the heads, each layer's MLP and bias, the embeddings, the norm."""
    a = attribution.attrs
    rows = [("head", int(r.layer), int(r.head), float(r.attribution)) for r in attribution.itertuples()]
    rows += [("mlp", layer, None, v) for layer, v in enumerate(a["mlp"])]
    rows += [("attention_bias", layer, None, v) for layer, v in enumerate(a["attention_bias"]) if v]
    norm = "final_norm_bias" if a.get("metric") != "embedding" else "norm_biases"
    rows += [("embeddings", None, None, a["embeddings"]), (norm, None, None, a["final_norm"])]
    return pd.DataFrame(rows, columns=["part", "layer", "head", "attribution"])


