"""Results kept on disk across restarts (app_pages.ui.store): found again under the same model, code and key;
never under another; a damaged file is removed and reported missing."""
import numpy as np
import pandas as pd

from app_pages.results import store
from app_pages.results.store import Store, code_digest, folder_digest


def test_a_result_is_found_again_under_its_key_only(tmp_path):
    s = Store(tmp_path, "model-a")
    value = (pd.DataFrame({"layer": [0, 1], "lift": [0.5, 1.5]}), {"x": np.arange(6.0).reshape(2, 3)})
    assert s.load("profile|corpus") is None
    path = s.save("profile|corpus", value)
    assert path.parent == tmp_path / "model-a" / code_digest()
    frame, arrays = Store(tmp_path, "model-a").load("profile|corpus")  # a new process's store reads it
    pd.testing.assert_frame_equal(frame, value[0])
    np.testing.assert_array_equal(arrays["x"], value[1]["x"])
    assert Store(tmp_path, "model-b").load("profile|corpus") is None  # another model's weights
    assert s.load("profile|other corpus") is None
    assert s.size() == path.stat().st_size > 0
    assert not list(s.folder.glob("*.partial"))


def test_a_damaged_file_is_removed_and_recomputed(tmp_path):
    s = Store(tmp_path, "m")
    path = s.save("k", list(range(1000)))
    path.write_bytes(path.read_bytes()[:40])  # cut short, as a full disk or a killed process leaves it
    assert s.load("k") is None
    assert not path.exists()
    assert s.save("k", [1, 2]) == path and s.load("k") == [1, 2]


def test_the_code_digest_follows_the_sources(tmp_path, monkeypatch):
    for package in store.SOURCES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(store, "ROOT", tmp_path)
    store.code_digest.cache_clear()
    try:
        before = code_digest()
        (tmp_path / "analysis" / "a.py").write_text("x = 2\n")
        store.code_digest.cache_clear()
        assert code_digest() != before  # a change to the code makes every stored result stale
    finally:
        store.code_digest.cache_clear()


def test_the_model_digest_follows_its_files(tmp_path):
    (tmp_path / "config.json").write_text('{"n_layer": 2}')
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    (tmp_path / "notes.md").write_text("not part of the model")
    first = folder_digest(tmp_path)
    assert folder_digest(tmp_path) == first
    (tmp_path / "notes.md").write_text("still not part of it")
    assert folder_digest(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"\x01" * 64)
    assert folder_digest(tmp_path) != first


def test_results_of_other_code_versions_are_dropped(tmp_path):
    s = Store(tmp_path, "m")
    s.save("k", 1)
    old = tmp_path / "m" / "0123456789abcdef"
    old.mkdir()
    (old / "x.pkl").write_bytes(b"stale")
    other_model = tmp_path / "n" / "0123456789abcdef"
    other_model.mkdir(parents=True)
    assert s.drop_stale() == 1
    assert not old.exists() and other_model.is_dir() and s.load("k") == 1
