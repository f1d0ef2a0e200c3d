"""A server's preparation of a bundled decoder, step by step: what each declared result costs from nothing.

    python -m bench.bench_warm_up [--model smollm2] [--model gemma3]

Runs, in this process and in the warm-up's order, every step ``app_pages.ui.warm_up.steps`` gives for each
model (on the engine a teacher picks first: transformers), with nothing cached, as the server's background
thread runs them; prints each step's seconds, the process's memory after it and its highest during it, the
total, and the peak. Memory is the proportional set size (each page counted once): both engines map the one
weights file, and resident memory counts each of its pages once per mapping. Aims: <= 120 s a model from
nothing on two cores (<= 180 s for both), peak <= 2.5 GiB.
"""
from __future__ import annotations

import argparse
import logging
import time

from bench.common import PeakMemory, machine, memory_mib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a bundled decoder's key (default: smollm2, then gemma3)")
    a = ap.parse_args()
    logging.getLogger("streamlit").setLevel(logging.ERROR)
    from app_pages.results.threads import here

    here.background = True  # no session: progress is published, not drawn
    print(f"# the preparation, step by step, on {machine('cpu')}")
    start = time.perf_counter()
    with PeakMemory() as peak:
        for key in a.model or ["smollm2", "gemma3"]:
            prepare(key, peak)
    print(f"all: {time.perf_counter() - start:.1f} s; peak memory {peak.highest:.0f} MiB (aim <= 2,560 MiB, the models "
          f"included; resident at most {memory_mib('VmHWM:'):.0f} MiB, counting the weights file once per engine)")


def prepare(key: str, peak: PeakMemory) -> None:
    """``key``'s two engines opened (the steps use both), then each step run and reported."""
    from app_pages.ui import warm_up
    from app_pages.results.models import ModelRef, cached_model
    from models.memory import release_memory

    ref = ModelRef(key)
    start = time.perf_counter()
    cached_model(ref)
    cached_model(ref.scratch())
    print(f"{key}: both engines opened in {time.perf_counter() - start:.1f} s, {memory_mib():.0f} MiB "
          f"(at most {peak.reset():.0f} MiB)")
    total = 0.0
    for result, args in warm_up.steps(ref):
        t = time.perf_counter()
        result(*args)
        release_memory()  # as the server does after each step
        seconds = time.perf_counter() - t
        total += seconds
        print(f"  {result.name:<18} {seconds:7.1f} s   {memory_mib():6.0f} MiB, at most {peak.reset():6.0f} MiB")
    print(f"{key}: the steps took {total:.1f} s   aim <= 120 s   {'met' if total <= 120 else 'NOT met'}")


if __name__ == "__main__":
    main()
