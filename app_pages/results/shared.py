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

import threading
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from analysis.profiles.run import corpus_hash

from .cache import SharedCache, computed_once
from .later import leave_for_later
from .preparing import preparing
from .threads import in_background


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

