"""What a result being computed shows: a progress bar that the sessions waiting on it see too, a note, a spinner;
nothing in the server's own threads."""
from __future__ import annotations

import contextlib
import time

import streamlit as st

from .preparing import SESSIONS, step_aside
from .threads import here, in_background


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
