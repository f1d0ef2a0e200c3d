"""The default model's preload computes the full forms its slowest pages open with: what the Circuits and Queries &
keys pages ask for first (``Shared.now``, which shows a first form when the full one is not there) is what
``preload.encoder_steps`` computes, argument for argument, so that a page opened once the server has prepared draws
the full form at once."""
import streamlit as st

from app_pages.results import shared
from app_pages.results.models import ModelRef
from app_pages.ui.preload import DEFAULT, encoder_steps

PAGES = {"app_pages/circuits.py": "circuit curve", "app_pages/queries_keys.py": "queries and keys"}


def test_the_preload_computes_what_the_default_models_slowest_pages_ask_for_first(new_app, monkeypatch):
    asked = []

    def now(result, *args):  # what the page asks for, and the page stopped there: nothing computed
        asked.append((result.name, args))
        st.stop()

    monkeypatch.setattr(shared.Shared, "now", now)
    for page in PAGES:
        new_app(page=page)
    assert [name for name, _ in asked] == list(PAGES.values()), asked
    steps = [(result.name, args) for result, args in encoder_steps(ModelRef(DEFAULT))]
    for found in asked:
        assert found in steps, (found, steps)
    # importance first (Pruning and the card read it), the curves last (Pruning's first form is cheap)
    assert [name for name, _ in steps] == ["importance", *PAGES.values(), "curves"]
