"""Results cached for every session: attention, and what pages compute once and share.

Results are cached by everything that determines them: model, text, causal mask and the heads
switched off. Cached values are only ever read.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import OrderedDict

import streamlit as st

from analysis import View, head_mask, make_view, renormalise_rows
from analysis.views import first_token_sink, token_label
from models import Attention, AttentionModel, HeadLensError
from models.long import LongAttention
from viz.figures import HIDDEN_NOTE

from .generation import generated_from
from .messages import plain, stop_with
from .models import ModelRef, cached_model, model_for, scratch_twin
from .settings import Settings
from .threads import here, in_background, session_id
from .state import choose


class Bar:
    """A progress bar that redraws at most every quarter second, with the time left estimated. What it shows is
    also published under the key being computed, for the sessions waiting on it; in the server's own threads
    it is only published."""

    def __init__(self, text: str):
        self.text, self.start, self.shown = text, time.perf_counter(), 0.0
        self.key, self.cache = getattr(here, "key", None), getattr(here, "cache", None)
        self.bar = None if in_background() else st.progress(0.0, text=f"{text}…")
        self._publish(0.0, f"{text}…")

    def _publish(self, share: float, text: str) -> None:
        if self.cache is not None:
            self.cache.progress[self.key] = (share, text)

    def partial(self, value) -> None:
        """Publish what is ready so far, for a page to show while the rest is computed (``computed_once``)."""
        if self.cache is not None:
            self.cache.partial[self.key] = value
        shown = getattr(here, "show_partial", None)
        if shown is not None and not in_background():
            shown(value)

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self.shown < 0.25 and done < total:
            return
        self.shown = now
        share = min(done / max(total, 1), 1.0)
        left = (now - self.start) * (1 - share) / share if share > 0.02 else None
        text = f"{self.text}… {share:.0%}" + (f", about {left:.0f} s left" if left is not None else "")
        self._publish(share, text)
        if self.bar is not None:
            self.bar.progress(share, text=text)

    def empty(self) -> None:
        if self.bar is not None:
            self.bar.empty()


def spinner(text: str):
    """``st.spinner(text)``, or nothing in the server's own threads."""
    return contextlib.nullcontext() if in_background() else st.spinner(text)


class SharedCache:
    """The last few values for every session, within an entry count and a byte budget.

    Values are handed out as they are, never copied: st.cache_data pickles a value when storing it
    and unpickles a copy on every read, 0.1 s for one 512-token text's 72 MB of weights. Whoever
    stores a value makes it read-only. Sessions asking for the same key at once compute it once.

    ``owned``: each entry remembers the sessions that asked for it, and ``release(active)`` drops the
    entries that only closed sessions asked for (a long prompt typed by people who have left); an
    entry the server computed for everyone (``sessions.warm_up``) has no owner and stays.
    """

    def __init__(self, max_entries: int, max_bytes: int | None = None, size=lambda value: 0, owned: bool = False):
        self.max_entries, self.max_bytes, self.size, self.owned = max_entries, max_bytes, size, owned
        self._items, self._lock = OrderedDict(), threading.Lock()
        self._computing: dict = {}  # key -> lock held by the session computing that value
        self._owners: dict = {}  # key -> ids of the sessions that asked for it (owned caches)
        self.progress: dict = {}  # key -> (share, text) of a computation under way, for those waiting on it
        self.partial: dict = {}  # key -> what that computation has ready so far (``Bar.partial``)

    def _own(self, key) -> None:
        if self.owned:  # None, the server's own thread, keeps the entry for everyone
            self._owners.setdefault(key, set()).add(session_id())

    def release(self, active) -> int:
        """Drop the entries whose every owner is a session ``active(id)`` says has closed; how many went."""
        with self._lock:
            gone = [key for key, owners in self._owners.items()
                    if None not in owners and not any(map(active, owners))]
            for key in gone:
                self._items.pop(key, None)
                del self._owners[key]
            return len(gone)

    def computing(self, key) -> threading.Lock:
        """The lock to hold while computing ``key``, so that sessions asking at once compute it once."""
        with self._lock:
            return self._computing.setdefault(key, threading.Lock())

    def get(self, key):
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            self._own(key)
            return self._items[key]

    def put(self, key, value) -> None:
        with self._lock:
            self._items[key] = value
            self._own(key)
            self._computing.pop(key, None)
            while len(self._items) > self.max_entries or (
                    self.max_bytes is not None and len(self._items) > 1
                    and sum(map(self.size, self._items.values())) > self.max_bytes):
                old, _ = self._items.popitem(last=False)
                self._owners.pop(old, None)

    def get_or_compute(self, key, compute):
        """The cached value of ``key``, or ``compute()``'s, stored; an error is raised, not stored."""
        value = self.get(key)
        if value is not None:
            return value
        with self.computing(key):
            value = self.get(key)
            if value is None:
                with computing_as(self, key):
                    value = compute()
                self.put(key, value)
        return value


