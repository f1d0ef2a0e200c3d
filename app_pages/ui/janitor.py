"""The server's janitor: a thread that, every few seconds, drops the shared results only closed sessions
asked for (their long prompts, the attention of their sentences, their profiles: every result declared
``owned``) and hands the memory back to the system."""
from __future__ import annotations

import gc
import logging
import threading
import time

import streamlit as st

from models.memory import release_memory

from ..results import shared as declared

log = logging.getLogger("headlens")
SWEEP_EVERY = 5.0  # seconds between two sweeps of what closed sessions held


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
        return gone

    def _run(self) -> None:
        while True:
            time.sleep(SWEEP_EVERY)
            try:
                self.sweep()
            except Exception as err:  # noqa: BLE001 - the next sweep tries again
                log.warning("HeadLens's janitor: %s", err)
