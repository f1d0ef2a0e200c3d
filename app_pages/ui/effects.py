"""Effects: the pair of prompts a page patches, and what it computes on them, once for every session."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

from analysis.effects import (PAIRS, Pair, answer_token, logit_attribution, patch_heads, patch_residual,
                              repeated_pair, token_text, top_predictions)
from analysis.routes import Flow, prediction_flow
from analysis.traced import Traced, traced
from analysis.vocabulary import copying_scores, copying_work, head_vocabulary
from models import AttentionModel, HeadLensError
from models.corpus import DEFAULT_TEXT

from .messages import plain, stop_with
from .models import TRAINED, ModelRef, cached_model
from .shared import Bar, Warm, shared, spinner
from .state import bound
from .training import trained_job

SOURCES = {"builtin": "A built-in pair", "own": "Your own prompts"}
COPYING_PREPARED = 1e12  # multiply-adds of the copying scores the server prepares
CANDIDATES = 8  # each prompt's most likely next tokens offered as the answer and the distractor


@dataclass(frozen=True)
class Effects:
    attribution: pd.DataFrame   # logit_attribution of the clean prompt
    heads: pd.DataFrame         # patch_heads, every position
    residual: pd.DataFrame      # patch_residual


def builtin_pairs(ref: ModelRef, model: AttentionModel) -> dict[str, Pair]:
    """The pairs offered for ``model``: a trained decoder's held-out sequence made an induction pair, written in
    its own tokens; for other models, the built-in English pairs."""
    if ref.choice in TRAINED:
        job = trained_job()
        if job is not None and job.run.held_out:
            pair = repeated_pair(model, job.run.held_out[0].split(" "))
            return {pair.name: pair}
    return dict(PAIRS)


def _token_label(model: AttentionModel, token: int, note: str = "") -> str:
    return f"“{token_text(model, token)}” · id {token}" + (f" · {note}" if note else "")


def pick_pair(ref: ModelRef, model: AttentionModel) -> Pair:
    """The clean and corrupted prompts and the two tokens compared, from the page's widgets (kept in the URL)."""
    pairs = builtin_pairs(ref, model)
    source = bound(st.segmented_control, "effects_source", "builtin", init="default", options=list(SOURCES),
                   cast=str, label="Prompts", format_func=SOURCES.get, required=True)
    if source == "builtin":
        names = list(pairs)
        name = bound(st.selectbox, "effects_pair", names[0], init="index", options=names, cast=str, label="Pair",
                     help="Indirect object (Wang et al. 2022): the name that did not give the drink; the corrupted "
                          "prompt swaps who gave it. A fact: one landmark's city against another's. Induction: a "
                          "sequence seen once, then again, the corrupted prompt with another token in the first copy.")
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
    favoured = next((t for t in rest if options[t].startswith("corrupted prompt's")), rest[0])
    distractor = bound(right.selectbox, "effects_distractor", favoured, init="index", options=rest, cast=int,
                       label="Distractor", format_func=lambda t: _token_label(model, t, options[t]),
                       help="The token the corrupted prompt favours: the page explains logit(answer) − "
                            "logit(distractor).")
    pair = Pair("Your prompts", "yours", clean, corrupted, answer, distractor)
    show_pair(model, pair)
    return pair


@shared("answer candidates", entries=64, waiting="Reading these prompts")
def candidates(ref: ModelRef, clean: str, corrupted: str) -> dict[int, str]:
    """Token id -> where it comes from: each prompt's most likely next tokens, then every token of the prompts,
    read from each prompt's one trace."""
    model = cached_model(ref)
    out: dict[int, str] = {}
    for what, text in (("clean", clean), ("corrupted", corrupted)):
        for rank, (token, p) in enumerate(top_predictions(model, prompt_trace(ref, text), CANDIDATES), start=1):
            out.setdefault(token, f"{what} prompt's #{rank} next token, p = {p:.2f}")  # the page reads this prefix
    for what, text in (("clean", clean), ("corrupted", corrupted)):
        for token in model.tokenizer(text, add_special_tokens=False)["input_ids"]:
            out.setdefault(int(token), f"in the {what} prompt")
    return out


def show_pair(model: AttentionModel, pair: Pair) -> None:
    """The pair's tokens as the model reads them, where the two prompts differ, and the tokens compared."""
    tok = model.tokenizer
    try:
        answer, distractor = answer_token(model, pair.answer), answer_token(model, pair.distractor, "distractor")
    except HeadLensError as err:
        stop_with(err)
    clean, corrupted = (tok.convert_ids_to_tokens(tok(t)["input_ids"]) for t in (pair.clean, pair.corrupted))
    differ = [i for i, (a, b) in enumerate(zip(clean, corrupted)) if a != b]
    where = (f"they differ at token{'s' if len(differ) > 1 else ''} {', '.join(map(str, differ))}" if differ else
             "they read the same") if len(clean) == len(corrupted) else "their lengths differ"
    st.caption(plain(f"Clean: {len(clean)} tokens, corrupted: {len(corrupted)}; {where}. Compared: "
                     f"logit(“{token_text(model, answer)}”) − logit(“{token_text(model, distractor)}”)."))


