"""Two sessions of the app in one server process (two AppTests): each sees only its own choices,
and the model both use from the shared cache is the same before and after."""
import numpy as np
import pytest

from analysis import make_view
from tests.conftest import decode, figures, heatmaps, tick_text

A_TEXT = "Session A reads about kites."
B_TEXT = "Session B reads about boats and the sea."


def grid(at) -> list[np.ndarray]:
    return [decode(t["z"]) for t in heatmaps(figures(at)[0])]


def test_two_sessions_never_see_each_others_state(new_app, hf_model, scratch_model):
    a = new_app({"model": "scratch", "heads_off": ["0.1", "0.5"], "causal": "true", "layer": "2"})
    b = new_app({"model": "minilm", "hide_special": "true"})
    mask = np.ones((6, 12), dtype=np.float32)
    mask[0, [1, 5]] = 0
    for step in range(2):
        a.text_area(key="text").input(A_TEXT if step == 0 else A_TEXT + " Again.").run()
        b.text_area(key="text").input(B_TEXT).run()
        assert not a.exception and not b.exception
        a_text = A_TEXT if step == 0 else A_TEXT + " Again."
        want_a = scratch_model.attend(a_text, head_mask=mask, causal=True)
        hidden = np.triu(np.ones(want_a.weights.shape[-2:], bool), 1)  # causal: later keys drawn empty (grey)
        for h, z in enumerate(grid(a)):
            np.testing.assert_allclose(z, np.where(hidden, np.nan, want_a.weights[2, h]), atol=1e-6)
        want_b = make_view(hf_model.attend(B_TEXT), hide_special=True)
        for h, z in enumerate(grid(b)):
            np.testing.assert_allclose(z, want_b.weights[0, h], atol=1e-6)
        assert tick_text(figures(b)[0]) == want_b.key_labels
    # each session's settings and link are its own
    assert a.session_state["heads_off"] == [(0, 1), (0, 5)] and a.session_state["causal"] is True
    assert "heads_off" not in b.session_state and b.session_state["hide_special"] is True
    assert dict(a.query_params) == {"model": "scratch", "heads_off": ["0.1", "0.5"], "causal": "true", "layer": "2",
                                    "text": A_TEXT + " Again."}
    assert dict(b.query_params) == {"hide_special": "true", "text": B_TEXT}  # model=minilm is the default
    # a third session gets the model unmasked and non-causal: nothing was changed in the cache
    c = new_app({"model": "scratch"})
    c.text_area(key="text").input(A_TEXT).run()
    want_c = hf_model.attend(A_TEXT)
    for h, z in enumerate(grid(c)):
        np.testing.assert_allclose(z, want_c.weights[0, h], atol=1e-5)


def test_sessions_asking_for_the_same_profile_compute_it_once(new_app, monkeypatch):
    """Two sessions open Head roles on the same new sentences at once: one computes, one waits."""
    import threading

    import app_pages.results.profiles as c

    calls, real = [], c.measure_heads

    def counting(attentions):
        calls.append(len(attentions))
        return real(attentions)

    monkeypatch.setattr(c, "measure_heads", counting)
    # one script cache for both sessions, as a server keeps one: AppTest makes one per run, and two runs compiling a
    # page at once in two threads can hit a CPython 3.11 race in its parser ("AST constructor recursion depth")
    import streamlit.testing.v1.app_test as app_test
    import streamlit.testing.v1.local_script_runner as local_runner
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache

    one = ScriptCache()
    for module in (app_test, local_runner):
        monkeypatch.setattr(module, "ScriptCache", lambda: one)
    text = "Two sessions profile this line.\nAnd this second one, together."
    sessions = [new_app({"text": "Start."}, page="app_pages/roles.py") for _ in range(2)]
    for at in sessions:
        at.segmented_control(key="corpus").set_value("sidebar")
        at.text_area(key="text").input(text)
    calls.clear()
    threads = [threading.Thread(target=at.run) for at in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [2]
    titles = [figures(at)[0]["layout"]["title"]["text"] for at in sessions]
    assert titles == ["Roles over 2 sentences"] * 2
    assert sessions[0].dataframe[0].value.equals(sessions[1].dataframe[0].value)


def test_results_are_shared_read_only_and_kept_within_their_budget(new_app, hf_model):
    from app_pages.results.attention import cached_attention
    from app_pages.results.cache import SharedCache
    from app_pages.results.models import ModelRef

    a = new_app({"text": "A shared sentence."})
    b = new_app({"text": "A shared sentence."})
    att = cached_attention.peek(ModelRef("minilm"), "A shared sentence.", False, (), False, None)  # causal, heads off, moved, layers
    assert att is not None and not att.weights.flags.writeable  # one object for both sessions, never written
    with pytest.raises(ValueError):
        att.weights[0, 0, 0, 0] = 1.0
    np.testing.assert_allclose(att.weights, hf_model.attend("A shared sentence.").weights, atol=1e-6)
    assert not a.exception and not b.exception

    cache = SharedCache(max_entries=10, max_bytes=100, size=len)
    for k in "abc":
        cache.put(k, "x" * 40)
    assert cache.get("a") is None and cache.get("b") == cache.get("c") == "x" * 40  # 120 bytes > 100
    with pytest.raises(ZeroDivisionError):
        cache.get_or_compute("d", lambda: 1 / 0)
    assert cache.get("d") is None and cache.get_or_compute("d", lambda: "y") == "y"


def test_a_full_cache_drops_a_sessions_entry_before_the_servers_preparation(monkeypatch):
    """Three bundled models' preparations held six profiles, over the four kept: the default encoder's corpus profile,
    which Foci and Head roles open on, went, and a newcomer's page computed it again."""
    from app_pages.results import cache as cache_module
    from app_pages.results import shared, threads

    cache, who = shared.SharedCache(max_entries=3, owned=True), {"id": None}
    monkeypatch.setattr(cache_module, "session_id", lambda: who["id"])
    cache.put("server", 1)  # the preparation's, in the server's own thread
    who["id"] = "a"
    cache.put("a1", 2)
    cache.put("a2", 3)
    assert cache.get("server") == 1  # a session reads it: still the server's
    cache.put("a3", 4)  # over three: the session's oldest goes, not the older server entry
    assert (cache.get("server"), cache.get("a1"), cache.get("a2"), cache.get("a3")) == (1, None, 3, 4)
    who["id"] = None
    cache.put("server2", 5)
    cache.put("server3", 6)  # the sessions' entries go first
    assert list(cache._items) == ["server", "server2", "server3"]
    cache.put("server4", 7)  # only the server's left beside the one stored: then the least recently used
    assert list(cache._items) == ["server2", "server3", "server4"]
    assert threads.session_id() is None


def test_the_server_hands_the_interpreter_lock_on_within_a_millisecond(app):
    """A session's torch work, many small operations each taking the lock back, waited up to 5 ms for each while
    another session ran Python: SmolLM2's forward pass on three sentences beside two such threads took 10 s."""
    import sys

    from app_pages.results.threads import SWITCH_INTERVAL_S

    assert SWITCH_INTERVAL_S <= 0.001 and sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
