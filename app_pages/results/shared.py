"""Results computed once for every session, each declared once, on the plain function that computes it.

    @shared("detector", entries=8, waiting="Detecting this model's heads", warm=Warm(2, lambda ref: [(ref,)]))
    def detected(ref: ModelRef) -> pd.DataFrame:
        ...

``detected(ref)`` is then the value every session shares: the first session to ask computes it, the
others wait under its progress bar, and it is handed out as it is, never copied (whoever stores a value
makes it read-only). From the declaration follow, with no table to keep in step:

- its key: the declaration's name and the call's arguments (``key_of``: a list of sentences by its
  SHA-256, a long prompt by its id), so that a page and the warm-up asking with the same arguments ask
  for the same value;
- the cache that holds it: one ``SharedCache`` per declaration for the whole server, within its entry
  count and byte budget;
- the janitor's view: with ``owned``, each entry remembers the sessions that asked for it and goes when
  they have all closed (an entry the server computed for everyone stays);
- the warm-up's call (``Warm``): for a bundled decoder, the arguments its pages ask with first, in order;
- the file its value is kept in on disk across restarts (``Shared.file_key``).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from analysis.profiles.run import corpus_hash
from models import HeadLensError
from models.memory import held_bytes

from .later import leave_for_later
from .messages import stop_with
from .preparing import SESSIONS, Reentered, preparing, step_aside, waited
from .threads import here, in_background, session_id


class Bar:
    """A progress bar that redraws at most every quarter second, with the time left estimated. What it shows is
    also published under the key being computed, for the sessions waiting on it; in the server's own threads
    it is only published."""

    def __init__(self, text: str, every: float = 0.25):
        self.text, self.start, self.shown, self.every = text, time.perf_counter(), 0.0, every
        self.key, self.cache = getattr(here, "key", None), getattr(here, "cache", None)
        self.bar = None if in_background() else st.progress(0.0, text=f"{text}…")
        self._publish(0.0, f"{text}…")

    def _publish(self, share: float, text: str) -> None:
        if self.cache is not None:
            self.cache.progress[self.key] = (share, text)

    def partial(self, value) -> None:
        """Publish what is ready so far, for a page to show while the rest is computed (``computed_once``). A
        callable gives the value when called, and is called only when a page may show it: in a session's own
        computation, or in the server's while some session waits."""
        if callable(value):
            if in_background() and not SESSIONS.waiting:
                return
            value = value()
        if self.cache is not None:
            self.cache.partial[self.key] = value
        shown = getattr(here, "show_partial", None)
        if shown is not None and not in_background():
            shown(value)

    def __call__(self, done: int, total: int) -> None:
        step_aside()
        share = min(done / max(total, 1), 1.0)
        left = (time.perf_counter() - self.start) * (1 - share) / share if share > 0.02 else None
        self.show(share, f"{self.text}… {share:.0%}" + (f", about {left:.0f} s left" if left is not None else ""),
                  last=done >= total)

    def show(self, share: float, text: str, *, last: bool = False) -> None:
        """``share`` done, said by ``text``; at most once every ``every`` seconds but the ``last``."""
        now = time.perf_counter()
        if now - self.shown < self.every and not last:
            return
        self.shown = now
        self._publish(share, text)
        if self.bar is not None:
            self.bar.progress(share, text=text)

    def empty(self) -> None:
        if self.bar is not None:
            self.bar.empty()


def note(text: str) -> None:
    """A warning on the page of the session computing; nothing in the server's own threads."""
    if not in_background():
        st.warning(text)


def spinner(text: str):
    """``st.spinner(text)``, or nothing in the server's own threads."""
    return contextlib.nullcontext() if in_background() else st.spinner(text)


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


