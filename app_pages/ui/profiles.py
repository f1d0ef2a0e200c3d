"""Head-role profiles over many sentences: computed once for every session, with a progress bar."""
from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from analysis.roles.long import DocumentProfile
from analysis.profiles.run import corpus_hash, metadata, read_profile, write_profile
from models import HeadLensError, head_label
from models.corpus import CORPUS
from models.long import LongAttention

from ..results.messages import plain, stop_with
from ..results.models import DECODERS
from ..results.profiles import corpus_profile, in_context, profile_similarity
from .attention import attention
from .models import model_for
from .settings import Settings
from .state import bound
from .uploads import uploaded, uploaded_sentences

CONTENT_ATTENTION = ("Content attention is a head's attention with the special tokens ([CLS], [SEP]) dropped and "
                     "each row rescaled to 1: attention to them works as a no-op (Clark et al. 2019) and hides what "
                     "the head does with the words. In a decoder, the first token is dropped too "
                     "when it is an attention sink (later tokens give it half their attention or more).")
SOURCES = {"corpus": f"Built-in corpus ({len(CORPUS)} sentences)", "sidebar": "The sidebar's sentences",
           "document": "The sidebar's long text, in context", "upload": "An uploaded .txt",
           "saved": "Open a saved profile"}


@dataclass
class PageProfile:
    """A profile as a page shows it: computed here (with each sentence's values, and its attention or,
    for a long document, the document and where each sentence lies in it) or opened from a file
    (per-head values only: ``per_sentence``, ``attentions`` and ``document`` are None)."""

    frame: pd.DataFrame
    n_sentences: int
    per_sentence: dict | None = None
    attentions: list | None = None
    document: LongAttention | None = None
    document_profile: DocumentProfile | None = None
    similarity: Callable[[], np.ndarray] | None = None  # its heads' divergences, computed when first asked for
    first: bool = False  # the first form of a profile not ready yet (the first sentences'), the whole one to follow

    def key(self, key: str) -> str:
        """A picker's key whose default is read from this profile (its strongest head, its commonest role): a first
        form's own, so that what it defaults to is not kept as a choice once the whole profile takes its place."""
        return f"{key}_first" if self.first else key

    @property
    def spans(self) -> list[tuple[str, int, int]] | None:
        """A document's sentences: (text, first token, stop token)."""
        return None if self.document_profile is None else self.document_profile.sentences

    def divergences(self, layer: int, head: int) -> np.ndarray:
        """``(layers * heads,)``: how far each head's pattern is from ``(layer, head)``'s (Jensen-Shannon, nats)."""
        if self.document_profile is not None:
            return self.document_profile.divergences(layer, head)
        n_heads = int(self.frame["head"].max()) + 1
        return self.similarity()[layer * n_heads + head]

    @property
    def texts(self) -> list[str] | None:
        """The sentences profiled, in order; None for a saved profile."""
        if self.attentions is not None:
            return [a.text for a in self.attentions]
        return None if self.spans is None else [text for text, _, _ in self.spans]


def page_profile(s: Settings) -> PageProfile:
    """The profile the user picks: of the built-in corpus, the sidebar's sentences or an upload, or a saved one."""
    source = bound(st.segmented_control, "corpus", "corpus", init="default", options=list(SOURCES), cast=str,
                   label="Sentences to profile", format_func=SOURCES.get, required=True)
    if source == "saved":
        return saved_profile(s)
    if source == "document":
        return document_profile(s)
    sentences = list(CORPUS) if source == "corpus" else s.sentences if source == "sidebar" else uploaded_sentences()
    # on a cold server, the first sentences' profile at once (``Shared.now``), the full one in its place when ready
    _, _, _, shown = corpus_profile.now(s.model, s.causal, s.heads_off, sentences)
    frame, per_sentence, attentions = profile(s, shown)
    return PageProfile(frame, len(attentions), per_sentence, attentions,
                       similarity=lambda: profile_similarity(s.model, s.causal, s.heads_off, shown),
                       first=len(shown) < len(sentences))


