"""Which thread is running: a session's script, or the server's own work (``sessions.warm_up``), which has no
page to draw on."""
from __future__ import annotations

import os
import sys
import threading

here = threading.local()  # per thread: the cache and key being computed, and whether it is the server's own


def in_background() -> bool:
    """Whether this thread computes for the server, with no page to draw on."""
    return getattr(here, "background", False)


def session_id() -> str | None:
    """The id of the session whose script runs in this thread; None in the server's own threads."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = None if in_background() else get_script_run_ctx(suppress_warning=True)
    return None if ctx is None else ctx.session_id


BACKGROUND_NICE = 10  # the server's own work yields the cores to the sessions' reruns


def lower_priority(nice: int | None = None) -> None:
    """Make this thread yield the cores to the sessions' reruns: a lower scheduling priority (a Linux thread has
    its own niceness, and the workers it starts inherit it), ``BACKGROUND_NICE`` unless ``HEADLENS_BACKGROUND_NICE``
    says otherwise (the test suite's 0: beside another process's tests rather than sessions, a preparation at 10
    waited on them for 17 minutes). Its torch thread count is left alone: setting it in one thread sets it for every
    thread started afterwards, the sessions' reruns among them."""
    if nice is None:
        nice = int(os.environ.get("HEADLENS_BACKGROUND_NICE", BACKGROUND_NICE))
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):
        pass


# A session's rerun runs torch in many small operations, each giving the interpreter lock up and taking it back:
# while another thread runs Python (a figure being built, a page being sent), each taking back waits up to the
# switch interval, 5 ms by default. Beside two threads running Python, SmolLM2's forward pass on three sentences
# took 10.4 s at 5 ms and 0.85 s at 1 ms (0.08 s alone): ``python -m bench.bench_switch_interval``.
SWITCH_INTERVAL_S = 0.001


def share_the_lock() -> None:
    """The server's threads hand the interpreter lock on every ``SWITCH_INTERVAL_S`` (process-wide)."""
    if sys.getswitchinterval() != SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
