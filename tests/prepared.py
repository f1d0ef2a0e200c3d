"""SmolLM2's preparation from nothing, once per test run, in the test process: the server's own warm-up thread
filling the shared caches and one results folder on disk. The first test given it finds it under way (a cold
server); ``finished()`` waits for it and keeps a fingerprint of what it computed. Its results stay in the caches,
where the tests after it find them as a server's sessions do (the cold server's test runs first: ``conftest``);
a restart's test empties them and reads the folder back. Nothing is prepared from nothing twice in a run."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from app_pages.results.models import ModelRef
from app_pages.ui import warm_up

REF = ModelRef("smollm2_scratch")


def cleared() -> None:
    """The server as a restart leaves it: no warm-up, and nothing in the caches the warm-up fills."""
    warm_up.warmups().clear()
    for result, _ in warm_up.steps(REF):
        result.cache.clear()


def fingerprint(value):
    """What a restart's value is compared by: frames as they are, a picture's PNG and a hash of its frames."""
    if isinstance(value, pd.DataFrame):
        return value
    if hasattr(value, "png"):
        return value.png, {pair: int(pd.util.hash_pandas_object(f).sum()) for pair, f in value.frames.items()}
    if hasattr(value, "frame") and isinstance(value.frame, pd.DataFrame):  # importance
        return value.frame
    if isinstance(value, tuple) and value and isinstance(value[0], pd.DataFrame):  # a profile
        return value[0], [a.text for a in value[2]]
    return None


@dataclass
class Preparation:
    folder: Path
    job: warm_up.Warmup | None = None
    done: list = field(default_factory=list)  # the job's (step, how, seconds)
    prints: dict = field(default_factory=dict)  # key -> fingerprint of the value computed

    def start(self) -> "Preparation":
        with pytest.MonkeyPatch.context() as env:
            env.setenv("HEADLENS_WARM_UP", "1")
            env.setenv("HEADLENS_RESULTS", str(self.folder))
            cleared()
            self.job = warm_up.warm_up(REF)
            while self.job.queue is None and self.job.running:  # its store is open: the folder is read
                time.sleep(0.05)
        return self

    def finished(self, at_most_s: float = 1200) -> "Preparation":
        if not self.done:
            self.job.thread.join(timeout=at_most_s)
            assert self.job.state == "done", (self.job.state, self.job.error)
            self.done = list(self.job.done)
            self.prints = {result.key(*args): fingerprint(result.peek(*args)) for result, args in warm_up.steps(REF)}
            warm_up.warmups().clear()  # its values stay in the caches
        return self