class computing_as:
    """Within it, ``Bar``s publish their progress under ``cache``'s ``key``, and ``partial(value)`` shows what is
    ready so far on this session's page."""

    def __init__(self, cache: SharedCache, key, partial=None):
        self.cache, self.key, self.show = cache, key, partial

    def __enter__(self):
        self.saved = (getattr(here, "cache", None), getattr(here, "key", None), getattr(here, "show_partial", None))
        here.cache, here.key, here.show_partial = self.cache, self.key, self.show
        return self

    def __exit__(self, *exc):
        here.cache, here.key, here.show_partial = self.saved
        self.cache.progress.pop(self.key, None)
        self.cache.partial.pop(self.key, None)


def computed_once(cache: SharedCache, key, compute, waiting: str, partial=None):
    """``cache``'s value of ``key``, else ``compute()``'s, stored. While another session (or the server,
    after a model loads) computes the same key, this one waits under a progress bar saying ``waiting`` and
    how far that computation has got, then takes its result. ``partial(value)``: shows what a computation
    publishes as ready so far (``Bar.partial``), whoever computes it. A ``HeadLensError`` is shown as its
    sentence and ends the run."""
    value = cache.get(key)
    if value is not None:
        return value
    if in_background():  # the server's own work: no page to wait on, and an error is the caller's to report
        return cache.get_or_compute(key, compute)
    lock = cache.computing(key)
    if not lock.acquire(blocking=False):
        bar, shown, drawn = st.progress(0.0, text=waiting), None, None
        while not lock.acquire(timeout=0.5):
            share, text = cache.progress.get(key, (0.0, ""))
            if (share, text) != shown:
                shown = (share, text)
                bar.progress(share, text=f"{waiting} {text}".strip())
            ready = cache.partial.get(key)
            if partial is not None and ready is not None and ready is not drawn:
                drawn = ready
                partial(ready)
        bar.empty()
    try:
        value = cache.get(key)
        if value is None:
            try:
                with computing_as(cache, key, partial):
                    value = compute()
            except HeadLensError as err:
                stop_with(err)
            cache.put(key, value)
        return value
    finally:
        lock.release()


def _frozen(att: Attention) -> Attention:
    """``att`` with every weight array read-only, as a value shared by all sessions must be."""
    for part in (att, att.decoder, att.cross):
        if part is not None:
            part.weights.flags.writeable = False
    return att


ATTENTION_BYTES = 512 * 2**20  # attention results kept for every session: one 512-token SmolLM2 text is 283 MB


def _nbytes(att: Attention) -> int:
    return sum(part.weights.nbytes for part in (att, att.decoder, att.cross) if part is not None)


@st.cache_resource
def attention_cache() -> SharedCache:
    return SharedCache(max_entries=64, max_bytes=ATTENTION_BYTES, size=_nbytes, owned=True)


def cached_attention(model: AttentionModel, ref: ModelRef, text: str, causal: bool, heads_off: tuple,
                     moved: bool = False, layers: tuple[int, ...] | None = None) -> Attention:
    """The attention of ``text``, computed once for every session (the last 64 within 1 GiB). ``moved``:
    each weight scaled by what its key sends (``value_norms``, on the from-scratch twin), rows renormalised.
    ``layers``: only these layers (``attend(layers=...)``: our engine runs none above them)."""
    def compute() -> Attention:
        mask = head_mask(model, heads_off)
        att = model.attend(text, head_mask=mask, causal=causal, layers=layers)
        if moved:
            norms = cached_model(scratch_twin(ref)).value_norms(text, head_mask=mask, causal=causal)
            norms = norms if layers is None else norms[list(layers)]
            att = dataclasses.replace(att, weights=renormalise_rows(norms))
        return _frozen(att)

    return attention_cache().get_or_compute((ref, text, causal, heads_off, moved, layers), compute)


