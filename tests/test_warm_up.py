"""A server's warm-up on SmolLM2: once the model loads, what the slow pages need over the built-in corpus is
computed in the background under the very keys the pages ask for (each page then computes none of it),
kept on disk, and read back after a restart (each result equal to the one computed)."""
import pandas as pd
import pytest

from app_pages.ui import caches, sessions
from app_pages.ui.models import ModelRef

REF = ModelRef("smollm2_scratch")
PAGES = ["app_pages/foci.py", "app_pages/roles.py", "app_pages/effects.py", "app_pages/pruning.py",
         "app_pages/queries_keys.py"]


def cleared() -> None:
    """The server as a restart leaves it: no warm-up, and nothing in the caches the warm-up fills."""
    sessions.warmups().clear()
    for _, cache, _, _ in sessions.tasks(REF):
        cache._items.clear()
        cache._owners.clear()


def finished(at_most_s: float = 900) -> sessions.Warmup:
    job = sessions.warmups()[REF]
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


def test_the_pages_find_what_the_warm_up_computed_and_a_restart_reads_it_from_disk(new_app, warm, monkeypatch):
    at = new_app({"model": REF.choice})  # whoever opens the model first starts the warm-up
    assert not at.exception
    job = finished()
    names = [name for name, _, _, _ in sessions.tasks(REF)]
    assert [name for name, _, _ in job.done] == names
    assert {how for _, how, _ in job.done} == {"computed"}
    assert len(list(warm.rglob("*.pkl"))) == len(names)
    first = {name: cache.get(key) for name, cache, key, _ in sessions.tasks(REF)}
    assert all(value is not None for value in first.values())

    puts = []
    real_put = caches.SharedCache.put
    monkeypatch.setattr(caches.SharedCache, "put", lambda self, key, value: (puts.append(key),
                                                                              real_put(self, key, value)))
    for page in PAGES:  # each page's default view reads the corpus results it needs, and computes none of them
        at.switch_page(page).run()
        assert not at.exception and not at.error, (page, at.exception, [e.value for e in at.error])
    warmed = {key for _, _, key, _ in sessions.tasks(REF)}
    assert not warmed & set(puts), [k[0] if isinstance(k[0], str) else "profile" for k in warmed & set(puts)]
    monkeypatch.setattr(caches.SharedCache, "put", real_put)

    cleared()  # a restart: the caches are empty, the disk is not
    at = new_app({"model": REF.choice})
    job = finished(at_most_s=120)
    assert {how for _, how, _ in job.done} == {"stored"}
    again = {name: cache.get(key) for name, cache, key, _ in sessions.tasks(REF)}
    frame, per_sentence, attentions = again["profile"]
    pd.testing.assert_frame_equal(frame, first["profile"][0])
    assert [a.text for a in attentions] == [a.text for a in first["profile"][2]]
    pd.testing.assert_frame_equal(again["detector"], first["detector"])
    pd.testing.assert_frame_equal(again["importance"].frame, first["importance"].frame)
    pd.testing.assert_frame_equal(again["curves"], first["curves"])
    pictures = again["queries and keys"]
    assert pictures.png == first["queries and keys"].png
    for pair, frame in first["queries and keys"].frames.items():
        pd.testing.assert_frame_equal(pictures.frames[pair], frame)


def test_no_warm_up_unless_a_bundled_decoder_loads(new_app, warm):
    new_app({"model": "minilm"})
    assert sessions.warmups() == {}
    assert sessions.warm_up_note(REF) is None
