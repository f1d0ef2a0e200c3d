"""Trainings, one per session, at most ``MAX_RUNNING`` at once on the server; and what the Train page
shows of a run (its words, its summary, its snapshots).

Each training runs in a process of its own (``train_apart``: its own interpreter lock, so a class's
reruns and the training do not wait on each other), watched by a background thread that writes to
its ``Job``; the page reads the job on each run of its fragment. Nothing here is called from the
thread but the training and the checks it makes.
"""
from __future__ import annotations

import threading
import time
import uuid

import streamlit as st

from models import HeadLensError, head_label
from models.training import TrainConfig, TrainRun
from models.training_apart import train_apart
from viz import head_grid

from .exports import chart

MAX_RUNNING = 2        # trainings at once on this server; more wait for a slot
MAX_SECONDS = 600      # each training's time budget
TRAINING_THREADS = 1   # each training's torch threads: a small model gains little from more
TRAINING_NICE = 2      # a training runs in its own process, a little below the sessions: beside a class that keeps
                       # both cores busy it keeps a third of its speed alone (bench_load --llm), they the rest
GONE_AFTER = 15.0      # seconds a session may be disconnected before its training stops

TASK_NAMES = {"induction": "Induction: random tokens with a repeated segment",
              "text": "Text: the next word of the built-in corpus, or of your text"}
DEFAULTS = {"induction": dict(vocab=64, attention_only=True), "text": dict(vocab=1024, attention_only=False)}
ABOUT = {"curves": "Previous-token score: a head's mean weight on the token just before each query. Induction score: "
                   "on the held-out repeats, the mean weight from each token of the second half on the token after "
                   "its earlier occurrence. Layer 0's heads are dashed.",
         "probe": "The first held-out sequence: a half, then the same half again. An induction head draws a diagonal "
                  "one below the main one's reflection in the second half; a previous-token head, the line just under "
                  "the main diagonal."}


@st.cache_resource
def slots() -> threading.BoundedSemaphore:
    """The server's training slots, shared by every session."""
    return threading.BoundedSemaphore(MAX_RUNNING)


def _session_check():
    """A function saying whether this session is still connected (checked from the training thread)."""
    from streamlit.runtime import Runtime
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or not Runtime.exists():
        return lambda: True
    runtime, session_id = Runtime.instance(), ctx.session_id
    return lambda: runtime.is_active_session(session_id)


class Job:
    """One training: its settings, its state and, once it has logged a step, its run."""

    def __init__(self, config: TrainConfig, *, text: str | None, device: str, max_seconds: float = MAX_SECONDS,
                 connected=None):
        self.id = uuid.uuid4().hex[:12]
        self.config, self.text, self.device, self.max_seconds = config, text, device, max_seconds
        self.state = "waiting"              # waiting, training, done, stopped, failed
        self.error: str | None = None
        self.run: TrainRun | None = None
        self.stop_requested = threading.Event()
        self._connected = connected or (lambda: True)
        self._gone_since: float | None = None
        self._start_model = None
        self.thread = threading.Thread(target=self._work, name=f"headlens-train-{self.id}", daemon=True)

    @property
    def running(self) -> bool:
        return self.state in ("waiting", "training")

    @property
    def stopping(self) -> bool:
        """Asked to stop and not stopped yet: the thread ends at the end of its current step."""
        return self.running and self.stop_requested.is_set()

    @property
    def finished(self) -> bool:
        return self.state in ("done", "stopped") and self.run is not None

    def start(self) -> "Job":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_requested.set()

    def should_stop(self) -> bool:
        if self.stop_requested.is_set():
            return True
        if self._connected():
            self._gone_since = None
            return False
        now = time.monotonic()
        self._gone_since = self._gone_since or now
        return now - self._gone_since > GONE_AFTER

    def _work(self) -> None:
        slot = slots()
        while not slot.acquire(timeout=0.2):
            if self.should_stop():
                self.state = "stopped"
                return
        try:
            self.state = "training"
            run = train_apart(self.config, device=self.device, text=self.text, should_stop=self.should_stop,
                              on_step=self._logged, max_seconds=self.max_seconds, threads=TRAINING_THREADS,
                              nice=TRAINING_NICE)
            self.run = run
            self.state = "stopped" if run.stopped else "done"
        except HeadLensError as err:
            self.error, self.state = str(err), "failed"
        except Exception as err:  # the session keeps working; the page says what went wrong
            self.error, self.state = f"The training failed: {type(err).__name__}: {err}", "failed"
        finally:
            slot.release()

    def _logged(self, step: int, run: TrainRun) -> None:
        self.run = run

    def model(self, at_start: bool = False):
        """The trained model, or the same model at step 0 (built once, on first use)."""
        if not self.finished:
            raise HeadLensError("This model is still training; it joins the other pages when it stops.")
        if not at_start:
            return self.run.model
        if self._start_model is None:
            self._start_model = self.run.initial_model()
        return self._start_model


def start_job(config: TrainConfig, *, text: str | None, device: str) -> Job:
    """Stop this session's training, if any, and start ``config`` in a new thread."""
    old = st.session_state.get("train_job")
    if old is not None:
        old.stop()
    job = Job(config, text=text, device=device, connected=_session_check()).start()
    st.session_state["train_job"] = job
    return job


def summary(job: Job) -> str:
    """A finished training in a sentence: its steps and speed, its loss, and its strongest induction head."""
    run = job.run
    reached = run.step_reaching(0.4)
    last = run.history[run.history.step == run.history.step.max()]
    best = last.loc[last.induction.idxmax()]
    said = (f"{'Stopped after' if run.stopped else 'Trained'} {run.steps_done:,} steps in {run.seconds:.0f} s "
            f"({run.steps_per_second():.0f} steps/s on {run.device}); last loss {last.loss.iloc[0]:.3f}. ")
    said += (f"An induction score of 0.4 was first reached at step {reached:,}; " if reached is not None
             else "No head reached an induction score of 0.4; ")
    strongest = head_label(best["layer"], best["head"])
    return said + f"the strongest induction head now is {strongest} ({best['induction']:.2f})."


def snapshot_grids(run: TrainRun) -> None:
    """Every head's weights on the probe at a kept snapshot, with a slider that follows the training."""
    ss, kept = st.session_state, run.snapshots  # the list is replaced whole by the training thread, never in place
    steps = [s for s, _ in kept]
    if len(steps) > 1:
        if ss.get("train_snapshot") not in steps or ss.get("train_snapshot") == ss.get("_train_latest"):
            ss["train_snapshot"] = steps[-1]  # follow the training until the slider is moved back
        ss["_train_latest"] = steps[-1]
        step = st.select_slider("Snapshot at step", steps, key="train_snapshot",
                                help="Replay the kept snapshots; at the right end it follows the training.")
    else:
        step = steps[0]
    weights = dict(kept)[step]
    heads = list(range(weights.shape[1]))
    for layer in range(weights.shape[0]):
        chart(head_grid(weights[layer], run.probe, run.probe, heads, cols=min(4, len(heads)), cell_px=240,
                        title=f"Layer {layer} on the probe sequence · step {step:,}"), f"train-grid-{layer}")