def saved_profile(s: Settings) -> PageProfile:
    """A profile written by ``python -m analysis.profiles.run`` (or saved from Head roles), checked against the sidebar's model."""
    name, data = uploaded("A profile written by `python -m analysis.profiles.run` or saved from Head roles (.parquet)",
                          "parquet", "Open a .parquet profile to see its heads here. Write one for any corpus with "
                          "`python -m analysis.profiles.run CORPUS.txt --out profile.parquet`.")
    try:
        frame, meta = read_profile(io.BytesIO(data))
    except HeadLensError as err:
        stop_with(err)
    model = model_for(s.model)
    if meta.get("model") != model.name:
        stop_with(HeadLensError(f"That profile is of the model {meta.get('model')}, not the sidebar's {model.name}. "
                             "Choose its model in the sidebar, or open a profile of this one."))
    if (meta["layers"], meta["heads"]) != (model.n_layers, model.n_heads):
        stop_with(HeadLensError(f"That profile has {meta['layers']} layers of {meta['heads']} heads; "
                             f"{model.name} has {model.n_layers} of {model.n_heads}."))
    st.caption(plain(f"Opened {name}: {meta.get('sentences', 0):,} sentences profiled by HeadLens "
                     f"{meta.get('headlens', '?')} ({meta.get('engine', '?')} engine), corpus SHA-256 "
                     f"{str(meta.get('corpus_sha256', '?'))[:12]}…"))
    saved = ({tuple(h) for h in meta["heads_off"]}, meta["causal"])
    if saved != (set(s.heads_off), s.causal):
        off = ", ".join(head_label(*h) for h in sorted(saved[0])) or "none"
        st.warning(f"This profile was made with heads switched off: {off}; causal mask: "
                   f"{'on' if saved[1] else 'off'}. The sidebar's settings differ and do not change it.")
    return PageProfile(frame, int(meta.get("sentences", 0)))


def profile_file(s: Settings, p: PageProfile) -> bytes:
    """``p`` as a Parquet profile that this page (and pandas) can open again."""
    model = model_for(s.model)
    _, sha256 = corpus_hash(p.texts)
    meta = metadata(model=model.name, backend=model.backend, engine="app", sentences=p.n_sentences, sha256=sha256,
                    layers=model.n_layers, heads=model.n_heads, heads_off=sorted(s.heads_off), causal=s.causal)
    out = io.BytesIO()
    write_profile(p.frame, meta, out)
    return out.getvalue()


def long_text(s: Settings) -> str | None:
    """The first of the sidebar's texts that the model reads as a long prompt, or None."""
    model = model_for(s.model)
    return next((t for t in s.sentences if model.is_long(t)), None)


def document_profile(s: Settings) -> PageProfile:
    """Head roles over the sidebar's long text, each sentence read in its context, computed once for every
    session a layer at a time (``analysis.roles.long``): the weights held are a block of query rows."""
    text = long_text(s)
    if text is None:
        model = model_for(s.model)
        if model.long_max_tokens <= model.max_tokens:
            st.info(f"{model.name} reads at most {model.max_tokens:,} tokens, and a text that fits is profiled "
                    "whole as \"The sidebar's sentences\". Long texts, up to 4,096 tokens with each sentence read "
                    f"in its context, open with a bundled decoder ({DECODERS}, the sidebar's model).")
        else:
            st.info(f"Type or paste a text longer than {model.max_tokens:,} tokens in the sidebar (a long prompt, "
                    f"up to {model.long_max_tokens:,}) to profile its heads over its sentences, each read in the "
                    "context of the text before it. Shorter texts are profiled as \"The sidebar's sentences\".")
        st.stop()
    att = attention(s, text, long=True)
    if not isinstance(att, LongAttention):
        stop_with(HeadLensError("Value-weighted attention is computed on whole texts; switch it off in the sidebar "
                                "to profile a long text." if s.moved else
                                "This model reads a long text only through the from-scratch engine, which does not implement it; "
                                "profile the text's sentences instead."))
    profile, frame, per_sentence = in_context(att)
    st.caption(plain(f"{len(att.tokens):,} tokens, {len(profile.sentences):,} sentences, each read after the "
                     "text before it" + (f" (the text was cut at {len(att.tokens):,} tokens)" if att.truncated else "")
                     + "."))
    return PageProfile(frame.copy(), profile.measures.n_sentences, per_sentence, None, att, profile)


def profile(s: Settings, sentences: list[str]):
    """Head roles over ``sentences`` for the sidebar's model, with a progress bar while it runs (``corpus_profile``)."""
    return corpus_profile(s.model, s.causal, s.heads_off, sentences)
