"""What the command lines run on Ray Data: a local instance or a cluster joined, the model checked on the driver,
no retries, workers' errors as sentences, and a corpus profiled by actors (``profile_ray``)."""
from __future__ import annotations

import os
import pickle
import socket
import warnings
from contextlib import contextmanager
from collections.abc import Callable
from pathlib import Path

from models.corpus import clean_lines
from models.errors import HeadLensError

from .corpus import CHUNK, measure_chunk


ACTOR_CPUS = 0.5  # what one CPU actor asks of Ray; the rest of a core is left to the read tasks


class ProfileBatches:
    """The Ray Data callable: loads the model once per actor; each batch of lines gives one row holding
    its partial sums (a pickled ``HeadProfiler``), to be merged by the driver."""

    def __init__(self, model: str | None, backend: str, device: str, batch_size: int):
        from models import load_model

        from ..roles.measure import load_spacy

        self.model = load_model(model, backend=backend, device=device)
        self.nlp, self.batch_size = load_spacy(), batch_size

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        from ..roles.measure import HeadProfiler

        texts = clean_lines(batch["text"])
        profiler = HeadProfiler(self.nlp, keep_sentences=False)
        skipped = measure_chunk(self.model, profiler, texts, self.batch_size) if texts else 0
        return {"partial": np.array([pickle.dumps(profiler)], dtype=object),
                "lines": np.array([len(texts)]), "skipped": np.array([skipped]),
                "model": np.array([self.model.name], dtype=object), "backend": np.array([self.model.backend], dtype=object)}


def profile_ray(model: str | None, backend: str, device: str, files: list[Path], *, batch_size: int = 32,
                address: str | None = None, actors: int = 1, chunk: int = CHUNK,
                progress: Callable[[int], None] | None = None):
    """``(profiler, skipped, model_name, backend)`` computed by Ray Data actors and merged here.

    Check ``model`` first (``check_model``): a model that cannot load otherwise surfaces as an
    actor's death in Ray's log.
    """
    ray, on_gpu, resources = start_ray(address, device)
    from ..roles.measure import HeadProfiler

    lines = ray.data.read_text([str(f.resolve()) for f in files], encoding="utf-8-sig")
    with warnings.catch_warnings():  # Ray 2.60 warns that remote-args functions go in 2.64; this version is pinned
        warnings.simplefilter("ignore", DeprecationWarning)
        partials = lines.map_batches(
            ProfileBatches, batch_size=chunk, compute=ray.data.ActorPoolStrategy(size=actors),
            fn_constructor_kwargs={"model": model, "backend": backend, "device": "cuda" if on_gpu else "cpu",
                                   "batch_size": batch_size},
            ray_remote_args_fn=no_restarts, **resources)
    profiler, skipped, name, used = HeadProfiler(keep_sentences=False), 0, None, backend
    with worker_errors():  # a worker's error arrives wrapped; a HeadLens one is a sentence for the user
        for row in partials.iter_rows():
            profiler.merge(pickle.loads(row["partial"]))
            skipped += int(row["skipped"])
            name, used = row["model"], row["backend"]
            if progress is not None:
                progress(int(row["lines"]))
    return profiler, skipped, name, used


def start_ray(address: str | None, device: str):
    """``(ray, on_gpu, resources)``: Ray joined at ``address`` (or ``RAY_ADDRESS``, or a local instance started),
    whether the actors run on a GPU, and what each asks for; a sentence for an address nothing answers at."""
    os.environ.setdefault("RAY_DATA_LOG_LEVEL", "ERROR")  # the bar says how far it is; Ray's lines repeat it
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        try:
            reachable(address)
            ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level="ERROR")
        except ConnectionError as err:
            raise HeadLensError(f"No Ray cluster answered at {address}: check the address, and for a cluster with "
                                "token authentication set RAY_AUTH_MODE=token and its token (`ray get-auth-token`) "
                                "here.") from err
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    gpus = ray.cluster_resources().get("GPU", 0)
    if device == "cuda" and not gpus:
        raise HeadLensError("CUDA was asked for, but the Ray cluster has no GPU; choose 'auto' or 'cpu'.")
    on_gpu = device == "cuda" or (device == "auto" and gpus > 0)
    return ray, on_gpu, {"num_gpus": 1} if on_gpu else {"num_cpus": ACTOR_CPUS}


def reachable(address: str | None, timeout: float = 5.0) -> None:
    """ConnectionError at once when a ``host:port`` address has nothing listening: Ray itself
    retries for minutes. ``None``, "auto" and ``ray://`` addresses are left to Ray."""
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except (OSError, ValueError) as err:
        raise ConnectionError(str(err)) from err


def check_model(name: str | None) -> None:
    """HeadLensError, with a sentence, when ``name`` is not a model that can be opened here."""
    from models.files import check_model_dir, resolve_model_dir

    check_model_dir(resolve_model_dir(name)[0])


def no_restarts() -> dict:
    """Actors that fail report their error at once instead of restarting."""
    return {"max_restarts": 0}


@contextmanager
def worker_errors():
    """A Ray worker's error as its root cause when that is a ``HeadLensError`` (a sentence for the user); any other
    as it came."""
    try:
        yield
    except Exception as err:
        cause = root_cause(err)
        if isinstance(cause, HeadLensError):
            raise cause from None
        raise


def root_cause(err: BaseException) -> BaseException:
    seen = set()
    while id(err) not in seen:
        seen.add(id(err))
        nxt = getattr(err, "cause", None) or err.__cause__
        if nxt is None:
            break
        err = nxt
    return err
