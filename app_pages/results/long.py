"""Long prompts in the app: a ``LongAttention`` shared by every session, layers run with a progress bar,
and pooled grids cached so that a rerun redraws without recomputing."""
from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from analysis import Grid, LongView, Survey, survey
from models.long import LongAttention

from .preparing import SESSIONS, step_aside
from .progress import Bar, spinner
from .shared import shared
from .threads import here


@shared("long grid", entries=64, owned=True, waiting="Computing this layer's weights")  # at most heads x 128 x 128
def pooled(v: LongView, layer: int, heads: list[int], last: int | None) -> Grid:
    """``v.grid``: the layer's heads pooled into blocks, for every session that shows the same prompt and rows."""
    with spinner(f"Computing layer {layer}'s weights, a block of queries at a time…"):
        return v.grid(layer, heads, last=last)


@shared("long survey", entries=8, owned=True, waiting="Surveying every head")  # layers x heads x 96 x 96: 10 MB
def surveyed(v: LongView) -> Survey:
    """``analysis.survey`` of ``v``, under a progress bar."""
    att = v.attention
    bar = Bar(f"Running the prompt's {len(att.tokens):,} tokens through every layer", every=PROGRESS_EVERY)
    run = att.layers_done < att.n_layers
    if run:
        att.run_to(att.n_layers - 1, progress=lambda done, total: bar.show(
            done / total / 2, f"Running the prompt's {len(att.tokens):,} tokens: layer {done - 1} of {total}"))
    out = survey(v, progress=lambda done, total: bar.show(
        (0.5 if run else 0.0) + done / total * (0.5 if run else 1.0),
        f"Every head's weights, a block of queries at a time: layer {done - 1} of {total}"))
    bar.empty()
    return out


@shared("long rollout", entries=64, owned=True, waiting="Rolling out")  # one row of a prompt's tokens each
def rolled(v: LongView, query: int, window: tuple[int, int], residual: float) -> np.ndarray:
    """``v.rollout`` to ``query`` through the layers of ``window``, one layer's weights at a time, under a bar."""
    lo, hi = window
    bar = Bar(f"Rollout through layers {lo}–{hi}, one layer's weights at a time", every=PROGRESS_EVERY)
    out = v.rollout(query, window, residual, progress=lambda done, total: bar.show(
        done / total, f"Rollout through layers {lo}–{hi}: {done} of {total} layers"))
    bar.empty()
    return out


PROGRESS_EVERY = 1.0  # seconds between two updates of a progress bar


def throttled(update, seconds: float = PROGRESS_EVERY):
    """``update(done, total)`` at most once every ``seconds``. Each update is a message after which the
    browser redraws the page, charts included, on the cores the computation runs on: a 2,048-token view
    of the top layer took 9 to 11 s in Chromium with an update a layer, 7 to 8 s with one a second."""
    last = [0.0]

    def progress(done: int, total: int) -> None:
        step_aside()  # a progress point: the cores back when the sessions beside this one have ended
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0] = now
            update(done, total)

    return progress


_climbs: dict[int, threading.Thread] = {}  # long prompt's uid -> the thread running it to the top
_climbs_lock = threading.Lock()


def climb(att: LongAttention) -> None:
    """Run ``att`` to its top layer in the server's own thread, once per prompt, each layer after the sessions'
    reruns (``SESSIONS.step_aside``, at most ``CLIMB_PAUSE_S`` at a time, so that a busy class still sees it climb):
    once a prompt's first view is drawn, a switch to any layer computes that layer's weights alone, not the layers
    below it. It gives way to a session asking for a layer it has not reached (``LongAttention.run_to``'s
    ``behind``), which runs the layers itself, at the session's priority; the climb keeps the sessions' priority
    too, so that a session never waits long on a layer the climb has under way."""
    if not att.may_run_ahead:
        return
    with _climbs_lock:
        for uid in [uid for uid, thread in _climbs.items() if not thread.is_alive()]:
            del _climbs[uid]
        if att.uid in _climbs:
            return
        thread = threading.Thread(target=_climb, args=(weakref.ref(att),), name=f"headlens-climb-{att.uid}",
                                  daemon=True)
        _climbs[att.uid] = thread
    thread.start()


CLIMB_PAUSE_S = 5.0  # the longest a climb waits for the sessions' reruns before its next layer


def _climb(prompt: weakref.ref) -> None:
    """The climb, a layer at a time; it ends when the prompt has left the cache (no session holds it), or when the
    long prompts' budget leaves no room for its next layer (``LongAttention.may_run_ahead``)."""
    here.background = True
    while (att := prompt()) is not None and att.may_run_ahead:
        layer = att.layers_done
        del att
        SESSIONS.step_aside(at_most_s=CLIMB_PAUSE_S)
        SESSIONS.take_share()
        if (att := prompt()) is None:
            return
        att.run_to(layer, behind=True)
        if att.layers_done == layer:  # it gave way to a session, which runs the layers: look again shortly
            time.sleep(0.1)
        del att
