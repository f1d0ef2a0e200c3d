"""A sentence's attention as the pages get it, computed once for every session: keyed by everything that
determines it (model, text, causal mask, the heads switched off), and only ever read."""
from __future__ import annotations

import dataclasses

import streamlit as st

from models import Attention, AttentionModel
from models.long import LongAttention

from ..results.attention import cached_attention, long_prompt
from ..results.models import ModelRef
from .generation import generated_from
from .models import model_for
from .settings import Settings
from .state import choose


def long_attention(s: Settings, text: str, ref: ModelRef, model: AttentionModel, container=st) -> LongAttention | None:
    """``text`` as a ``LongAttention`` shared by every session, when it is longer than ``model`` (``ref``'s)
    keeps in ``attend`` and the model runs on the from-scratch engine (a transformers model through it on the from-scratch engine, which has
    the same sizes); else None."""
    scratch = ref.editable()
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
                               s.moved and ref.editable() is not None, None if model.encoder_decoder else layers)
    start = generated_from(text)
    if start is not None:
        att = dataclasses.replace(att, generated_from=start)  # the shared weights, its generated tokens marked
    if att.truncated:
        slot.warning(f"This text has {att.n_tokens_original} tokens; the model reads at most "
                     f"{len(att.tokens)}, so it was cut there.")
    elif s.moved and ref.editable() is not None:
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
