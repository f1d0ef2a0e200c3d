"""How much a training in the background slows a session's forward pass, and what keeps it from doing so.

    python -m bench.bench_training_share [--seconds 20]

A session's work is SmolLM2's attention over the first 8 sentences of the built-in corpus, timed over
and over in the main thread for ``--seconds`` while a training of the Train page's "text" task (the
default decoder, MLPs on) runs in another thread, as the app runs it. Each way of running the training
is measured in turn in this one process, with a round of no training before and after each: the
figure is the session's median time with the training over its median time alone (1.0: not slowed),
and the training's steps per second (what it gives up). Ways: as it was (same priority, every core),
a lower priority (``os.setpriority``, nice 10, of the training's thread: Linux gives each thread its
own), one thread for its tensor work, a pause after every step, and in a process of its own
(``train_apart``, as the Train page trains now: its own interpreter lock, threads and priority).
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import torch

from bench.common import machine
from models import load_model
from models.corpus import CORPUS
from models.training import TrainConfig, train
from models.training_apart import train_apart

WAYS = {
    "same priority": {},
    "nice 10": {"nice": 10},
    "one thread": {"threads": 1},
    "pause 20 ms a step": {"pause": 0.02},
    "nice 5, one thread": {"nice": 5, "threads": 1},
    "nice 10, one thread": {"nice": 10, "threads": 1},
    "apart, one thread": {"apart": True, "threads": 1},
    "apart, nice 2, one thread": {"apart": True, "nice": 2, "threads": 1},
    "apart, nice 5, one thread": {"apart": True, "nice": 5, "threads": 1},
}


def session_times(model, seconds: float) -> list[float]:
    sentences = list(CORPUS[:8])
    times, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        model.attend(sentences)
        times.append(time.perf_counter() - t)
    return times


def training(stop: threading.Event, out: dict, nice: int = 0, threads: int | None = None, pause: float = 0.0,
             apart: bool = False):
    config = TrainConfig(task="text", steps=20_000, seed=1)
    if apart:  # in a process of its own, as the Train page trains: its thread count and priority are its own
        run = train_apart(config, device="cpu", should_stop=stop.is_set, threads=threads or 1, nice=nice)
        out["steps_per_s"] = run.steps_per_second()
        return
    if nice:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    if threads is not None:
        torch.set_num_threads(threads)
    def should_stop():  # asked after every step
        if pause:
            time.sleep(pause)
        return stop.is_set()

    run = train(config, device="cpu", should_stop=should_stop)
    out["steps_per_s"] = run.steps_per_second()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--ways", default=";".join(WAYS), help="which, separated by semicolons: " + "; ".join(WAYS))
    args = parser.parse_args()
    print(machine())
    model = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="scratch")
    threads = torch.get_num_threads()
    session_times(model, 3)  # warm-up
    print(f"{'training':<22} {'session slowed':>15} {'training steps/s':>17} {'session threads':>16}")
    for name in args.ways.split(";"):
        way = WAYS[name]
        alone = session_times(model, args.seconds / 2)
        stop, out = threading.Event(), {}
        worker = threading.Thread(target=training, args=(stop, out), kwargs=way, daemon=True)
        worker.start()
        time.sleep(5 if way.get("apart") else 2)  # the training under way (a new process starts in about 3 s)
        seen = torch.get_num_threads()  # the session's own threads, while the training runs
        shared = session_times(model, args.seconds)
        stop.set()
        worker.join()
        alone += session_times(model, args.seconds / 2)
        ratio = statistics.median(shared) / statistics.median(alone)
        print(f"{name:<22} {ratio:>14.2f}x {out.get('steps_per_s', float('nan')):>17.1f} {seen:>16}", flush=True)
        torch.set_num_threads(threads)
    print(f"(the session's forward alone: median {statistics.median(alone) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