@shared("trace", entries=32, waiting="Running this prompt")
def prompt_trace(ref: ModelRef, text: str) -> Traced:
    """``text`` run once on ``ref``'s model, for every analysis of it on the page (``analysis.traced``)."""
    return traced(cached_model(ref), text)


def _pairs(ref: ModelRef) -> list[tuple]:
    """What Effects shows first, the first built-in pair on the model on the from-scratch engine patched exactly, then the other pairs
    (a head's card reads each)."""
    return [(ref.scratch(), pair, "exact") for pair in PAIRS.values()]


@shared("effects", entries=32, waiting="Patching these prompts", warm=Warm(6, _pairs))
def effects(ref: ModelRef, pair: Pair, method: str) -> Effects:
    """Attribution of the clean prompt, every head patched and the residual stream patched by position, each
    prompt traced once for all three."""
    model = cached_model(ref)
    clean, corrupted = prompt_trace(ref, pair.clean), prompt_trace(ref, pair.corrupted)
    with spinner("Attributing the logit difference to every head…"):
        attribution = logit_attribution(model, clean, pair.answer, pair.distractor)
    n = model.n_layers * model.n_heads
    bar = Bar(f"Patching each of {n} heads" if method == "exact" else "Estimating every patch")
    heads = patch_heads(model, clean, corrupted, pair.answer, pair.distractor, method=method, progress=bar)
    bar.empty()
    bar = Bar("Patching the residual stream at each layer and position")
    residual = patch_residual(model, clean, corrupted, pair.answer, pair.distractor, method=method, progress=bar)
    bar.empty()
    return Effects(attribution, heads, residual)


@shared("effects by position", entries=32, waiting="Patching these prompts")
def per_position(ref: ModelRef, pair: Pair, method: str) -> pd.DataFrame:
    """Every head patched at each position on its own (positions where the prompts agree cost nothing)."""
    bar = Bar("Patching every head at each position")
    frame = patch_heads(cached_model(ref), prompt_trace(ref, pair.clean), prompt_trace(ref, pair.corrupted),
                        pair.answer, pair.distractor, per_position=True, method=method, progress=bar)
    bar.empty()
    return frame


def frame_csv(frame: pd.DataFrame) -> str:
    return frame.to_csv(index=False)


def parts_frame(attribution: pd.DataFrame) -> pd.DataFrame:
    """Every part of the attribution, one row each: the heads, each layer's MLP and bias, the embeddings, the norm."""
    a = attribution.attrs
    rows = [("head", int(r.layer), int(r.head), float(r.attribution)) for r in attribution.itertuples()]
    rows += [("mlp", layer, None, v) for layer, v in enumerate(a["mlp"])]
    rows += [("attention_bias", layer, None, v) for layer, v in enumerate(a["attention_bias"]) if v]
    rows += [("embeddings", None, None, a["embeddings"]), ("final_norm_bias", None, None, a["final_norm"])]
    return pd.DataFrame(rows, columns=["part", "layer", "head", "attribution"])


@shared("vocabulary", entries=64, waiting="Reading this head")
def vocabulary(ref: ModelRef, prompt: str, layer: int, head: int, position: int) -> pd.DataFrame:
    """What a head writes at a position of ``prompt``, read from the prompt's trace."""
    return head_vocabulary(cached_model(ref), prompt_trace(ref, prompt), layer, head, position)


@shared("routes", entries=32, waiting="Reading this prompt's routes",
        warm=Warm(6.5, lambda ref: [(ref.scratch(), DEFAULT_TEXT)]))  # a head's card on the sidebar's first sentence
def flow(ref: ModelRef, prompt: str) -> Flow:
    """Every residual update of ``prompt`` split into its parts' shares, read from the prompt's trace."""
    with spinner("Splitting every update of the residual stream into its parts…"):
        return prediction_flow(cached_model(ref), prompt_trace(ref, prompt))


def cheap_copying(ref: ModelRef) -> list[tuple]:
    """Every head's copying scores, prepared where reading the OV circuits takes about half a minute at most
    (SmolLM2: 4.9e11 multiply-adds, 20 s on two cores); Gemma 3's 262,144-token vocabulary takes 100 s and
    5 GB, so a page asks for it."""
    return [(ref.scratch(),)] if copying_work(cached_model(ref.scratch())) <= COPYING_PREPARED else []


@shared("copying", entries=4, waiting="Reading every head's OV circuit", warm=Warm(5, cheap_copying))
def copying(ref: ModelRef) -> pd.DataFrame:
    """Every head's OV copying and suppression scores: the model's own, computed once per server."""
    model = cached_model(ref)
    bar = Bar(f"Reading the OV circuit of each of {model.n_layers * model.n_heads} heads over the vocabulary")
    frame = copying_scores(model, progress=bar)
    bar.empty()
    return frame
