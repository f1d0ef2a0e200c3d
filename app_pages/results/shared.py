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
import torch

from analysis.profile import corpus_hash
from models import HeadLensError

from .messages import stop_with
from .threads import here, in_background, session_id


class Sessions:
    """How many sessions are running a page or computing a shared result now (``computing``), and how many wait
    on another's computation or the preparation (``waiting``). The server's preparation steps aside for the
    first (``step_aside``, at each of its progress points): a page a session opens while the server prepares runs
    first, on the cores the preparation leaves it. It never waits while a session waits, which may be on the
    preparation itself."""

    def __init__(self):
        self.computing = self.waiting = self.aside = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def counted(self, what: str):
        with self._changed:
            setattr(self, what, getattr(self, what) + 1)
        try:
            yield
        finally:
            with self._changed:
                setattr(self, what, getattr(self, what) - 1)
                self._changed.notify_all()

    def step_aside(self, at_most_s: float = 60.0) -> float:
        """In the server's preparation: wait while some session computes and none waits, ``at_most_s`` at a time;
        the seconds waited."""
        start = time.perf_counter()
        with self._changed:
            if not self.computing or self.waiting:
                return 0.0
            self.aside += 1
            while self.computing and not self.waiting and time.perf_counter() - start < at_most_s:
                self._changed.wait(0.25)
            self.aside -= 1
        return time.perf_counter() - start


SESSIONS = Sessions()


def step_aside() -> None:
    """Where the server's preparation may pause for the sessions (``Sessions``), and first runs a step some session
    waits on (``Queue.wanted``); elsewhere nothing."""
    if getattr(here, "steps_aside", False):
        queue = getattr(here, "queue", None)
        if queue is not None:
            queue.run_wanted()
        SESSIONS.step_aside()


class Reentered(Exception):
    """A step run inside another (``Queue.run_wanted``) needs a value the outer one is computing."""


class Queue:
    """A preparation's steps not yet started, each ``(result, args)``, in order. A session that asks for one waits
    on the preparation rather than computing it (``wait_for``): the step moves to the front, and the preparation
    runs it at its next progress point, inside the step under way, which pauses (``run_wanted``); only a step that
    needs a value the paused one is computing waits for it to end."""

    def __init__(self, todo, run: Callable):
        self.todo, self.run = list(todo), run  # run(result, args): one step, as the preparation takes it
        self.wanted: set = set()  # the keys sessions wait on
        self.running: list = []  # the steps under way, (result, args) (one inside another: ``run_wanted``)
        self._lock = threading.Lock()

    @staticmethod
    def _key(item) -> tuple:
        result, args = item
        return result.key(*args)

    def holds(self, key) -> bool:
        """Whether ``key`` is a step not yet done (queued or under way)."""
        with self._lock:
            return any(self._key(item) == key for item in self.running + self.todo)

    def started(self, key) -> bool:
        """Whether ``key``'s step is under way."""
        with self._lock:
            return any(self._key(item) == key for item in self.running)

    def to_front(self, key) -> bool:
        """Move ``key``'s step to the front, wanted; whether it was queued."""
        with self._lock:
            for i, item in enumerate(self.todo):
                if self._key(item) == key:
                    self.todo.insert(0, self.todo.pop(i))
                    self.wanted.add(key)
                    return True
        return False

    def take(self, wanted: bool = False):
        """The next step, taken off the queue (None when none is left, or with ``wanted`` none a session waits on)."""
        with self._lock:
            if not self.todo or (wanted and self._key(self.todo[0]) not in self.wanted):
                return None
            item = self.todo.pop(0)
            self.wanted.discard(self._key(item))
            self.running.append(item)
            return item

    def _ran(self, item, again: bool = False) -> None:
        """``item``'s step has ended, or goes back to the front (``again``)."""
        with self._lock:
            if again:
                self.todo.insert(0, item)
            self.running.remove(item)

    def progress(self) -> tuple[float, str]:
        """How far the step under way has got (the innermost), as its progress bar says."""
        with self._lock:
            if not self.running:
                return 0.0, ""
            result, args = self.running[-1]
        return result.cache.progress.get(result.key(*args), (0.0, result.waiting))

    def prepare(self) -> None:
        """Run every step in this thread, the server's own, in order but for those sessions want first."""
        here.background = here.steps_aside = True
        here.queue = self
        QUEUES.append(self)
        try:
            while (item := self.take()) is not None:
                try:
                    step_aside()
                    self.run(*item)
                finally:
                    self._ran(item)
        finally:
            QUEUES.remove(self)
            here.queue = None

    def run_wanted(self) -> None:
        """Run the steps sessions wait on, here, inside the step under way (not inside one of them)."""
        if getattr(here, "nested", False):
            return
        here.nested = True
        try:
            while (item := self.take(wanted=True)) is not None:
                try:
                    with torch.inference_mode(False), torch.enable_grad():  # as a step starts, whatever this one set
                        self.run(*item)
                except Reentered:  # it reads what the paused step computes: it goes first once that step ends
                    self._ran(item, again=True)
                    return
                self._ran(item)
        finally:
            here.nested = False


