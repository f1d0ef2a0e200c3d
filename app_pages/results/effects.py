"""Effects: the pair of prompts a page patches, and what it computes on them, once for every session."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis.defaults import Pair

from analysis.effects import logit_attribution, own_readout, readout_for, patch_heads, patch_residual, top_predictions
from analysis.effects.routes import Flow, prediction_flow
from analysis.effects.traced import Traced, traced
from analysis.effects.vocabulary import copying_scores, copying_work, head_vocabulary
from models.corpus import DEFAULT_TEXT

from .models import ModelRef, cached_model
from .progress import Bar, spinner
from .shared import Warm, shared


COPYING_PREPARED = 1e12  # multiply-adds of the copying scores the server prepares


CANDIDATES = 8  # each prompt's most likely next tokens offered as the answer and the distractor


@dataclass(frozen=True)
class Effects:
    attribution: pd.DataFrame | None  # logit_attribution of the clean prompt (None at a [MASK]: not a sum of parts)
    heads: pd.DataFrame         # patch_heads, every position
    residual: pd.DataFrame      # patch_residual


@shared("answer candidates", entries=64, waiting="Reading these prompts")
def candidates(ref: ModelRef, clean: str, corrupted: str) -> dict:
    """What a typed pair's answer and distractor are chosen from on ``ref``'s model (its readout's ``options``: a
    language model's likely next tokens, read from each prompt's one trace, and the prompts' tokens; a classifier's
    labels), each with its note; empty where they are typed."""
    model = cached_model(ref)
    readout = readout_for(model, clean)
    return readout.options(clean, corrupted, lambda text: top_predictions(model, prompt_trace(ref, text),
                                                                          CANDIDATES)) or {}


@shared("trace", entries=32, waiting="Running this prompt")
def prompt_trace(ref: ModelRef, text: str) -> Traced:
    """``text`` run once on ``ref``'s model, for every analysis of it on the page (``analysis.effects.traced``)."""
    return traced(cached_model(ref), text)


def _pairs(ref: ModelRef) -> list[tuple]:
    """What Effects shows first, the first built-in pair on the model on the from-scratch engine patched exactly, then the other pairs
    (a head's card reads each)."""
    pairs = own_readout(cached_model(ref.analysed)).builtin_pairs()
    return [(ref.analysed, pair, "exact") for pair in pairs.values()]


@shared("effects", entries=32, waiting="Patching these prompts", warm=Warm(6, _pairs))
def effects(ref: ModelRef, pair: Pair, method: str) -> Effects:
    """Attribution of the clean prompt, every head patched and the residual stream patched by position, each
    prompt traced once for all three."""
    model = cached_model(ref)
    clean, corrupted = prompt_trace(ref, pair.clean), prompt_trace(ref, pair.corrupted)
    attribution = None  # a readout that is not linear (a masked token's logits, a pooled classifier's): no direct parts
    if readout_for(model, pair.clean).not_linear is None:
        with spinner("Attributing the difference to every head…"):
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


@shared("vocabulary", entries=64, waiting="Reading this head")
def vocabulary(ref: ModelRef, prompt: str, layer: int, head: int, position: int) -> pd.DataFrame:
    """What a head writes at a position of ``prompt``, read from the prompt's trace."""
    return head_vocabulary(cached_model(ref), prompt_trace(ref, prompt), layer, head, position)


@shared("routes", entries=32, waiting="Reading this prompt's routes",
        warm=Warm(6.5, lambda ref: [(ref.analysed, DEFAULT_TEXT)]))  # a head's card on the sidebar's first sentence
def flow(ref: ModelRef, prompt: str) -> Flow:
    """Every residual update of ``prompt`` split into its parts' shares, read from the prompt's trace."""
    with spinner("Splitting every update of the residual stream into its parts…"):
        return prediction_flow(cached_model(ref), prompt_trace(ref, prompt))


def cheap_copying(ref: ModelRef) -> list[tuple]:
    """Every head's copying scores, prepared where reading the OV circuits takes about half a minute at most
    (SmolLM2: 4.9e11 multiply-adds, 20 s on two cores); Gemma 3's 262,144-token vocabulary takes 100 s and
    5 GB, so a page asks for it."""
    return [(ref.analysed,)] if copying_work(cached_model(ref.analysed)) <= COPYING_PREPARED else []


@shared("copying", entries=4, waiting="Reading every head's OV circuit", warm=Warm(5, cheap_copying))
def copying(ref: ModelRef) -> pd.DataFrame:
    """Every head's OV copying and suppression scores: the model's own, computed once per server."""
    model = cached_model(ref)
    bar = Bar(f"Reading the OV circuit of each of {model.n_layers * model.n_heads} heads over the vocabulary")
    frame = copying_scores(model, progress=bar)
    bar.empty()
    return frame
