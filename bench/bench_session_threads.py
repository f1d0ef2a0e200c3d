"""Sessions computing side by side, each on every core or on its share of them (``SESSIONS.take_share``).

    python -m bench.bench_session_threads [--sessions 3] [--rounds 5]

``--sessions`` threads of this one process, as a server's reruns are, each computing what a page computes on
SmolLM2 (the from-scratch engine): the attention of a new 300-token text, every layer's weights, three times. Each
round runs them twice, alternately: every thread with torch's threads as a lone computation has them (the machine's
cores), then every thread with its share (``SESSIONS.share``: the cores split among the threads computing, one at
least), which a session's computation now sets. Prints, per way, the median over rounds of the time until every
thread is done and of one thread's computation, and the ratio of the two ways.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from app_pages.results.preparing import CORES, SESSIONS
from bench.common import machine
from models import load_model
from models.corpus import CORPUS

REPEATS = 3  # texts each thread computes in a round


def texts(round_: int, session: int) -> list[str]:
    """New texts of about 300 tokens (the built-in corpus from a different sentence each time): nothing cached."""
    start = (round_ * 31 + session * 7) % len(CORPUS)
    words = " ".join(CORPUS[start:] + CORPUS[:start]).split()
    return [f"{round_}.{session}.{k} " + " ".join(words[k * 5:k * 5 + 220]) for k in range(REPEATS)]


def one_round(model, sessions: int, round_: int, shared: bool) -> tuple[float, list[float]]:
    """Every thread's texts computed at once: the wall time until all are done and each thread's own time."""
    barrier, took = threading.Barrier(sessions + 1), [0.0] * sessions

    def session(i: int) -> None:
        todo = texts(round_ * 2 + shared, i)
        if shared:
            counted = SESSIONS.counted("computing")
            counted.__enter__()
        else:
            torch.set_num_threads(CORES)
        barrier.wait()
        start = time.perf_counter()
        for text in todo:
            model.attend(text)
        took[i] = time.perf_counter() - start
        if shared:
            counted.__exit__(None, None, None)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(machine(), f"{CORES} cores for one computation alone")
    model = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="scratch")
    model.attend(texts(99, 0)[0])
    start = time.perf_counter()
    model.attend(texts(98, 0)[0])
    print(f"one text alone: {time.perf_counter() - start:.2f} s")
    walls = {False: [], True: []}
    each = {False: [], True: []}
    for r in range(args.rounds):
        for shared in (False, True):
            wall, took = one_round(model, args.sessions, r, shared)
            walls[shared].append(wall)
            each[shared].append(statistics.median(took))
    for shared, name in ((False, "every core each"), (True, "their share each")):
        print(f"{args.sessions} sessions, {name:<17}: all done {statistics.median(walls[shared]):6.2f} s, "
              f"one session {statistics.median(each[shared]):6.2f} s (median of {args.rounds})")
    ratios = [a / b for a, b in zip(walls[True], walls[False])]
    print(f"all done, share / every core: {statistics.median(ratios):.2f} (per round: "
          + ", ".join(f"{x:.2f}" for x in ratios) + ")")


if __name__ == "__main__":
    main()
