"""A result with a first form (``shared.First``) on a model no preparation holds: the page shows the first form at
once, then this session computes the full one (``later.complete``) and the page runs again with it, drawn in place."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.fast


def page():
    import streamlit as st

    from app_pages.results.later import complete, page_begins
    from app_pages.results.shared import First, shared

    @shared("first form test", first=First(lambda n: (n // 10,), "a tenth of the sum"))
    def total(n: int) -> int:
        st.session_state.setdefault("computed", []).append(n)
        return sum(range(n))

    page_begins()
    (n,) = total.now(1000)
    st.markdown(f"sum to {n}: {total(n)}")
    complete()


def test_the_first_form_is_shown_then_the_full_one_computed_here_takes_its_place():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(page, default_timeout=60)
    at.run()
    assert not at.exception
    assert at.session_state["computed"] == [100, 1000]  # the first form, then the full one, each once
    assert [m.value for m in at.markdown] == [f"sum to 1000: {sum(range(1000))}"]  # the full form, in place
    assert not at.info  # its note gone with it
    at.run()  # again: the full form is there at once
    assert at.session_state["computed"] == [100, 1000] and not at.info