def key_of(value):
    """What stands for ``value`` in a key: a list of sentences its count and SHA-256, an object that names itself
    its ``cache_key`` (a long prompt its id), a tuple its parts' keys, anything else itself (hashable)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ("sentences", *corpus_hash(value))
    if hasattr(value, "cache_key"):
        return value.cache_key
    if isinstance(value, (list, tuple)):
        return tuple(key_of(v) for v in value)
    hash(value)  # an unhashable argument has no key: name it by what it is made from instead
    return value


@dataclass(frozen=True, eq=False)
class Named:
    """``value`` (a view, say, that is not hashed) under the key that names what it was made from."""

    value: object
    cache_key: tuple


@dataclass(frozen=True)
class Warm:
    """How the server prepares a declared result once a bundled decoder loads: ``calls(ref)``, the arguments its
    pages ask with first (a list: one call each), and ``step``, where it comes in the preparation (cheapest first)."""

    step: float
    calls: Callable


@dataclass(frozen=True)
class First:
    """A result's first form: ``args(*full_args)``, the same computation at a size that takes seconds, which a page
    shows while the preparation computes the full one (``Shared.now``); ``says`` what it is, beside the full one (or
    ``says(*full_args)`` does)."""

    args: Callable
    says: str | Callable


class Shared:
    """A declared result (``shared``): call it as the function it wraps."""

    def __init__(self, compute: Callable, name: str, entries: int, max_bytes: int | None, size: Callable | None,
                 owned: bool, waiting: str, warm: Warm | None, copy: bool, first: First | None = None):
        self.compute, self.name, self.owned, self.waiting, self.warm, self.copy, self.first = (
            compute, name, owned, waiting, warm, copy, first)
        self.__doc__, self.__wrapped__ = compute.__doc__, compute
        self._cache = (entries, max_bytes, size)

    @property
    def cache(self) -> SharedCache:
        """This result's values for the whole server."""
        with _lock:
            if self.name not in _caches:
                entries, max_bytes, size = self._cache
                _caches[self.name] = SharedCache(entries, max_bytes, size or (lambda value: 0), self.owned)
            return _caches[self.name]

    def key(self, *args) -> tuple:
        return (self.name, *map(key_of, args))

    def file_key(self, *args) -> str:
        """The name its value is stored under on disk (``store.Store``)."""
        return repr(self.key(*args))

    def __call__(self, *args, partial=None):
        """The shared value of ``compute(*args)``; ``partial``: as ``computed_once`` takes it."""
        value = computed_once(self.cache, self.key(*args), lambda: self.compute(*args), self.waiting,
                              partial=partial)
        return _copied(value) if self.copy else value

    def peek(self, *args):
        """The value if some session has computed it, else None; computes nothing."""
        return self.cache.get(self.key(*args))

    def now(self, *args) -> tuple:
        """The arguments a page asks with to show something at once: ``args`` when their value is ready; else the
        first form's (``First``), a note saying so where it is called, and the full form's step moved to the front of
        the preparation, or, where no preparation holds it (a model the server does not prepare, as the default
        encoder), left for this session to compute. Once the page is drawn it waits for (or computes) the full form
        under that note (``complete``) and runs again with it, which draws it in place."""
        if self.first is None or in_background() or self.cache.get(self.key(*args)) is not None:
            return args
        first = self.first.args(*args)
        if self.key(*first) == self.key(*args):  # as small as a first form already (a few sentences): no first form
            return args
        what = self.first.says(*args) if callable(self.first.says) else self.first.says
        says = f"A first answer: {what}. The full one"
        if not self.later(*args, says=says):
            leave_for_later(self, args, None, says, "is computed once this page is drawn")
        return first

    def later(self, *args, says: str = "") -> bool:
        """Whether a page should go on without this value: not ready, and held by a preparation, which then takes
        it next. Once the page is drawn it waits for it (``complete``) and runs again with it; ``says`` heads the
        note (drawn here) of what is shown meanwhile."""
        key = self.key(*args)
        if in_background() or self.cache.get(key) is not None:
            return False
        queue = preparing(key)
        if queue is None:
            return False
        queue.to_front(key)
        leave_for_later(self, args, queue, says, "is being prepared for every session")
        return True


def _copied(value):
    """A frame copied (a page may add columns to it), or a tuple with its frames copied."""
    if isinstance(value, pd.DataFrame):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(v.copy() if isinstance(v, pd.DataFrame) else v for v in value)
    return value


DECLARED: dict[str, Shared] = {}  # every declared result, by name
_caches: dict[str, SharedCache] = {}  # their caches, made on first use, kept when a module is imported again
_lock = threading.Lock()


def shared(name: str, *, entries: int = 8, max_bytes: int | None = None, size: Callable | None = None,
           owned: bool = False, waiting: str = "Computing this", warm: Warm | None = None, copy: bool = False,
           first: First | None = None):
    """Declare ``compute`` a result shared by every session (the module's docstring says what follows).

    Args:
        name: names the result in its keys and in the warm-up's note.
        entries, max_bytes, size: the most values kept, and their budget in bytes as ``size(value)`` counts them.
        owned: sessions own the entries they ask for; the janitor drops those whose sessions have all closed.
        waiting: what a session waiting on another's computation reads, before "once for every session".
        warm: how the server prepares it for a bundled decoder.
        copy: hand out copies of its frames, for pages that add to them.
        first: its first form, which a page shows while the preparation computes it (``Shared.now``).
    """
    def declare(compute: Callable) -> Shared:
        declared = Shared(compute, name, entries, max_bytes, size, owned, waiting, warm, copy, first)
        DECLARED[name] = declared
        return declared

    return declare

