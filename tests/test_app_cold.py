"""A cold server: SmolLM2's preparation from nothing under way (``tests.prepared``) while sessions open its slowest
pages. Each page shows a first form (or what is prepared), computes in its own session none of the results the
preparation computes (it moves them to the front and waits), and is then run again with the full form in place."""
import threading

from app_pages.results import shared, steps
from app_pages.results.qk import first_pictures
from analysis.defaults import PAIRS
from tests.conftest import COLD_RUN_S, decode, figures, title_text
from tests.test_app_head import table
from tests.prepared import REF

PAGES = ["app_pages/queries_keys.py", "app_pages/circuits.py", "app_pages/pruning.py", "app_pages/head.py",
         "app_pages/effects.py", "app_pages/foci.py", "app_pages/atlas.py"]
FIRST_FORMS = {"app_pages/queries_keys.py": "queries and keys", "app_pages/circuits.py": "circuit curve",
               "app_pages/pruning.py": "curves", "app_pages/foci.py": "profile"}


def test_a_cold_servers_pages_show_first_forms_and_leave_the_full_ones_to_the_preparation(new_app, prepared,
                                                                                           monkeypatch):
    job = prepared.job  # under way (this test runs first among those given it) or, on a fast machine, done
    prepared_keys = {result.key(*args) for result, args in steps(REF)}
    in_sessions, shown_first, went_on = [], [], []
    put, now, later = shared.SharedCache.put, shared.Shared.now, shared.Shared.later

    def counted_put(cache, key, value):
        if threading.current_thread() is not job.thread:
            in_sessions.append(key)
        put(cache, key, value)

    def counted_now(result, *args):
        ready = result.peek(*args) is not None  # the full form ready when the page asks: shown at once
        out = now(result, *args)
        shown_first.append((result.name, out != args, ready))
        return out

    def counted_later(result, *args, says=""):
        out = later(result, *args, says=says)
        went_on.append((result.name, out))
        return out

    monkeypatch.setattr(shared.SharedCache, "put", counted_put)
    monkeypatch.setattr(shared.Shared, "now", counted_now)
    monkeypatch.setattr(shared.Shared, "later", counted_later)
    finals = {}
    for page in PAGES:
        shown_first.clear(), went_on.clear()
        at = new_app({"model": REF.choice}, page=page, timeout=COLD_RUN_S)
        assert not at.exception and not at.error, (page, at.exception, [e.value for e in at.error])
        if page in FIRST_FORMS:  # its first run showed the first form unless the full one was ready; its last, the full
            name = FIRST_FORMS[page]
            asked = [(first, ready) for n, first, ready in shown_first if n == name]
            assert asked and asked[0][0] == (not asked[0][1]) and not asked[-1][0], (page, shown_first)
        if page == "app_pages/pruning.py":  # a decoder's importance is by gradient, one pass in all: no first form
            measured = [first for n, first, _ in shown_first if n == "importance"]
            assert measured and not any(measured), shown_first
        finals[page] = at
    assert not set(in_sessions) & prepared_keys, sorted(k[0] for k in set(in_sessions) & prepared_keys)

    circuits = {m.label: m.value for m in finals["app_pages/circuits.py"].metric}
    assert circuits["Pairs"] == "50", circuits  # the full circuit: EAP-IG over the task's 50 pairs
    (_, sentences, _), = first_pictures(REF)
    qk = [m.value for m in finals["app_pages/queries_keys.py"].markdown if m.value.startswith("#### Every head over")]
    assert qk == [f"#### Every head over {len(sentences):,} sentences"], qk
    pruning = finals["app_pages/pruning.py"]  # the full curves: ten sizes and none, by five orders
    curves = next(f for f in figures(pruning) if title_text(f).startswith("Pruning curves"))
    assert {len(t["x"]) if isinstance(t["x"], list) else len(decode(t["x"])) for t in curves["data"]
            if t.get("x") is not None} == {11}, curves["data"]
    head = finals["app_pages/head.py"]
    assert not [i for i in head.info if i.value.startswith("A first card")]
    assert len(table(head, "built-in pair")) == len(PAIRS)  # the card's parts, prepared, in place
    assert any(m.label.endswith("mean recovered") for m in head.metric)

    prepared.finished()
    assert sorted(name for name, _, _ in prepared.done) == sorted(r.name for r, _ in steps(REF))
    # each computed by the preparation: as a step, or inside a step that reads it (a circuit's curve its scores)
    assert {how for _, how, _ in prepared.done} <= {"computed", "found"}, prepared.done
