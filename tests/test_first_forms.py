"""A result with a first form (``shared.First``) on a model no preparation holds: the page shows the first form at
once, then this session computes the full one (``later.complete``) and the page runs again with it, drawn in place."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.fast


def page(asked: int = 1000):
    import streamlit as st

    from app_pages.results.later import complete, page_begins
    from app_pages.results.shared import First, shared

    @shared(f"first form test {asked}", first=First(lambda n: (min(n, 100),), "the sum to 100 at most"))
    def total(n: int) -> int:
        st.session_state.setdefault("computed", []).append(n)
        return sum(range(n))

    page_begins()
    st.session_state["runs"] = st.session_state.get("runs", 0) + 1
    (n,) = total.now(asked)
    st.markdown(f"sum to {n}: {total(n)}")
    complete()


def test_the_first_form_is_shown_then_the_full_one_computed_here_takes_its_place():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(page, default_timeout=60)
    at.run()
    assert not at.exception
    assert at.session_state["computed"] == [100, 1000]  # the first form, then the full one, each once
    assert at.session_state["runs"] == 2  # and the page again, with it
    assert [m.value for m in at.markdown] == [f"sum to 1000: {sum(range(1000))}"]  # the full form, in place
    assert not at.info  # its note gone with it
    at.run()  # again: the full form is there at once
    assert at.session_state["computed"] == [100, 1000] and not at.info


def test_a_result_as_small_as_its_first_form_is_computed_once_with_no_first_form():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(page, args=(60,), default_timeout=60)
    at.run()
    assert not at.exception
    assert at.session_state["computed"] == [60] and at.session_state["runs"] == 1  # once: its first form is itself
    assert [m.value for m in at.markdown] == [f"sum to 60: {sum(range(60))}"] and not at.info
