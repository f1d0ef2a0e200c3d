"""A training in a process of its own, seen from the caller as ``train`` is.

A server that trains in one of its threads makes the training and its sessions take turns on one
interpreter lock: each of the training's many small operations waits for the lock again, and a class
that keeps the lock busy leaves a training almost nothing. In its own process the training has its
own lock, its own thread count and its own priority; the caller's thread receives what it logs and
keeps a ``TrainRun`` up to date, so a page reads it as it reads a run trained beside it.

The process is a new interpreter (never a fork of one that runs threads and torch); messages are
pickles on its standard input and output (tensors travel as bytes, nothing is shared), and the end of
its input tells it to stop.
"""
from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from .errors import HeadLensError
from .training import TrainConfig, TrainRun, train

HEADER = struct.Struct("<Q")  # each message: its length, then the pickle


def _send(out, *message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(HEADER.pack(len(data)) + data)
    out.flush()


def _receive(stream) -> tuple | None:
    """The next message, or None when the other side has closed its end."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    data = stream.read(HEADER.unpack(head)[0])
    return pickle.loads(data)


def _child() -> None:
    """The training process: reads its arguments, trains, and writes the run once whole, then what each logged
    step adds, then the end. Anything else written to standard output goes to standard error."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    config, device, text, max_seconds, threads, nice = _receive(sys.stdin.buffer)
    if nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except (AttributeError, OSError):
            pass
    torch.set_num_threads(threads)
    stop = threading.Event()

    def watch_input() -> None:  # the caller says stop, or goes away, by closing its end of the input
        while os.read(0, 4096):
            pass
        stop.set()

    threading.Thread(target=watch_input, daemon=True).start()
    sent = {"rows": 0, "snapshots": set()}

    def on_step(step: int, run: TrainRun) -> None:
        new = [(s, w) for s, w in run.snapshots if s not in sent["snapshots"]]
        sent["snapshots"].update(s for s, _ in new)
        if step == 0:
            _send(out, "start", run)
        else:
            _send(out, "step", run.rows[sent["rows"]:], [s for s, _ in run.snapshots], new, run.snapshot_every,
                  run.steps_done, run.seconds)
        sent["rows"] = len(run.rows)

    try:
        run = train(config, device=device, text=text, on_step=on_step, should_stop=stop.is_set,
                    max_seconds=max_seconds)
        _send(out, "done", run)
    except HeadLensError as err:
        _send(out, "failed", str(err))
    except Exception as err:  # the caller says what went wrong; its session goes on
        _send(out, "failed", f"The training failed: {type(err).__name__}: {err}")


def train_apart(config: TrainConfig, *, device: str = "auto", text: str | None = None,
                on_step: Callable[[int, TrainRun], None] | None = None,
                should_stop: Callable[[], bool] | None = None, max_seconds: float | None = None,
                threads: int = 1, nice: int = 0, poll: float = 0.2) -> TrainRun:
    """``train`` in a new process, with the same arguments and result.

    ``on_step`` is called in this thread with a run that holds the history and snapshots so far (its
    ``model`` is the model at step 0 until the end); ``should_stop`` is asked every ``poll`` seconds and
    stops the training at its next step. ``threads``: the training's torch threads (one leaves a core to
    everything else on a small machine); ``nice``: how much lower than this thread's its priority is.
    Errors in the training come back as ``HeadLensError``.
    """
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    process = subprocess.Popen([sys.executable, "-c", "from models.training_apart import _child; _child()"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=root)
    messages: queue.Queue = queue.Queue()

    def read() -> None:  # every message, then None once the process has closed its output
        while (message := _receive(process.stdout)) is not None:
            messages.put(message)
        messages.put(None)

    try:
        _send(process.stdin, config.check(), device, text, max_seconds, threads, nice)
        threading.Thread(target=read, daemon=True).start()
        run = None
        while True:
            if should_stop is not None and should_stop() and not process.stdin.closed:
                process.stdin.close()  # the training stops at its next step and sends what it has
            try:
                message = messages.get(timeout=poll)
            except queue.Empty:
                continue
            if message is None:
                raise HeadLensError(f"The training's process ended without a result (exit code {process.wait()}).")
            kind, *rest = message
            if kind == "failed":
                raise HeadLensError(rest[0])
            if kind == "done":
                return rest[0]
            if kind == "start":
                run = rest[0]
            else:
                rows, kept, new, run.snapshot_every, run.steps_done, run.seconds = rest
                run.rows.extend(rows)
                arrays = {**dict(run.snapshots), **dict(new)}
                run.snapshots = [(s, arrays[s]) for s in kept]  # replaced whole, as the training does
            if on_step is not None:
                on_step(run.steps_done, run)
    finally:
        if not process.stdin.closed:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


__all__ = ["train_apart"]