LONG_BYTES = 640 * 2**20  # long prompts kept for every session: two 4,096-token SmolLM2 prompts run to the top


@st.cache_resource
def long_cache() -> SharedCache:
    return SharedCache(max_entries=4, max_bytes=LONG_BYTES, size=lambda att: att.nbytes, owned=True)


def long_attention(s: Settings, text: str, ref: ModelRef, model: AttentionModel, container=st) -> LongAttention | None:
    """``text`` as a ``LongAttention`` shared by every session, when it is longer than ``model`` (``ref``'s)
    keeps in ``attend`` and the model runs on our engine (a transformers model through its from-scratch
    twin, which has the same sizes); else None."""
    twin = scratch_twin(ref)
    if twin is None or s.moved or model.encoder_decoder or not model.is_long(text):
        return None
    model = model_for(twin, container=container)
    heads_off = s.heads_off if ref.scratch else ()
    causal = s.causal and ref.scratch

    def compute() -> LongAttention:
        return model.attend_long(text, head_mask=head_mask(model, heads_off), causal=causal)

    try:
        att = long_cache().get_or_compute((twin, text, causal, heads_off), compute)
    except HeadLensError as err:
        stop_with(err)
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
    try:
        with slot, st.spinner("Computing attention…"):
            att = cached_attention(model, ref, text, s.causal and ref.scratch, s.heads_off if ref.scratch else (),
                                   s.moved and scratch_twin(ref) is not None,
                                   None if model.encoder_decoder else layers)
    except HeadLensError as err:
        stop_with(err)
    start = generated_from(text)
    if start is not None:
        att = dataclasses.replace(att, generated_from=start)  # the shared weights, its generated tokens marked
    if att.truncated:
        slot.warning(f"This text has {att.n_tokens_original} tokens; the model reads at most "
                     f"{len(att.tokens)}, so it was cut there.")
    elif s.moved and scratch_twin(ref) is not None:
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


def view(s: Settings, att: Attention) -> View:
    """``att`` as the sidebar's view options show it."""
    return make_view(att, hide_special=s.hide_special, merge_words=s.merge_words)


def causal_note(v: View, layer: int | None = None, any_layer: bool = False) -> None:
    """A caption under a causal view's heatmaps: what their grey cells are, in the model's ``layer`` (or, with
    ``any_layer``, in any of its layers)."""
    if not v.causal:
        return
    window = v.window(layer)
    said = f"A decoder's attention: {HIDDEN_NOTE}"
    if window is not None:
        said += f"; in this layer a query sees only the last {window:,} tokens (a sliding window), so older ones are grey too"
    elif any_layer and v.windows is not None:
        sliding = [i for i, w in enumerate(v.windows) if w is not None]
        said += (f"; layers {', '.join(map(str, sliding))} see only the last {v.windows[sliding[0]]:,} tokens (a "
                 "sliding window), so older ones are grey there too")
    st.caption(f"{said}. Those cells are not zero attention; the query never saw them.")


def special_words(att: Attention, long: bool = False) -> str:
    """What ``views.set_aside`` leaves out of ``att``, in words: a column name, or (``long``) a phrase."""
    if first_token_sink(att):
        return f"the first token, “{token_label(att.tokens[0])}”, where most attention parks (a sink)" if long \
            else "to the first token (sink)"
    if long and att.causal:  # a decoder's own special tokens, such as Gemma's <bos>
        named = list(dict.fromkeys(t for t, special in zip(att.tokens, att.special) if special))
        if named:
            return "its special tokens (" + ", ".join(f"“{plain(t)}”" for t in named[:3]) + ")"  # <bos>, literally
    return "[CLS], [SEP] and the like" if long else "to special tokens"
