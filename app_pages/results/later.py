"""What a page's run leaves for later on a cold server: the full forms of what it showed first (``Shared.now``) and
the parts it went on without (``Shared.later``). ``complete()``, at the end of ``app.py``, waits for them under
the page's note, with the preparation's progress, and runs the page again, which draws them in place.
"""
from __future__ import annotations

import streamlit as st

from .preparing import SESSIONS, waited
from .threads import here


def left_for_later() -> list:
    """What this run of a page left for later: the full forms of its first forms (``Shared.now``) and the parts it
    went on without (``Shared.later``)."""
    if not hasattr(here, "pending"):
        here.pending = []
    return here.pending


def note_pending(text: str) -> None:
    """Say on the page, here, what it shows while the values it went on without (``later``) are prepared; their
    progress replaces the note while the page waits for them (``complete``)."""
    if left_for_later():
        here.note = st.empty()
        here.note.info(text, icon=":material/hourglass_top:")


def page_begins() -> None:
    """A page's run starts: nothing pending from the last."""
    here.pending, here.note = [], None


def complete() -> None:
    """At the end of a page's run: wait for each full form it showed a first form for, its progress in the note,
    then run the page again (which finds them ready)."""
    pending, here.pending = left_for_later(), []
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
