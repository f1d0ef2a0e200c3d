"""How long a session's torch work waits for the interpreter lock while other threads run Python, by switch interval.

    python -m bench.bench_switch_interval [--threads 2]

SmolLM2's embedding of three sentences (the from-scratch engine: a forward pass of many small operations, each giving the
lock up and taking it back) timed alone, then beside ``--threads`` threads running a pure-Python loop (as a
server's other sessions do while they build figures and send pages), at each switch interval in turn, in
this one process: the median of 15 runs each. The server sets ``app_pages.results.threads.SWITCH_INTERVAL_S``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from bench.common import machine
from models import load_model

SENTENCES = ["Which do you like better, coffee or tea?", "The cat sat on the mat.", "It rained all day in the town."]


def median_seconds(model, n: int = 15) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        model.embed(SENTENCES)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(machine())
    model = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="scratch")
    model.embed(SENTENCES)
    alone = median_seconds(model)
    print(f"alone: {alone:.3f} s")
    stop = threading.Event()

    def python_loop():
        total = 0
        while not stop.is_set():
            for i in range(10_000):
                total += i

    workers = [threading.Thread(target=python_loop, daemon=True) for _ in range(args.threads)]
    for worker in workers:
        worker.start()
    default = sys.getswitchinterval()
    try:
        for interval in (0.005, 0.001, 0.0005, 0.005):
            sys.setswitchinterval(interval)
            beside = median_seconds(model)
            print(f"switch interval {interval * 1000:.1f} ms, beside {args.threads} Python threads: {beside:.3f} s "
                  f"({beside / alone:.1f}x alone)", flush=True)
    finally:
        stop.set()
        sys.setswitchinterval(default)


if __name__ == "__main__":
    main()
