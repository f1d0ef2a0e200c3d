"""What the server does for every session on its own.

``warm_up``: once a bundled decoder has loaded, a background thread computes what its slowest pages
need over the built-in corpus (the head-role profile behind Foci and Head roles, the head detector,
Pruning's importance and curves, the queries-and-keys pictures), each into the cache the page reads,
and keeps it on disk (``analysis.store``) so that a restarted server finds it at once. A page asking
for one of them meanwhile waits for it under the computation's own progress bar.

``janitor``: a thread that, every few seconds, drops the cached results only closed sessions asked
for (their long prompts, the attention of their sentences, their profiles) and hands the memory back
to the system.
"""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from analysis.effects import PAIRS
from analysis.store import Store, folder_digest
from models.catalog import bundled
from models.corpus import CORPUS
from models.files import resolve_model_dir
from models.gguf import cache_root

from .caches import attention_cache, long_cache
from .detector import detected, detector_cache
from .effects import effects, effects_cache, effects_key
from .long import grid_cache, rollout_cache, survey_cache
from .models import LLM, ModelRef, cached_model
from .profiles import profile, profile_cache, profile_key
from .pruning import ENGINE, LLM_SAMPLE, corpus_sample, curves, importance, proxy_table, pruning_cache, pruning_key
from .qk import pictures, pictures_key, qk_cache, tokens_within
from .settings import Settings
from .threads import here, lower_priority

log = logging.getLogger("headlens")
SWEEP_EVERY = 5.0  # seconds between two sweeps of what closed sessions held


@dataclass
class Warmup:
    """One model's warm-up: what it has done, from the disk or computed, and how long each took."""

    ref: ModelRef
    state: str = "waiting"  # waiting, running, done, failed
    done: list = field(default_factory=list)  # (task, how: "stored" (read from disk), "computed" or "found", seconds)
    current: str = ""  # the task under way
    total: int = 0
    error: str | None = None
    thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.state in ("waiting", "running")


@st.cache_resource
def warmups() -> dict:
    """Every warm-up this server has started, by model."""
    return {}


_started = threading.Lock()


def results_root() -> Path:
    """Where results are kept across restarts: ``HEADLENS_RESULTS``, else ``results`` in HeadLens's cache."""
    return Path(os.environ.get("HEADLENS_RESULTS") or cache_root() / "results").expanduser()


def enabled() -> bool:
    return os.environ.get("HEADLENS_WARM_UP", "1") != "0"


def warm_up(ref: ModelRef) -> Warmup | None:
    """Start ``ref``'s warm-up, once per server, when it is a bundled decoder."""
    if not enabled() or ref.choice not in LLM or ref.run:
        return None
    ref = ModelRef(ref.choice, device=ref.device)
    registry = warmups()
    with _started:
        if ref in registry:
            return registry[ref]
        job = registry[ref] = Warmup(ref)
    job.thread = threading.Thread(target=_warm, args=(job,), name=f"headlens-warm-{ref.choice}", daemon=True)
    job.thread.start()
    return job


