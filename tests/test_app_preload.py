"""The default model's preload computes what its slowest pages open with (``preload.encoder_steps``), so that a page
opened once the server has prepared draws it at once: the full forms Circuits and Queries & keys ask for first
(``Shared.now``, which shows a first form when the full one is not there), argument for argument, and everything
Head roles computes beside its first chart."""
import streamlit as st

from app_pages.results import shared
from app_pages.results.models import ModelRef
from app_pages.ui.preload import DEFAULT, encoder_steps

FIRST_FORMS = {"app_pages/circuits.py": "circuit curve", "app_pages/queries_keys.py": "queries and keys"}
ROLES = ["similarity", "explanations", "explanations", "replacement"]  # what Head roles computes after its first chart


def steps() -> list[tuple]:
    return encoder_steps(ModelRef(DEFAULT))


def test_the_preload_computes_the_full_forms_circuits_and_queries_and_keys_ask_for_first(new_app, monkeypatch):
    asked = []

    def now(result, *args):  # what the page asks for, and the page stopped there: nothing computed
        asked.append((result.name, args))
        st.stop()

    monkeypatch.setattr(shared.Shared, "now", now)
    for page in FIRST_FORMS:
        new_app(page=page)
    assert [name for name, _ in asked] == list(FIRST_FORMS.values()), asked
    computed = [(result.name, args) for result, args in steps()]
    for found in asked:
        assert found in computed, (found, computed)
    # importance first (Pruning and the card read it), Head roles' next, the curves last (Pruning's first is cheap)
    assert [name for name, _ in computed] == ["importance", *ROLES, *FIRST_FORMS.values(), "curves"]


def test_head_roles_computes_nothing_in_a_session_once_the_preload_has_its_results(new_app, monkeypatch):
    for result, args in steps():
        if result.name in ROLES:
            result(*args)
    in_session, put = [], shared.SharedCache.put

    def counted(cache, key, value):
        in_session.append(key[0])
        put(cache, key, value)

    monkeypatch.setattr(shared.SharedCache, "put", counted)
    at = new_app(page="app_pages/roles.py", timeout=300)
    assert not at.error, [e.value for e in at.error]
    # the sidebar's sentence's attention alone, if an earlier test in this process has not attended it already
    assert set(in_session) <= {"attention"}, in_session
