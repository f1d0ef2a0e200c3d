"""The server's janitor: a thread that, every few seconds, drops the shared results only closed sessions
asked for (their long prompts, the attention of their sentences, their profiles: every result declared
``owned``) and hands the memory back to the system."""
from __future__ import annotations

import gc
import json
import logging
import os
import threading
import time

import streamlit as st

from models.memory import release_memory

from ..results import shared as declared

log = logging.getLogger("headlens")
SWEEP_EVERY = 5.0  # seconds between two sweeps of what closed sessions held
HELD_LOG = "HEADLENS_HELD_LOG"  # a file to which every third sweep adds a line: what every shared result holds


@st.cache_resource
def janitor() -> "Janitor":
    """The server's one janitor, started by the first session."""
    return Janitor().start()


class Janitor:
    """Every ``SWEEP_EVERY`` seconds: drop what only closed sessions asked for, then give freed memory back."""

    def __init__(self):
        self.released, self.sweeps = 0, 0
        self.thread = threading.Thread(target=self._run, name="headlens-janitor", daemon=True)

    def start(self) -> "Janitor":
        self.thread.start()
        return self

    @staticmethod
    def caches() -> list:
        """The caches of every result sessions own."""
        return [d.cache for d in list(declared.DECLARED.values()) if d.owned]

    def sweep(self) -> int:
        from streamlit.runtime import Runtime

        if not Runtime.exists():
            return 0
        runtime = Runtime.instance()
        gone = sum(cache.release(runtime.is_active_session) for cache in self.caches())
        if gone:
            gc.collect()
        release_memory()  # also what closed sessions' runs and trainings freed
        self.released += gone
        self.sweeps += 1
        if os.environ.get(HELD_LOG) and self.sweeps % 3 == 1:
            self.note(os.environ[HELD_LOG])
        return gone

    @staticmethod
    def note(path: str) -> None:
        """Add a line to ``path``: the time and, per shared result, its entries and the bytes they hold
        (``SharedCache.held``; a buffer two results share counted under the first), for a benchmark to say what the
        server's memory holds at its peak."""
        seen, held = set(), {}
        for name, result in list(declared.DECLARED.items()):
            entries, nbytes = result.cache.held(seen)
            if entries:
                held[name] = [entries, nbytes]
        line = {"t": time.time(), "held": dict(sorted(held.items(), key=lambda kv: -kv[1][1]))}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def _run(self) -> None:
        while True:
            time.sleep(SWEEP_EVERY)
            try:
                self.sweep()
            except Exception as err:  # noqa: BLE001 - the next sweep tries again
                log.warning("HeadLens's janitor: %s", err)
