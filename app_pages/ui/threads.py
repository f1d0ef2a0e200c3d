"""Which thread is running: a session's script, or the server's own work (``sessions.warm_up``), which has no
page to draw on."""
from __future__ import annotations

import os
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


BACKGROUND_NICE = 10  # the server's own work and the trainings yield the cores to the sessions' reruns


def lower_priority(nice: int = BACKGROUND_NICE) -> None:
    """Make this thread yield the cores to the sessions' reruns: a lower scheduling priority (a Linux thread has
    its own niceness) and one thread for its tensor work (torch's thread count is this thread's own). Measured
    (bench/bench_training_share.py): a training run so slows a session's forward pass 1.07-1.17x, against
    1.7-1.8x at the same priority and 1.7x with the lower priority alone, whose two workers spin waiting for
    each other on two busy cores."""
    import torch

    torch.set_num_threads(1)
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):
        pass
