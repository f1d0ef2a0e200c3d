"""What a page's run leaves for later on a cold server: the full forms of what it showed first (``Shared.now``) and
the parts it went on without (``Shared.later``). ``complete()``, at the end of ``headlens.py``, waits for them under
the page's note, with the preparation's progress (or computes those no preparation holds), and runs the page
again, which draws them in place.
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


def leave_for_later(result, args: tuple, queue, says: str, how: str) -> None:
    """``result(*args)`` left for ``complete`` (``queue``: the preparation that holds it; None: this session computes
    it), with a note here of what is shown meanwhile when ``says`` heads one (``how`` the full one comes)."""
    slot = None
    if says:
        slot = st.empty()
        slot.info(f"{says} {how} and takes its place here when it is ready.", icon=":material/hourglass_top:")
    left_for_later().append((result, args, queue, slot, says))


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
    """At the end of a page's run: wait for each full form it showed a first form for, its progress in the note
    (computing here those no preparation holds), then run the page again (which finds them ready)."""
    pending, here.pending = left_for_later(), []
    if not pending:
        return
    bottom = getattr(here, "note", None)
    for result, args, queue, slot, says in pending:
        if queue is None:  # no preparation holds it: computed here, its progress under its note
            with SESSIONS.counted("computing"), slot.container():
                st.info(f"{says} is being computed for this page and takes its place here when it is ready.",
                        icon=":material/hourglass_top:")
                result(*args)
            continue
        if slot is None:
            bottom = slot = bottom or st.empty()
        with SESSIONS.counted("waiting"):
            waited(queue, result.key(*args), lambda text, slot=slot: slot.progress(*text),
                   f"{says or result.waiting} is being prepared for every session")
    for result, args, *_ in pending:
        result(*args)  # ready (computed here only if the preparation stopped first)
    st.rerun()
