"""The Train page in AppTest: start, live updates, stop, the trained model on the other pages, two sessions."""
import io
import time
import zipfile

import numpy as np

from models import load_model
from analysis.effects import patch_heads, repeated_pair
from tests.conftest import decode, downloads, figures, heatmaps, shown, title_text

PAGE = "app_pages/train.py"


def wait(at, until, timeout: float = 120.0):
    """Rerun the page (as its fragment does every second) until ``until(job)`` holds, then once more: the page
    last drawn is drawn after the job got there (a job that ends while the page draws shows the next draw)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        time.sleep(0.3)
        held = until(at.session_state["train_job"])
        at.run()
        assert not at.exception, at.exception
        job = at.session_state["train_job"]
        if held:
            return job
    raise AssertionError(f"the training did not get there in {timeout} s: {job.state}, {job.run and job.run.steps_done}")


def start(at, steps: int, seed: int = 0):
    at.number_input(key="train_steps").set_value(steps)
    at.number_input(key="train_seed").set_value(seed)
    at.button(key="train_start").click().run()
    assert not at.exception, at.exception
    return at.session_state["train_job"]


def curves(at) -> dict:
    return next(f for f in figures(at) if "training loss" in f["layout"]["annotations"][0]["text"])


def stop_all(*apps):
    for at in apps:
        job = at.session_state["train_job"] if "train_job" in at.session_state else None
        if job is not None:
            job.stop()
            job.thread.join(timeout=30)


def test_the_page_updates_live_while_it_trains_and_stops_on_stop(new_app):
    at = new_app(page=PAGE)
    assert any("press Start" in i.value for i in at.info)
    job = start(at, 20_000)
    try:
        job = wait(at, lambda j: j.run is not None and j.run.steps_done >= 40)
        first = curves(at)
        seen = decode(next(t for t in first["data"] if t["name"] == "loss")["x"])
        progress = at.get("progress")[0].proto.text
        assert progress.startswith("Step ") and "of 20,000" in progress
        job = wait(at, lambda j: j.run.steps_done >= seen[-1] + 60)
        later = curves(at)
        x = decode(next(t for t in later["data"] if t["name"] == "loss")["x"])
        assert len(x) > len(seen)                         # a live update: more points than before
        # every head's lines are its history's scores
        history = job.run.history
        trace = next(t for t in later["data"] if t["name"] == "L1 H0" and t["yaxis"] == "y3")
        steps = decode(trace["x"])
        rows = history[(history.layer == 1) & (history["head"] == 0)].set_index("step").loc[steps]
        np.testing.assert_allclose(decode(trace["y"]), rows.induction.to_numpy(), atol=1e-9)
        grids = [f for f in figures(at) if f["layout"]["title"]["text"].startswith("Layer ")]
        assert len(grids) == 2 and len(heatmaps(grids[0])) == 2
        assert at.button(key="train_start").disabled and not at.button(key="train_stop").disabled
        at.button(key="train_stop").click().run()
        assert not at.exception, at.exception
        job = wait(at, lambda j: not j.running)  # Stop returns at once; the thread ends after its step
        assert job.state == "stopped" and job.run.stopped and job.run.steps_done < 20_000
        assert shown(at.success[0].value).startswith(f"Stopped after {job.run.steps_done:,} steps")
        assert not at.button(key="train_start").disabled
    finally:
        stop_all(at)


def test_a_finished_training_joins_explore_compare_and_downloads(new_app):
    at = new_app(page=PAGE)
    job = start(at, 300)
    job = wait(at, lambda j: not j.running)
    at.run()
    assert job.state == "done" and "An induction score of 0.4 was first reached" in shown(at.success[0].value)
    options = at.sidebar.selectbox(key="model").options
    assert "Your trained decoder · this session" in options and "Your trained decoder at step 0 · this session" in options
    # the snapshot slider replays the kept snapshots: step 0 is the untrained model on the probe
    at.select_slider(key="train_snapshot").set_value(0).run()
    grid = next(f for f in figures(at) if f["layout"]["title"]["text"].startswith("Layer 1"))
    assert "step 0" in grid["layout"]["title"]["text"]
    start_weights = job.run.initial_model().attend(" ".join(job.run.probe)).weights
    np.testing.assert_allclose(decode(heatmaps(grid)[0]["z"]), start_weights[1, 0], atol=1e-6)
    # the model downloads as a folder that load_model opens with the from-scratch engine
    files = downloads(at)
    with zipfile.ZipFile(io.BytesIO(files["Model · ZIP"])) as z, __import__("tempfile").TemporaryDirectory() as tmp:
        z.extractall(tmp)
        folder = f"{tmp}/headlens-trained-{job.id}"
        again = load_model(folder, backend="scratch")
    text = job.run.held_out[5]
    np.testing.assert_allclose(again.attend(text).weights, job.run.model.attend(text).weights, atol=1e-6)
    assert files["History · CSV"].decode().splitlines()[0] == "step,layer,head,loss,prev_token,induction"
    # Explore opens it on the probe sequence
    at.button(key="train_explore").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Explore"
    grid = figures(at)[0]
    want = job.run.model.attend(" ".join(job.run.probe)).weights
    upper = np.triu(np.ones(want.shape[-2:], bool), 1)
    want = np.where(upper, np.nan, want)  # a decoder's query never sees later keys: those cells are drawn empty
    np.testing.assert_allclose(decode(heatmaps(grid)[0]["z"]), want[0, 0], atol=1e-6)
    # Compare puts step 0 beside the last step, same head
    at.switch_page("app_pages/compare.py").run()
    assert not at.exception, at.exception
    one, two = figures(at)[:2]
    assert "step 0" in one["layout"]["title"]["text"] and "L0 H0" in two["layout"]["title"]["text"]
    np.testing.assert_allclose(decode(heatmaps(one)[0]["z"]), np.where(upper, np.nan, start_weights[0, 0]), atol=1e-6)
    np.testing.assert_allclose(decode(heatmaps(two)[0]["z"]), want[0, 0], atol=1e-6)
    for page in ("app_pages/overview.py", "app_pages/roles.py", "app_pages/pruning.py", "app_pages/effects.py"):
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception)
        assert not at.error, (page, [e.value for e in at.error])
    # Effects patches it on its own held-out sequence, made an induction pair in its own tokens
    pair = repeated_pair(job.run.model, job.run.held_out[0].split(" "))
    want = patch_heads(job.run.model, pair.clean, pair.corrupted, pair.answer, pair.distractor)
    patched = next(f for f in figures(at) if "recovered" in title_text(f))
    np.testing.assert_allclose(decode(heatmaps(patched)[0]["z"]), want["recovered"].to_numpy().reshape(2, 2), atol=1e-5)


def test_two_sessions_train_at_once_with_their_own_runs_and_a_third_waits(new_app):
    apps = [new_app(page=PAGE) for _ in range(3)]
    try:
        jobs = [start(apps[0], 20_000, seed=0), start(apps[1], 20_000, seed=1)]
        jobs = [wait(at, lambda j: j.state == "training" and j.run is not None and j.run.steps_done >= 20)
                for at in apps[:2]]
        third = start(apps[2], 300, seed=2)
        apps[2].run()
        assert third.state == "waiting"
        assert any("2 trainings are running on this server" in i.value for i in apps[2].info)
        # each session shows its own run
        for at, job, seed in zip(apps, jobs, (0, 1)):
            assert job.config.seed == seed
            loss = curves(at)
            assert loss["layout"]["title"]["text"].startswith("induction")
        a, b = (j.run.history for j in jobs)
        n = min(len(a), len(b))
        assert not np.allclose(a.induction.to_numpy()[:n], b.induction.to_numpy()[:n])
        apps[0].button(key="train_stop").click().run()
        wait(apps[2], lambda j: j.state in ("training", "done"))   # the freed slot goes to the waiting one
        assert jobs[1].state == "training"
    finally:
        stop_all(*apps)


def test_a_text_too_short_gets_a_sentence_and_the_page_keeps_working(new_app):
    at = new_app(page=PAGE)
    at.segmented_control(key="train_task").set_value("text").run()
    at.text_area(key="train_text").set_value("hi").run()
    job = start(at, 100)
    job = wait(at, lambda j: not j.running)
    assert job.state == "failed" and "too short" in shown(at.error[0].value)
    at.text_area(key="train_text").set_value("the cat sat on the mat . " * 20).run()
    job = wait(at, lambda j: not j.running) if start(at, 100).running else at.session_state["train_job"]
    assert job.state == "done" and set(job.run.probe) <= {"the", "cat", "sat", "on", "mat", "."}
