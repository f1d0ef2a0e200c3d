"""Effects: the pair of prompts a page patches, and what it computes on them, once for every session."""
from __future__ import annotations


import pandas as pd
import streamlit as st

from analysis.defaults import Pair

from analysis.effects import own_readout, readout_for, repeated_pair, token_text
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


def _token_label(model: AttentionModel, token: int, note: object = "") -> str:
    return f"“{token_text(model, token)}” · id {token}" + (f" · {note}" if str(note) else "")


def pick_pair(ref: ModelRef, model: AttentionModel) -> Pair:
    """The clean and corrupted prompts and the two tokens compared, from the page's widgets (kept in the URL)."""
    pairs = builtin_pairs(ref, model)
    source = bound(st.segmented_control, "effects_source", "builtin", init="default", options=list(SOURCES),
                   cast=str, label="Prompts", format_func=SOURCES.get, required=True)
    if source == "builtin":
        names = list(pairs)
        name = bound(st.selectbox, "effects_pair", names[0], init="index", options=names, cast=str, label="Pair",
                     help=("“Which do you like better, coffee or tea?” with one of its foci changed: an object, the "
                           "relation, the sentence type, the sentiment. The figures measure how much nearer the "
                           "sentence's embedding is to the answer text than to the distractor's."
                           if not model.causal else
                           "Indirect object (Wang et al. 2022): the name that did not give the drink; the corrupted "
                           "prompt swaps who gave it. A fact: one landmark's city against another's. Induction: a "
                           "sequence seen once, then again, the corrupted prompt with another token in the first "
                           "copy."))
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
    readout = readout_for(model, clean)
    return OWN_PAIR[readout.name](ref, model, clean, corrupted, first)


def _candidates(ref: ModelRef, model: AttentionModel, clean: str, corrupted: str, first: Pair) -> Pair:
    """A language model's own pair: the answer and the distractor picked among each prompt's likely next tokens
    and the prompts' own tokens."""
    try:
        options = candidates(ref, clean, corrupted)
    except HeadLensError as err:
        stop_with(err)
    ids = list(options)
    left, right = st.columns(2)
    answer = bound(left.selectbox, "effects_answer", ids[0], init="index", options=ids, cast=int, label="Answer",
                   format_func=lambda t: _token_label(model, t, options[t]),
                   help="The token the clean prompt should predict: each prompt's likely next tokens and every "
                        "token of the prompts, as the tokenizer reads them (a leading space is part of a token).")
    rest = [t for t in ids if t != answer]
    favoured = next((t for t in rest if options[t].prompt == "corrupted" and options[t].predicted), rest[0])
    distractor = bound(right.selectbox, "effects_distractor", favoured, init="index", options=rest, cast=int,
                       label="Distractor", format_func=lambda t: _token_label(model, t, options[t]),
                       help="The token the corrupted prompt favours: the page explains logit(answer) − "
                            "logit(distractor).")
    pair = Pair("Your prompts", "yours", clean, corrupted, answer, distractor)
    show_pair(model, pair)
    return pair


def _labels(ref: ModelRef, model: AttentionModel, clean: str, corrupted: str, first: Pair) -> Pair:
    """A sequence classifier's own pair: two of its classes, by their labels."""
    labels = list(readout_for(model, clean).labels)
    left, right = st.columns(2)
    answer = bound(left.selectbox, "effects_label_answer", labels[-1], init="index", options=labels, cast=str,
                   label="Answer class", help="The class the clean prompt should get: the page explains "
                                              "logit(answer class) − logit(distractor class).")
    rest = [label for label in labels if label != answer]
    distractor = bound(right.selectbox, "effects_label_distractor", rest[0], init="index", options=rest, cast=str,
                       label="Distractor class", help="The class the corrupted prompt favours.")
    pair = Pair("Your prompts", "yours", clean, corrupted, answer, distractor)
    show_pair(model, pair)
    return pair


def _probes(ref: ModelRef, model: AttentionModel, clean: str, corrupted: str, first: Pair) -> Pair:
    """An encoder's own pair: the two texts its embedding is compared with, typed."""
    left, right = st.columns(2)
    answer = bound(left.text_input, "effects_probe_answer", first.answer, label="Answer text", max_chars=500,
                   help="A word or a sentence the clean prompt's embedding should be near: the page explains "
                        "cos(e, answer) − cos(e, distractor), e the prompt's sentence embedding (the mean over its "
                        "tokens).")
    distractor = bound(right.text_input, "effects_probe_distractor", first.distractor, label="Distractor text",
                       max_chars=500, help="A word or a sentence the corrupted prompt's embedding is nearer to.")
    if not answer.strip() or not distractor.strip():
        st.info("Type an answer text and a distractor text to compare the sentence's embedding with.")
        st.stop()
    pair = Pair("Your prompts", "yours", clean, corrupted, answer.strip(), distractor.strip())
    show_pair(model, pair)
    return pair


def _masked(ref: ModelRef, model: AttentionModel, clean: str, corrupted: str, first: Pair) -> Pair:
    """A masked-LM encoder's own pair: the answer and the distractor, one token each, at the clean prompt's mask."""
    mask = model.tokenizer.mask_token
    left, right = st.columns(2)
    answer = bound(left.text_input, "effects_probe_answer", "", label=f"Answer token at {mask}", max_chars=100,
                   help=f"The token the clean prompt should put at its {mask}, as the tokenizer reads it: the page "
                        "explains logit(answer) − logit(distractor) there.")
    distractor = bound(right.text_input, "effects_probe_distractor", "", label="Distractor token", max_chars=100,
                       help=f"The token the corrupted prompt favours at its {mask}.")
    if not answer.strip() or not distractor.strip():
        st.info(f"Type the answer and the distractor: one token each, compared at the {mask}.")
        st.stop()
    pair = Pair("Your prompts", "yours", clean, corrupted, answer.strip(), distractor.strip())
    show_pair(model, pair)
    return pair


# the page table: what a pair's own inputs are, by readout (``analysis.effects.readouts``)
OWN_PAIR = {"next_token": _candidates, "embedding": _probes, "masked_token": _masked, "class_label": _labels}


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


