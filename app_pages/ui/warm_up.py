"""The server's warm-up: once a bundled decoder has loaded, a background thread prepares what its slowest
pages need over the built-in corpus, each result into the cache the page reads, and keeps it on disk
(``store``) so that a restarted server finds it at once. A page asking for one of them meanwhile waits
for it under the computation's own progress bar.

What is prepared is what the shared results declare (``shared.Warm``): each declaration names the calls its
page makes first and where they come in the preparation; nothing here names a page.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from models.catalog import bundled
from models.corpus import CORPUS
from models.files import resolve_model_dir
from models.gguf import cache_root
from models.memory import release_memory

from ..results import declarations, steps
from ..results.preparing import SESSIONS, Queue, step_aside
from ..results.models import LLM, ModelRef, cached_model
from ..results.store import Store, folder_digest
from ..results.threads import here, lower_priority

log = logging.getLogger("headlens")


@dataclass
class Warmup:
    """One model's warm-up (for both its engines): what it has done, from the disk or computed, and how long each took."""

    ref: ModelRef
    state: str = "waiting"  # waiting, running, done, failed
    done: list = field(default_factory=list)  # (step, how: "stored" (read from disk), "computed" or "found", seconds)
    current: str = ""  # the step under way
    total: int = 0
    error: str | None = None
    thread: threading.Thread | None = None
    queue: "Queue | None" = None  # the steps not yet started

    @property
    def running(self) -> bool:
        return self.state in ("waiting", "running")


@st.cache_resource
def warmups() -> dict:
    """Every warm-up this server has started, by model (``ModelRef.cache_key``)."""
    return {}


_started = threading.Lock()


def results_root() -> Path:
    """Where results are kept across restarts: ``HEADLENS_RESULTS``, else ``results`` in HeadLens's cache."""
    return Path(os.environ.get("HEADLENS_RESULTS") or cache_root() / "results").expanduser()


def enabled() -> bool:
    return os.environ.get("HEADLENS_WARM_UP", "1") != "0"


def job(ref: ModelRef) -> "Warmup | None":
    """The warm-up this server runs for ``ref``'s model (one for both of its engines), or None."""
    return warmups().get(ref.cache_key)


def warm_up(ref: ModelRef) -> Warmup | None:
    """Start ``ref``'s warm-up, once per server, when it is a bundled decoder. For any model, spaCy's English
    pipeline is loaded in the background (once, a second), which every word-level measure of Head roles, Foci and
    a head's card reads (a preparation read from disk reads none)."""
    if enabled():
        _pipeline_loaded()
    if not enabled() or ref.choice not in LLM or ref.run:
        return None
    ref = ModelRef(ref.choice, device=ref.device)
    registry = warmups()
    with _started:
        if ref.cache_key in registry:
            return registry[ref.cache_key]
        started = registry[ref.cache_key] = Warmup(ref)
    declarations()  # imported here, in a session's thread, not the warm-up's
    started.thread = threading.Thread(target=_warm, args=(started,), name=f"headlens-warm-{ref.choice}", daemon=True)
    started.thread.start()
    return started


@st.cache_resource
def _pipeline_loaded() -> threading.Thread:
    from analysis.roles.measure import parse

    def load() -> None:  # spaCy's pipeline, and its parse of the built-in corpus that every model's profile reads
        lower_priority()
        SESSIONS.step_aside()  # after the page that opened the model
        parse(list(CORPUS))

    thread = threading.Thread(target=load, name="headlens-spacy", daemon=True)
    thread.start()
    return thread


def warm_up_note(ref: ModelRef) -> str | None:
    """What the server is still preparing for ``ref``'s pages, in a sentence; None when nothing is."""
    running = job(ref)
    if running is None or not running.running:
        return None
    paused = ", paused while pages compute" if SESSIONS.aside else ""
    return (f"Preparing this model's pages over the built-in corpus in the background ({running.current or 'starting'}, "
            f"{len(running.done)} of {running.total or '…'} done{paused}); a page that needs it shows how far it has "
            "got.")


def _warm(job: Warmup) -> None:
    here.background = here.steps_aside = True  # pausing for the sessions' own computations (preparing.Sessions)
    # the results' functions are called from this thread, which has no session: Streamlit says so at each call
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)
    lower_priority()
    job.state = "running"
    try:
        folder, _ = resolve_model_dir(bundled(job.ref.choice).name)
        store = Store(results_root(), folder_digest(folder))
        todo = steps(job.ref)
        job.total = len(todo)
        job.queue = Queue(todo, lambda result, args: _step(job, store, result, args))
        with job.queue.opened():  # a page asking for a step while the weights are read waits for it, or draws a
            # first form: it does not compute the step beside the preparation
            for choice in bundled(job.ref.choice).engines():  # both engines, which the pages read, whether or not
                # the steps are computed or read from disk; their weights read once, as a preparation from nothing
                # reads them, so that the pages' next passes do not wait on the weights' file
                step_aside()  # the page that opened the model is drawn first, and any page opened since
                cached_model(ModelRef(choice, device=job.ref.device)).page_in()
            job.queue.prepare()
        job.state = "done"
        store.drop_stale()
    except Exception as err:  # noqa: BLE001 - the pages compute what is missing themselves
        job.error, job.state = f"{type(err).__name__}: {err}", "failed"
        log.warning("HeadLens's warm-up of %s stopped: %s", job.ref.choice, job.error)


def _step(job: Warmup, store: Store, result, args) -> None:
    """One step: the value a session has already computed, else the one on disk, else computed and kept there."""
    outer, job.current = job.current, result.name
    start = time.perf_counter()
    value, how = result.peek(*args), "found"  # a session may have asked for it first
    if value is None:
        value, how = store.load(result.file_key(*args)), "stored"
        if value is not None:
            result.cache.put(result.key(*args), value)
    if value is None:
        result(*args)
        value, how = result.peek(*args), "computed"
    if how != "stored" and value is not None:
        store.save(result.file_key(*args), value)
    release_memory()  # what the step held for a while goes back to the system before the next
    job.done.append((result.name, how, time.perf_counter() - start))
    job.current = outer
