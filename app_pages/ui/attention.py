"""A sentence's attention as the pages get it, computed once for every session: keyed by everything that
determines it (model, text, causal mask, the heads switched off), and only ever read."""
from __future__ import annotations

import dataclasses

import streamlit as st

from analysis import head_mask, renormalise_rows
from models import Attention, AttentionModel
from models.long import LongAttention

from .generation import generated_from
from .models import ModelRef, cached_model, model_for
from .settings import Settings
from .shared import shared
from .state import choose


def _frozen(att: Attention) -> Attention:
    """``att`` with every weight array read-only, as a value shared by all sessions must be."""
    for part in (att, att.decoder, att.cross):
        if part is not None:
            part.weights.flags.writeable = False
    return att


ATTENTION_BYTES = 512 * 2**20  # attention results kept for every session: one 512-token SmolLM2 text is 283 MB


def _nbytes(att: Attention) -> int:
    return sum(part.weights.nbytes for part in (att, att.decoder, att.cross) if part is not None)


@shared("attention", entries=64, max_bytes=ATTENTION_BYTES, size=_nbytes, owned=True,
        waiting="Computing this attention")
def cached_attention(ref: ModelRef, text: str, causal: bool, heads_off: tuple, moved: bool = False,
                     layers: tuple[int, ...] | None = None) -> Attention:
    """The attention of ``text`` on ``ref``'s model (the last 64 within 512 MiB). ``moved``: each weight scaled by
    what its key sends (``value_norms``, on the from-scratch engine), rows renormalised. ``layers``: only these layers
    (``attend(layers=...)``: the from-scratch engine runs none above them)."""
    model = cached_model(ref)
    mask = head_mask(model, heads_off)
    att = model.attend(text, head_mask=mask, causal=causal, layers=layers)
    if moved:
        norms = cached_model(ref.scratch()).value_norms(text, head_mask=mask, causal=causal)
        norms = norms if layers is None else norms[list(layers)]
        att = dataclasses.replace(att, weights=renormalise_rows(norms))
    return _frozen(att)


LONG_BYTES = 640 * 2**20  # long prompts kept for every session: two 4,096-token SmolLM2 prompts run to the top


@shared("long prompt", entries=4, max_bytes=LONG_BYTES, size=lambda att: att.nbytes, owned=True,
        waiting="Reading this long prompt")
def long_prompt(ref: ModelRef, text: str, causal: bool, heads_off: tuple) -> LongAttention:
    """``text`` as a ``LongAttention`` on ``ref``'s model (on the from-scratch engine), each layer run when asked."""
    model = cached_model(ref)
    return model.attend_long(text, head_mask=head_mask(model, heads_off), causal=causal)


def long_attention(s: Settings, text: str, ref: ModelRef, model: AttentionModel, container=st) -> LongAttention | None:
    """``text`` as a ``LongAttention`` shared by every session, when it is longer than ``model`` (``ref``'s)
    keeps in ``attend`` and the model runs on the from-scratch engine (a transformers model through it on the from-scratch engine, which has
    the same sizes); else None."""
    scratch = ref.scratch()
    if scratch is None or s.moved or model.encoder_decoder or not model.is_long(text):
        return None
    model_for(scratch, container=container)
    att = long_prompt(scratch, text, s.causal and ref.is_scratch, s.heads_off if ref.is_scratch else ())
    if att.truncated:
        container.warning(f"This text has {att.n_tokens_original:,} tokens; {ref.title} reads at most "
                          f"{len(att.tokens):,} here, so it was cut there.")
    return att


def attention(s: Settings, text: str, ref: ModelRef | None = None, key: str = "component", container=st,
              long: bool = False, layers: tuple[int, ...] | None = None) -> Attention | LongAttention:
    """The attention of ``text`` on the sidebar's model or ``ref``; for an encoder-decoder model, the
    part picked under ``key``. ``long``: the page draws a ``LongAttention`` too, given for a text longer
    than ``attend`` keeps. ``layers``: only these layers' weights (not for an encoder-decoder)."""
    ref = ref or s.model
    model = model_for(ref)
    if long:
        att = long_attention(s, text, ref, model, container)
        if att is not None:
            return att
    # One slot, present on every run, holds the spinner and then the truncation note: elements
    # below it keep their place, so the chart updates in place instead of being drawn anew.
    slot = container.empty()
    with slot, st.spinner("Computing attention…"):
        att = cached_attention(ref, text, s.causal and ref.is_scratch, s.heads_off if ref.is_scratch else (),
                               s.moved and ref.scratch() is not None, None if model.encoder_decoder else layers)
    start = generated_from(text)
    if start is not None:
        att = dataclasses.replace(att, generated_from=start)  # the shared weights, its generated tokens marked
    if att.truncated:
        slot.warning(f"This text has {att.n_tokens_original} tokens; the model reads at most "
                     f"{len(att.tokens)}, so it was cut there.")
    elif s.moved and ref.scratch() is not None:
        slot.caption("Each weight is scaled by the length of what its key sends through the head "
                     "(Kobayashi et al. 2020), and each row by its total: the share of what reaches the query.")
    else:
        slot.empty()
    if att.decoder is None:
        return att
    parts = {"encoder": att, "decoder": att.decoder, "cross": att.cross}
    names = {"encoder": "Encoder self-attention", "decoder": "Decoder self-attention",
             "cross": "Cross-attention (decoder → encoder)"}
    return parts[choose("Attention", list(parts), key, container=container, cast=str, format_func=names.get)]
