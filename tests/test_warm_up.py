"""A server's warm-up on SmolLM2: once the model loads, what the slow pages need over the built-in corpus is
computed in the background under the very keys the pages ask for (each page then computes none of it),
kept on disk, and read back after a restart (each result equal to the one computed)."""
import threading
import time

import pandas as pd
import pytest

from app_pages.results import preparing, progress, shared
from app_pages.ui import warm_up
from app_pages.results.models import ModelRef
from app_pages.results.threads import here
from tests.prepared import REF, cleared, fingerprint

PAGES = ["app_pages/foci.py", "app_pages/roles.py", "app_pages/effects.py", "app_pages/pruning.py",
         "app_pages/queries_keys.py"]


def finished(at_most_s: float = 900) -> warm_up.Warmup:
    job = warm_up.job(REF)
    job.thread.join(timeout=at_most_s)
    assert job.state == "done", (job.state, job.error)
    return job


@pytest.fixture
def warm(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADLENS_WARM_UP", "1")
    monkeypatch.setenv("HEADLENS_RESULTS", str(tmp_path))
    cleared()
    yield tmp_path
    cleared()


def same(a, b) -> None:
    """``a`` equals ``b``: frames as frames, a tuple part by part."""
    if isinstance(b, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b)
    elif isinstance(b, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


def test_a_restart_reads_the_preparation_from_disk_and_the_pages_compute_none_of_it(new_app, prepared, monkeypatch):
    """The run's one preparation from nothing (``tests.prepared``) kept every step on disk; a restarted server reads
    each back, equal to what was computed, the other engine of the model finds every one, and each page's default
    view reads what it needs and computes none of it."""
    prepared.finished()
    steps = warm_up.steps(REF)
    names = [result.name for result, _ in steps]
    assert sorted(name for name, _, _ in prepared.done) == sorted(names)
    assert len(list(prepared.folder.rglob("*.pkl"))) == len(names)
    monkeypatch.setenv("HEADLENS_WARM_UP", "1")
    monkeypatch.setenv("HEADLENS_RESULTS", str(prepared.folder))
    cleared()  # a restart: the caches are empty, the disk is not
    at = new_app({"model": REF.choice})
    job = finished(at_most_s=180)
    assert {how for _, how, _ in job.done} == {"stored"}
    again = {result.key(*args): result.peek(*args) for result, args in steps}
    assert again.keys() == prepared.prints.keys() and all(value is not None for value in again.values())
    for key, value in again.items():
        same(fingerprint(value), prepared.prints[key])
    assert {key[0] for key, was in prepared.prints.items() if was is not None} >= {
        "profile", "detector", "curves", "proxies", "importance", "queries and keys"}
    other = ModelRef("smollm2")  # the transformers engine of the same weights finds every result
    assert warm_up.warm_up(other) is job
    assert all(result.peek(*args) is again[result.key(*args)] for result, args in warm_up.steps(other))

    puts = []
    real_put = shared.SharedCache.put
    monkeypatch.setattr(shared.SharedCache, "put", lambda self, key, value: (puts.append(key),
                                                                              real_put(self, key, value)))
    for page in PAGES:  # each page's default view reads the corpus results it needs, and computes none of them
        at.switch_page(page).run()
        assert not at.exception and not at.error, (page, at.exception, [e.value for e in at.error])
    assert not set(again) & set(puts), [k[0] for k in set(again) & set(puts)]
    warm_up.warmups().clear()  # the values read back stay in the caches for the tests after this one


def test_no_warm_up_unless_a_bundled_decoder_loads(new_app, warm):
    new_app({"model": "minilm"})
    assert warm_up.warmups() == {}
    assert warm_up.warm_up_note(REF) is None


@pytest.mark.bundled  # the steps read SmolLM2's tokenizer
def test_the_warm_up_asks_for_what_the_pages_declare():
    """Each step is a declared result and the arguments its declaration gives, so that its key is the one a page
    asking with the same arguments builds (``Shared.key``): no key is written twice."""
    steps = warm_up.steps(REF)
    assert [r.name for r, _ in steps] == ["profile", "profile", "peaks", "detector", "similarity", "writes",
                                          "importance", "proxies", "copying", *["effects"] * 6, "routes",
                                          "queries and keys", "curves", "task effects", "task table", "circuit scores",
                                          "circuit curve", "explanations", "atlas", "replacement"]
    # a head's card reads every one before the atlas; the Circuits page opens on the circuit steps
    from app_pages.results.pruning import LLM_SAMPLE, curves, importance
    from app_pages.ui.pruning import corpus_sample

    sample = corpus_sample(LLM_SAMPLE)
    assert importance.key(REF, "zero", sample, "gradient") in {r.key(*a) for r, a in steps}
    assert curves.key(REF, "zero", list(sample), "gradient") in {r.key(*a) for r, a in steps}
    assert importance.key(REF, "zero", sample, "ablation") not in {r.key(*a) for r, a in steps}


@pytest.mark.bundled
def test_both_engines_of_a_model_ask_for_one_result_and_share_one_warm_up(warm, monkeypatch):
    """SmolLM2 on transformers and on the from-scratch engine give the same weights' numbers: their pages' keys are the same
    (the detector asked for on both engines once), and opening the other engine joins the running warm-up."""
    other = ModelRef("smollm2")
    assert [r.key(*a) for r, a in warm_up.steps(other)] == [r.key(*a) for r, a in warm_up.steps(REF)]
    assert warm_up.steps(other)[3][0].name == "detector" and warm_up.steps(other)[4][0].name != "detector"
    assert ModelRef("minilm").cache_key == ModelRef("scratch").cache_key != ModelRef("untrained").cache_key
    assert ModelRef("custom", folder="a").cache_key != ModelRef("custom", folder="b").cache_key
    monkeypatch.setattr(warm_up, "_warm", lambda job: None)  # the registry alone: nothing computed
    job = warm_up.warm_up(REF)
    assert job is not None and warm_up.warm_up(other) is job and len(warm_up.warmups()) == 1



@pytest.mark.bundled
def test_a_page_finds_the_preparations_steps_while_the_weights_are_read(warm, monkeypatch):
    """The preparation's steps are found (``preparing``) from its start, while it reads both engines' weights: a page
    opened then waits for a step, or leaves it for a first form, and does not compute it beside the preparation
    (the Atlas on a cold SmolLM2 computed every step of its card itself: 60 s to its first chart)."""
    reading, go, ran = threading.Event(), threading.Event(), []

    def page_in(self):
        reading.set()
        assert go.wait(120)

    from app_pages.results.models import cached_model
    for key in ("smollm2", REF.choice):
        monkeypatch.setattr(type(cached_model(ModelRef(key))), "page_in", page_in)
    monkeypatch.setattr(warm_up, "_step", lambda job, store, result, args: ran.append(result.key(*args)))
    job = warm_up.warm_up(REF)
    assert reading.wait(120)
    todo = [result.key(*args) for result, args in warm_up.steps(REF)]
    assert job.queue is not None and all(preparing.preparing(key) is job.queue for key in todo)
    go.set()
    finished(120)
    assert ran == todo and not preparing.QUEUES  # each step run by the preparation, in order; then it is gone

def _preparing(cache, ticks: list, started: threading.Event, page: dict | None = None,
               steps: int = 40) -> threading.Thread:
    """The server's preparation computing "prepared" in its own thread: ``steps`` progress points, each followed by
    a tick that records whether a session's page was computing then (``page["on"]``)."""
    def prepare():
        here.background = here.steps_aside = True

        def compute():
            bar = progress.Bar("Preparing")
            for i in range(steps):
                bar(i, steps)  # a progress point: where the preparation may step aside
                ticks.append(bool(page and page["on"]))
                started.set()
                time.sleep(0.005)
            return "prepared"

        cache.get_or_compute("prepared", compute)

    thread = threading.Thread(target=prepare, daemon=True)
    thread.start()
    return thread


def _until(condition, timeout_s: float = 120.0) -> bool:
    """Whether ``condition()`` comes true within ``timeout_s`` (room for a busy machine): a state waited on."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_the_preparation_steps_aside_while_a_session_computes():
    """A page opened while the server prepares is computed first: the preparation pauses at its next progress point
    (at most the tick under way when the page began comes while it computes) until the session's computation is
    done, then goes on."""
    cache, ticks, started, page = shared.SharedCache(4), [], threading.Event(), {"on": False}
    thread = _preparing(cache, ticks, started, page)
    assert started.wait(120)

    def compute():
        page["on"] = True
        paused = _until(lambda: preparing.SESSIONS.aside == 1)  # the preparation waits at a progress point
        page["on"] = False
        return paused

    assert shared.computed_once(cache, "page", compute, "Waiting") is True
    thread.join(120)
    assert sum(ticks) <= 1 and len(ticks) == 40 and not ticks[-1] and cache.get("prepared") == "prepared"
    assert (preparing.SESSIONS.computing, preparing.SESSIONS.waiting, preparing.SESSIONS.aside) == (0, 0, 0)


def test_sessions_computing_side_by_side_split_the_cores(monkeypatch):
    """Each thread computing takes its share of the cores in torch threads: all of them alone, one each beside
    another; a progress point gives a long computation the cores back once the other has ended."""
    import torch

    monkeypatch.setattr(preparing, "CORES", 2)
    seen, second_in, first_out = {}, threading.Event(), threading.Event()

    def first():
        with preparing.SESSIONS.counted("computing"):
            seen["alone"] = torch.get_num_threads()
            second_in.wait(30)
            preparing.step_aside()  # a progress point, the other computing too
            seen["beside"] = torch.get_num_threads()
            first_out.set()

    def second():
        with preparing.SESSIONS.counted("computing"):
            seen["second"] = torch.get_num_threads()
            second_in.set()
            first_out.wait(30)
            preparing.step_aside()  # the first has ended: both cores again
            seen["second alone"] = torch.get_num_threads()

    threads = torch.get_num_threads()
    a = threading.Thread(target=first)
    a.start()
    try:
        while not preparing.SESSIONS.computing:
            time.sleep(0.01)
        b = threading.Thread(target=second)
        b.start()
        a.join(120)
        b.join(120)
    finally:
        torch.set_num_threads(threads)  # the count threads started from now on read, as the run set it
    assert not a.is_alive() and not b.is_alive(), "a session's computation did not end"
    assert seen == {"alone": 2, "second": 1, "beside": 1, "second alone": 2}, seen
    assert preparing.SESSIONS.computing == 0

    # a page waiting on another's computation leaves the cores to those computing
    waiting, done = threading.Event(), threading.Event()

    def page_that_waits():
        with preparing.SESSIONS.counted("computing"), preparing.SESSIONS.counted("waiting"):
            waiting.set()
            done.wait(30)

    c = threading.Thread(target=page_that_waits)
    c.start()
    try:
        assert waiting.wait(30)
        with preparing.SESSIONS.counted("computing"):
            assert preparing.SESSIONS.share() == 2
    finally:
        done.set()
        c.join(30)
        torch.set_num_threads(threads)


def test_the_preparation_never_pauses_for_a_session_that_waits_on_it(monkeypatch):
    """A session whose computation needs what the preparation is computing waits for it, and the preparation goes
    on meanwhile: however long the preparation would step aside (an hour here), the session gets the value."""
    cache, ticks, started = shared.SharedCache(4), [], threading.Event()
    aside = preparing.SESSIONS.step_aside
    monkeypatch.setattr(preparing.SESSIONS, "step_aside", lambda at_most_s=60.0: aside(3600.0))
    thread = _preparing(cache, ticks, started)
    assert started.wait(120)
    got = []
    session = threading.Thread(target=lambda: got.append(shared.computed_once(
        cache, "page", lambda: shared.computed_once(cache, "prepared", lambda: "again", "Waiting"), "Waiting")),
        daemon=True)
    session.start()
    session.join(120)  # a preparation paused for it would hold it an hour
    assert got == ["prepared"]
    thread.join(120)
    assert len(ticks) == 40 and (preparing.SESSIONS.computing, preparing.SESSIONS.waiting) == (0, 0)


def _declared(name: str, compute) -> shared.Shared:
    """A result declared as ``@shared`` declares one, kept out of the app's own list."""
    return shared.Shared(compute, name, 4, None, None, False, f"Computing {name}", None, False)


def test_a_session_waiting_on_a_queued_step_moves_it_to_the_front():
    """A session asking for a step the preparation has not started waits for the preparation to run it, and the
    preparation runs it next, inside the step under way, which pauses; a step that reads what the paused one
    computes runs as soon as that one ends, before the rest of the queue. The step under way goes on until the
    test lets it end: nothing here depends on how long a step takes."""
    events, ticking, release = [], threading.Event(), threading.Event()

    def slow():
        while not release.is_set():
            ticking.set()
            preparing.step_aside()  # a progress point
            time.sleep(0.005)
        events.append(("slow", threading.current_thread().name))
        return "slow"

    first = _declared("slow", slow)
    second = _declared("second", lambda: events.append(("second", threading.current_thread().name)) or "second")
    wanted = _declared("wanted", lambda: events.append(("wanted", threading.current_thread().name)) or "wanted")
    reads = _declared("reads", lambda: (first(), events.append(("reads", threading.current_thread().name)))[0])
    queue = preparing.Queue([(first, ()), (second, ()), (reads, ()), (wanted, ())], lambda result, args: result(*args))
    thread = threading.Thread(target=queue.prepare, name="preparation", daemon=True)
    thread.start()
    assert ticking.wait(120)
    assert preparing.preparing(wanted.key()) is queue
    assert wanted() == "wanted"  # this session waits; the preparation computes it, while "slow" is paused
    assert events == [("wanted", "preparation")]
    # "slow" ends once this session waits on "reads", which needs it: "reads" runs right after it, before "second"
    threading.Thread(target=lambda: _until(lambda: preparing.SESSIONS.waiting >= 1) and release.set(), daemon=True).start()
    assert reads() == "slow"
    thread.join(120)
    assert events == [("wanted", "preparation"), ("slow", "preparation"), ("reads", "preparation"),
                      ("second", "preparation")]
    assert not preparing.QUEUES and preparing.SESSIONS.waiting == 0
