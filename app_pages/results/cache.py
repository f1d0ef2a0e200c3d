"""The values every session shares, within an entry count and a byte budget, each computed once however many
sessions ask for it at once (``SharedCache``, ``computed_once``); ``shared`` declares a result on one."""
from __future__ import annotations

import threading
from collections import OrderedDict

import streamlit as st

from models import HeadLensError
from models.memory import held_bytes

from .messages import stop_with
from .preparing import SESSIONS, Reentered, preparing, waited
from .threads import here, in_background, session_id


class SharedCache:
    """The last few values for every session, within an entry count and a byte budget.

    Values are handed out as they are, never copied: st.cache_data pickles a value when storing it
    and unpickles a copy on every read, 0.1 s for one 512-token text's 72 MB of weights. Sessions asking
    for the same key at once compute it once.

    ``owned``: each entry remembers the sessions that asked for it, and ``release(active)`` drops the
    entries that only closed sessions asked for (a long prompt typed by people who have left); an
    entry the server computed for everyone has no owner and stays, and is the last to give way for room.
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

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._owners.clear()

    def held(self, seen: set) -> tuple[int, int]:
        """Its entries and the bytes their arrays, tensors and frames hold (``held_bytes``, a buffer in ``seen``
        counted once)."""
        with self._lock:
            values = list(self._items.values())
        return len(values), sum(held_bytes(v, seen) for v in values)

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
                old = self._leaving(key)
                del self._items[old]
                self._owners.pop(old, None)

    def _leaving(self, kept) -> object:
        """The entry to drop for room: the least recently used that only sessions asked for, before any the server
        computed for everyone (its preparation, which pages open on), but never ``kept``, the one just stored."""
        others = [key for key in self._items if key != kept]
        return next((key for key in others if None not in self._owners.get(key, {None})), others[0])

    def get_or_compute(self, key, compute):
        """The cached value of ``key``, or ``compute()``'s, stored; an error is raised, not stored."""
        value = self.get(key)
        if value is not None:
            return value
        if (self, key) in getattr(here, "holding", ()):
            raise Reentered(key)
        with self.computing(key):
            value = self.get(key)
            if value is None:
                here.holding = getattr(here, "holding", ()) + ((self, key),)
                try:
                    with computing_as(self, key):
                        value = compute()
                finally:
                    here.holding = here.holding[:-1]
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
    queue = preparing(key)
    if queue is not None and queue.to_front(key):  # the preparation runs it next: this session waits for it
        bar = st.empty()
        with SESSIONS.counted("waiting"):
            waited(queue, key, lambda text: bar.progress(*text), f"{waiting}, next in the server's preparation "
                                                                  "for every session")
        bar.empty()
    lock = cache.computing(key)
    if not lock.acquire(blocking=False):
        waiting = f"{waiting}, once for every session (already under way):"
        bar, shown, drawn = st.progress(0.0, text=waiting), None, None
        with SESSIONS.counted("waiting"):
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
                with computing_as(cache, key, partial), SESSIONS.counted("computing"):
                    value = compute()
            except HeadLensError as err:
                stop_with(err)
            cache.put(key, value)
        return value
    finally:
        lock.release()