QUEUES: list[Queue] = []  # the preparations under way


def preparing(key) -> Queue | None:
    """The preparation that has ``key`` queued and not started, if any."""
    return next((q for q in list(QUEUES) if q.holds(key)), None)


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
    entry the server computed for everyone has no owner and stays.
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
    shows while the preparation computes the full one (``Shared.now``); ``says`` what it is, beside the full one."""

    args: Callable
    says: str


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
        """The arguments a page asks with to show something at once: ``args`` when their value is ready or no
        preparation holds it; else the first form's (``First``), a note saying so where it is called, and the full
        form's step moved to the front of the preparation. Once the page is drawn it waits for the full form under
        that note (``complete``) and runs again with it, which draws it in place."""
        if self.first is None or not self.later(*args, says=f"A first answer: {self.first.says}. The full one"):
            return args
        return self.first.args(*args)

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
        slot = None
        if says:
            slot = st.empty()
            slot.info(f"{says} is being prepared for every session and takes its place here when it is ready.",
                      icon=":material/hourglass_top:")
        _pending().append((self, args, queue, slot, says))
        return True


def waited(queue: Queue, key, show: Callable, saying: str, every_s: float = 1.0) -> None:
    """Wait until the preparation ``queue`` has done ``key``'s step (or stopped), ``show((share, text))`` saying
    how far the step under way has got, at least every ``every_s`` (a click on the page then ends the wait)."""
    shown, at = None, 0.0
    while queue in QUEUES and queue.holds(key):
        share, text = queue.progress()
        if not queue.started(key):
            share, text = 0.0, f"it starts when the step under way pauses ({text or 'starting'})"
        now = time.perf_counter()
        if (share, text) != shown or now - at > every_s:
            shown, at = (share, text), now
            show((share, f"{saying}: {text}"))
        time.sleep(0.2)


def _pending() -> list:
    """The full forms this run of a page showed a first form for (``Shared.now``)."""
    if not hasattr(here, "pending"):
        here.pending = []
    return here.pending


def note_pending(text: str) -> None:
    """Say on the page, here, what it shows while the values it went on without (``later``) are prepared; their
    progress replaces the note while the page waits for them (``complete``)."""
    if _pending():
        here.note = st.empty()
        here.note.info(text, icon=":material/hourglass_top:")


def page_begins() -> None:
    """A page's run starts: nothing pending from the last."""
    here.pending, here.note = [], None


def complete() -> None:
    """At the end of a page's run: wait for each full form it showed a first form for, its progress in the note,
    then run the page again (which finds them ready)."""
    pending, here.pending = _pending(), []
    if not pending:
        return
    bottom = getattr(here, "note", None)
    with SESSIONS.counted("waiting"):
        for result, args, queue, slot, says in pending:
            if slot is None:
                bottom = slot = bottom or st.empty()
            waited(queue, result.key(*args), lambda text, slot=slot: slot.progress(*text),
                   f"{says or result.waiting} is being prepared for every session")
    for result, args, *_ in pending:
        result(*args)  # ready (computed here only if the preparation stopped first)
    st.rerun()


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


def clear_all() -> None:
    """Every declared result forgotten, as a restarted server starts."""
    for cache in list(_caches.values()):
        cache.clear()