def tasks(ref: ModelRef) -> list[tuple[str, object, object, object]]:
    """(name, cache, key, compute) of what ``ref``'s pages need first, cheapest first: each key the one its page
    asks for, and ``compute()`` the page's own function, which stores the result under it."""
    settings = Settings(model=ref, sentences=(), hide_special=False, merge_words=False, shared_scale=True,
                        moved=False, causal=False, heads_off=())
    twin = ModelRef(ENGINE[ref.choice], device=ref.device)
    corpus, sample = list(CORPUS), corpus_sample(LLM_SAMPLE)
    pair = next(iter(PAIRS.values()))  # the Effects page's first pair, patched exactly
    shown = tokens_within(cached_model(twin), corpus)
    out = [("profile", profile_cache(), profile_key(settings, corpus), lambda: profile(settings, corpus)),
           ("detector", detector_cache(), ("detector", ref), lambda: detected(ref)),
           ("importance", pruning_cache(), pruning_key("importance-gradient", twin, "zero", sample),
            lambda: importance(twin, "zero", sample, "gradient")),
           ("proxies", pruning_cache(), pruning_key("proxies", twin, "", sample), lambda: proxy_table(twin, sample)),
           ("sample profile", profile_cache(), profile_key(settings, sample), lambda: profile(settings, sample)),
           ("effects", effects_cache(), effects_key("effects", twin, pair, "exact"),
            lambda: effects(twin, pair, "exact"))]
    if twin != ref:  # Effects names the detector's label of a head on the engine it patches with
        out.append(("detector on our engine", detector_cache(), ("detector", twin), lambda: detected(twin)))
    out += [("queries and keys", qk_cache(), pictures_key(twin, shown, "fitted"),
             lambda: pictures(twin, shown, "fitted")),
            ("curves", pruning_cache(), pruning_key("curves", twin, "zero", sample),
             lambda: curves(twin, "zero", sample, importance(twin, "zero", sample, "gradient")))]
    return out


def warm_up_note(ref: ModelRef) -> str | None:
    """What the server is still preparing for ``ref``'s pages, in a sentence; None when nothing is."""
    job = warmups().get(ModelRef(ref.choice, device=ref.device))
    if job is None or not job.running:
        return None
    return (f"Preparing this model's pages over the built-in corpus in the background ({job.current or 'starting'}, "
            f"{len(job.done)} of {job.total or '…'} done); a page that needs it shows how far it has got.")


def _warm(job: Warmup) -> None:
    here.background = True
    # the caches' functions are called from this thread, which has no session: Streamlit says so at each call
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)
    lower_priority()
    job.state = "running"
    try:
        folder, _ = resolve_model_dir(bundled(job.ref.choice).name)
        store = Store(results_root(), folder_digest(folder))
        todo = tasks(job.ref)
        job.total = len(todo)
        for name, cache, key, compute in todo:
            job.current = name
            start = time.perf_counter()
            text = f"{name}|{key!r}"
            value, how = cache.get(key), "found"  # a session may have asked for it first
            if value is None:
                value, how = store.load(text), "stored"
                if value is not None:
                    cache.put(key, value)
            if value is None:
                compute()
                value, how = cache.get(key), "computed"
            if how != "stored" and value is not None:
                store.save(text, value)
            job.done.append((name, how, time.perf_counter() - start))
        job.state = "done"
        store.drop_stale()
        trim()  # what the computations held for a while goes back to the system
    except Exception as err:  # noqa: BLE001 - the pages compute what is missing themselves
        job.error, job.state = f"{type(err).__name__}: {err}", "failed"
        log.warning("HeadLens's warm-up of %s stopped: %s", job.ref.choice, job.error)


@st.cache_resource
def janitor() -> "Janitor":
    """The server's one janitor, started by the first session."""
    return Janitor([attention_cache(), long_cache(), profile_cache(), grid_cache(), survey_cache(),
                    rollout_cache()]).start()


class Janitor:
    """Every ``SWEEP_EVERY`` seconds: drop what only closed sessions asked for, then give freed memory back."""

    def __init__(self, caches: list):
        self.caches, self.released, self.sweeps = caches, 0, 0
        self.thread = threading.Thread(target=self._run, name="headlens-janitor", daemon=True)

    def start(self) -> "Janitor":
        self.thread.start()
        return self

    def sweep(self) -> int:
        from streamlit.runtime import Runtime

        if not Runtime.exists():
            return 0
        runtime = Runtime.instance()
        gone = sum(cache.release(runtime.is_active_session) for cache in self.caches)
        if gone:
            gc.collect()
        trim()  # also what closed sessions' runs and trainings freed
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


def trim() -> None:
    """Give the memory the allocator holds free back to the system (glibc); elsewhere, nothing."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

