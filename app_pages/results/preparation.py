"""A server's preparation of bundled decoders, run from the command line as the server's thread runs it: both
engines opened, then every step (``app_pages.results.steps``) with nothing cached, each step's seconds and the
process's CPU seconds in it printed as it ends, a tab-separated line each (``opened`` for the engines):

    python -m app_pages.results.preparation smollm2 gemma3
"""
from __future__ import annotations

import argparse
import logging
import time

from models.memory import release_memory

from . import steps
from .models import ModelRef, cached_model
from .threads import here


def prepare(key: str) -> None:
    ref = ModelRef(key)
    start = time.perf_counter()
    cached_model(ref)
    cached_model(ref.analysed)
    print(f"{key}\topened\t{time.perf_counter() - start:.2f}\t{time.process_time():.2f}", flush=True)
    for result, args in steps(ref):
        t, cpu = time.perf_counter(), time.process_time()
        result(*args)
        release_memory()  # as the server does after each step
        print(f"{key}\t{result.name}\t{time.perf_counter() - t:.2f}\t{time.process_time() - cpu:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["smollm2", "gemma3"], help="bundled decoders' keys")
    logging.getLogger("streamlit").setLevel(logging.ERROR)
    here.background = True  # no session: progress is published, not drawn
    for key in ap.parse_args().models:
        prepare(key)


if __name__ == "__main__":
    main()
