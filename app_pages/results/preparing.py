"""The server's preparation and the sessions, side by side: who runs first.

``Sessions`` counts the sessions running a page or computing a shared result, and those waiting; the preparation
pauses for the first at each of its progress points (``step_aside``), and the threads computing side by side split
the cores (``take_share``). ``Queue`` is a preparation's steps not yet
done: a session waiting on one moves it to the front (``to_front``), and the preparation runs it at its next
progress point, inside the step under way (``run_wanted``); ``waited`` is a session's wait for it.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from .threads import here


class Sessions:
    """How many sessions are running a page or computing a shared result now (``computing``), and how many wait
    on another's computation or the preparation (``waiting``). The server's preparation steps aside for the
    first (``step_aside``, at each of its progress points): a page a session opens while the server prepares runs
    first, on the cores the preparation leaves it. It never waits while a session waits, which may be on the
    preparation itself."""

    def __init__(self):
        self.computing = self.waiting = self.aside = 0
        self._threads: dict[int, int] = {}  # the threads computing, each with how many computations it is inside
        self._waits: dict[int, int] = {}  # the threads waiting, likewise
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def counted(self, what: str):
        me, threads = threading.get_ident(), self._threads if what == "computing" else self._waits
        with self._changed:
            setattr(self, what, getattr(self, what) + 1)
            threads[me] = threads.get(me, 0) + 1
        if what == "computing":
            self.take_share()
        try:
            yield
        finally:
            with self._changed:
                setattr(self, what, getattr(self, what) - 1)
                threads[me] -= 1
                if not threads[me]:
                    del threads[me]
                self._changed.notify_all()

    def share(self) -> int:
        """This thread's share of the cores, in torch threads: every core while it computes alone, ``CORES`` split
        among the threads computing side by side (at least one each); a page's thread waiting on another's
        computation does not count."""
        with self._changed:
            busy = len((self._threads.keys() - self._waits.keys()) | {threading.get_ident()})
        return max(1, CORES // busy)

    def take_share(self) -> None:
        """Set this thread's torch threads to its ``share``: sessions computing at once do not oversubscribe the
        cores (two sessions of two threads each on two cores wait on each other's threads). A thread's count is its
        own (each thread reads torch's count when it first computes, then keeps its own); it is set again each time
        the thread starts a computation and at each of its progress points (``step_aside``), so that a long one begun
        beside others gets the cores back when they end."""
        n = self.share()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)

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


CORES = torch.get_num_threads()  # torch's threads for one computation alone: the machine's cores
SESSIONS = Sessions()


def step_aside() -> None:
    """A progress point: where the server's preparation may pause for the sessions (``Sessions``), and first runs a
    step some session waits on (``Queue.wanted``); in any thread, where it takes its share of the cores again (a
    long computation begun beside others gets the cores back when they end)."""
    if getattr(here, "steps_aside", False):
        queue = getattr(here, "queue", None)
        if queue is not None:
            queue.run_wanted()
        SESSIONS.step_aside()
    SESSIONS.take_share()


class Reentered(Exception):
    """A step run inside another (``Queue.run_wanted``) needs a value the outer one is computing."""


class Step(NamedTuple):
    """One step of a preparation: ``result(*args)``, and its key, made once (a key hashes its sentences)."""

    result: object
    args: tuple
    key: tuple


class Queue:
    """A preparation's steps not yet done, each ``(result, args)``, in order. A session that asks for one waits on
    the preparation rather than computing it (``waited``): the step moves to the front, and the preparation runs it
    at its next progress point, inside the step under way, which pauses (``run_wanted``); only a step that needs a
    value the paused one is computing waits for it to end."""

    def __init__(self, todo, run: Callable):
        self.run = run  # run(result, args): one step, as the preparation takes it
        self.todo = [Step(result, args, result.key(*args)) for result, args in todo]  # sessions look them up by key
        self.wanted: set = set()  # the keys sessions wait on
        self.running: list = []  # the steps under way (one inside another: ``run_wanted``)
        self._lock = threading.Lock()

    def holds(self, key) -> bool:
        """Whether ``key`` is a step not yet done (queued or under way)."""
        with self._lock:
            return any(step.key == key for step in self.running + self.todo)

    def started(self, key) -> bool:
        """Whether ``key``'s step is under way."""
        with self._lock:
            return any(step.key == key for step in self.running)

    def to_front(self, key) -> bool:
        """Move ``key``'s step to the front, wanted; whether it was queued."""
        with self._lock:
            for i, step in enumerate(self.todo):
                if step.key == key:
                    self.todo.insert(0, self.todo.pop(i))
                    self.wanted.add(key)
                    return True
        return False

    def take(self, wanted: bool = False):
        """The next step, taken off the queue (None when none is left, or with ``wanted`` none a session waits on)."""
        with self._lock:
            if not self.todo or (wanted and self.todo[0].key not in self.wanted):
                return None
            step = self.todo.pop(0)
            self.wanted.discard(step.key)
            self.running.append(step)
            return step

    def _ran(self, step, again: bool = False) -> None:
        """``step`` has ended, or goes back to the front (``again``)."""
        with self._lock:
            if again:
                self.todo.insert(0, step)
            self.running.remove(step)

    def progress(self) -> tuple[float, str]:
        """How far the step under way has got (the innermost), as its progress bar says."""
        with self._lock:
            if not self.running:
                return 0.0, ""
            step = self.running[-1]
        return step.result.cache.progress.get(step.key, (0.0, step.result.waiting))

    @contextlib.contextmanager
    def opened(self):
        """Sessions find its steps (``preparing``) from here on, before it starts on them (while a model's weights
        are read): a page that asks for one meanwhile waits for the preparation, or leaves it for later (a first
        form), rather than computing it beside the preparation."""
        QUEUES.append(self)
        try:
            yield self
        finally:
            QUEUES.remove(self)

    def prepare(self) -> None:
        """Run every step in this thread, the server's own, in order but for those sessions want first."""
        here.background = here.steps_aside = True
        here.queue = self
        try:
            with contextlib.nullcontext() if self in QUEUES else self.opened():
                while (step := self.take()) is not None:
                    try:
                        step_aside()
                        self.run(step.result, step.args)
                    finally:
                        self._ran(step)
        finally:
            here.queue = None

    def run_wanted(self) -> None:
        """Run the steps sessions wait on, here, inside the step under way (not inside one of them)."""
        if getattr(here, "nested", False):
            return
        here.nested = True
        try:
            while (step := self.take(wanted=True)) is not None:
                try:
                    with torch.inference_mode(False), torch.enable_grad():  # as a step starts, whatever this one set
                        self.run(step.result, step.args)
                except Reentered:  # it reads what the paused step computes: it goes first once that step ends
                    self._ran(step, again=True)
                    return
                self._ran(step)
        finally:
            here.nested = False


QUEUES: list[Queue] = []  # the preparations under way


def preparing(key) -> Queue | None:
    """The preparation that has ``key``'s step not yet done, if any."""
    return next((q for q in list(QUEUES) if q.holds(key)), None)


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
