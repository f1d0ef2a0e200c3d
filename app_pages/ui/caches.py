"""Models and attention results, cached for every session; models are only ever read.

Results are cached by everything that determines them: model, device, text, causal mask and
the heads switched off.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import streamlit as st

from analysis import View, make_view
from models import Attention, AttentionModel, HeadLensError, load_model

from .messages import stop_with
from .settings import SCRATCH, TRAINED, Settings, custom_for
from .state import choose
from .training import trained_model


def check_custom_folder(name: str) -> None:
    """Where ``HEADLENS_MODELS_DIR`` is set (a server for a class), custom model folders must lie under it.

    Model ids still come from the server's Hugging Face cache; any other folder is refused
    without saying whether it exists.
    """
    root = os.environ.get("HEADLENS_MODELS_DIR")
    path = Path(name).expanduser()
    if not root or not (path.is_absolute() or path.exists() or name.startswith((".", "~"))):
        return
    if not path.resolve().is_relative_to(Path(root).expanduser().resolve()):
        raise HeadLensError(f"This server loads model folders from {root} only; give a folder there, "
                            "or a model id from its Hugging Face cache.")


def cached_model(choice: str, custom: str, device: str) -> AttentionModel:
    """The model behind a sidebar choice: one instance per (model, device) for every session, only
    ever read; this session's own for a trained decoder (``custom`` is then the run's id)."""
    if choice in TRAINED:
        return trained_model(choice, custom)
    return shared_model(choice, custom, device)


@st.cache_resource(max_entries=4, show_spinner=False)
def shared_model(choice: str, custom: str, device: str) -> AttentionModel:
    if choice == "custom":
        if not custom.strip():
            raise HeadLensError("Type a model id from the local Hugging Face cache, or the path of a model folder.")
        return load_model(custom.strip(), device=device)
    return load_model(backend="transformers" if choice == "minilm" else "scratch", device=device,
                      untrained=choice == "untrained")


def model_for(choice: str, custom: str, device: str, container=st) -> AttentionModel:
    """The cached model, with a spinner while it loads and its error as a sentence."""
    slot = container.empty()  # keeps the elements after it in place, spinner or not
    try:
        if choice == "custom":
            check_custom_folder(custom.strip())  # before the cache, which may hold it from before
        with slot, st.spinner("Loading the model…"):
            model = cached_model(choice, custom, device)
    except HeadLensError as err:
        stop_with(err)
    slot.empty()
    return model


def head_mask(model: AttentionModel, heads_off: tuple[str, ...]) -> np.ndarray | None:
    """``(layers, heads)`` 0/1 from "layer.head" names; None when every head is on."""
    if not heads_off:
        return None
    mask = np.ones((model.n_layers, model.n_heads), dtype=np.float32)
    for layer, head in heads_named(heads_off):
        mask[layer, head] = 0
    return mask


def heads_named(names) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs from the sidebar's "layer.head" names."""
    return [tuple(map(int, name.split("."))) for name in names]


class SharedCache:
    """The last few values for every session, within an entry count and a byte budget.

    Values are handed out as they are, never copied: st.cache_data pickles a value when storing it
    and unpickles a copy on every read, 0.1 s for one 512-token text's 72 MB of weights. Whoever
    stores a value makes it read-only. Sessions asking for the same key at once compute it once.
    """

    def __init__(self, max_entries: int, max_bytes: int | None = None, size=lambda value: 0):
        self.max_entries, self.max_bytes, self.size = max_entries, max_bytes, size
        self._items, self._lock = OrderedDict(), threading.Lock()
        self._computing: dict = {}  # key -> lock held by the session computing that value

    def computing(self, key) -> threading.Lock:
        """The lock to hold while computing ``key``, so that sessions asking at once compute it once."""
        with self._lock:
            return self._computing.setdefault(key, threading.Lock())

    def get(self, key):
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key, value) -> None:
        with self._lock:
            self._items[key] = value
            self._computing.pop(key, None)
            while len(self._items) > self.max_entries or (
                    self.max_bytes is not None and len(self._items) > 1
                    and sum(map(self.size, self._items.values())) > self.max_bytes):
                self._items.popitem(last=False)

    def get_or_compute(self, key, compute):
        """The cached value of ``key``, or ``compute()``'s, stored; an error is raised, not stored."""
        value = self.get(key)
        if value is not None:
            return value
        with self.computing(key):
            value = self.get(key)
            if value is None:
                value = compute()
                self.put(key, value)
        return value


def computed_once(cache: SharedCache, key, compute, waiting: str):
    """``cache``'s value of ``key``, else ``compute()``'s, stored. While another session computes the
    same key, this one waits under a spinner saying ``waiting``, then takes that result. A
    ``HeadLensError`` is shown as its sentence and ends the run."""
    value = cache.get(key)
    if value is not None:
        return value
    lock = cache.computing(key)
    if not lock.acquire(blocking=False):
        with st.spinner(waiting):
            lock.acquire()
    try:
        value = cache.get(key)
        if value is None:
            try:
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


def _nbytes(att: Attention) -> int:
    return sum(part.weights.nbytes for part in (att, att.decoder, att.cross) if part is not None)


@st.cache_resource
def attention_cache() -> SharedCache:
    return SharedCache(max_entries=64, max_bytes=2**30, size=_nbytes)


def cached_attention(choice: str, custom: str, device: str, text: str, causal: bool,
                     heads_off: tuple[str, ...]) -> Attention:
    """The attention of ``text``, computed once for every session (the last 64 within 1 GiB)."""
    def compute() -> Attention:
        model = cached_model(choice, custom, device)
        return _frozen(model.attend(text, head_mask=head_mask(model, heads_off), causal=causal))

    return attention_cache().get_or_compute((choice, custom, device, text, causal, heads_off), compute)


def attention(s: Settings, text: str, choice: str | None = None, key: str = "component", container=st) -> Attention:
    """The attention of ``text``; for an encoder-decoder model, the part picked under ``key``."""
    choice = choice or s.choice
    custom = s.custom if choice == s.choice else custom_for(choice)
    scratch = choice in SCRATCH
    model_for(choice, custom, s.device)
    # One slot, present on every run, holds the spinner and then the truncation note: elements
    # below it keep their place, so the chart updates in place instead of being drawn anew.
    slot = container.empty()
    try:
        with slot, st.spinner("Computing attention…"):
            att = cached_attention(choice, custom, s.device, text, s.causal and scratch,
                                   s.heads_off if scratch else ())
    except HeadLensError as err:
        stop_with(err)
    if att.truncated:
        slot.warning(f"This text has {att.n_tokens_original} tokens; the model reads at most "
                     f"{len(att.tokens)}, so it was cut there.")
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
