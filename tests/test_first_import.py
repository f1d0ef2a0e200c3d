"""The default page opens without waiting for what it does not draw: a fresh process importing what the pages'
router, Explore and the server's preload import loads no ``scipy.stats`` (a second of a cold server's first page
on two cores; the figures that use it import it); the server loads the default model as it starts, and a session
asking for it meanwhile waits for that load instead of starting its own."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
DEFERRED = ["scipy.stats"]


def imports_of(path: Path) -> list[str]:
    """The modules ``path`` imports at its top level."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
    return out


def test_the_first_page_imports_no_scipy_stats():
    modules = sorted(set(imports_of(ROOT / "headlens.py") + imports_of(ROOT / "app_pages" / "explore.py")
                         + ["app_pages.ui.preload", "analysis", "viz"]))
    assert "app_pages.ui.sidebar" in modules and "app_pages.ui.attention" in modules
    script = "; ".join([f"import {m}" for m in modules] + [f"import sys; print([m for m in {DEFERRED!r} if m in sys.modules])"])
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_the_preload_names_bundled_models_only(caplog, monkeypatch):
    monkeypatch.delenv("HEADLENS_PRELOAD", raising=False)
    from app_pages.ui.preload import choices
    from models.catalog import CATALOG

    first, second = CATALOG[0].key, CATALOG[1].key
    assert choices("none") == [] and choices("") == [] and choices(None) == [first]  # the sidebar's default
    assert choices(f" {second} , {first}") == [second, first]
    with caplog.at_level("WARNING", logger="headlens"):
        assert choices(f"{second},gpt-5") == [second]
    assert "gpt-5" in caplog.text and ", ".join(b.key for b in CATALOG) in caplog.text


def test_a_session_asking_during_the_preload_waits_for_its_load(monkeypatch):
    """The preload and a session's first page ask for the model at once: one load per engine, the same instance;
    then the encoder's corpus profile, and its other first results once the model's load is reported."""
    import threading
    import time

    from app_pages.results import models as results
    from app_pages.results.profiles import corpus_profile
    from app_pages.ui import preload as preloading
    from models.corpus import CORPUS

    calls, started, real = [], threading.Event(), results.load_model
    rest = []

    def slow_load(name, backend, device, untrained):
        calls.append(backend)
        started.set()
        time.sleep(0.5)
        return real(name, backend=backend, device=device, untrained=untrained)

    monkeypatch.setenv("HEADLENS_WARM_UP", "0")
    monkeypatch.setattr(results, "load_model", slow_load)
    monkeypatch.setattr(preloading, "encoder_results", lambda ref: rest.append((ref, dict(report))))
    results.shared_model.clear()
    report = {}
    thread = threading.Thread(target=preloading.preload, args=(report, "minilm"))
    thread.start()
    assert started.wait(30)
    asked = results.cached_model(results.ModelRef("minilm"))  # as Explore asks, while the preload loads it
    thread.join(120)
    assert not thread.is_alive() and report["error"] is None and report["done"] == ["minilm"]
    assert sorted(calls) == ["scratch", "transformers"]  # each engine once
    assert asked is results.cached_model(results.ModelRef("minilm"))
    assert corpus_profile.peek(results.ModelRef("minilm"), False, (), list(CORPUS)) is not None
    (ref, then), = rest
    assert ref == results.ModelRef("minilm") and then["seconds"] is not None and then["prepared"] is None
    assert report["prepared"] >= report["seconds"] >= 1.0  # both loads, one after the other
