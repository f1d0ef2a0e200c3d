"""A page's first view in Chromium, as the benchmarks of first views and cards measure it: seconds to its first
picture and until it is done, in a new browser or a returning one's new tab, beside this machine's floor (a page of
one small chart)."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from harness.browser import PLOT, streamlit_server

RUNNING = "[data-testid='stStatusWidgetRunningIcon']"


def first_view(browser, url: str, timeout_s: float = 600, context=None) -> tuple[float, float, bool]:
    """(seconds to the first picture, seconds until done, whether an error box showed) for ``url``, in a new
    browser (a new context: nothing cached), or in a new tab of ``context`` (a returning visitor: the app's
    scripts cached, a new session all the same)."""
    own = context is None
    context = browser.new_context(viewport={"width": 1280, "height": 900}) if own else context
    page = context.new_page()
    start = time.perf_counter()
    page.goto(url)
    first = None
    deadline = start + timeout_s
    page.wait_for_selector("[data-testid='stMain'] h1", timeout=timeout_s * 1000)
    while time.perf_counter() < deadline:
        if first is None and page.locator(PLOT).count():
            first = time.perf_counter() - start
        # done: nothing running, nothing stale, for half a second
        if not page.locator(RUNNING).count() and not page.locator("[data-stale='true']").count():
            page.wait_for_timeout(500)
            if not page.locator(RUNNING).count() and not page.locator("[data-stale='true']").count():
                break
        page.wait_for_timeout(100)
    done = time.perf_counter() - start - 0.5
    error = bool(page.locator("[data-testid='stException'], [data-testid='stAlertContentError']").count())
    page.close()
    if own:
        context.close()
    return (done if first is None else first), done, error


PREPARING = "Preparing this model's pages"


def prepared(browser, url: str, timeout_s: float = 1800) -> float:
    """Seconds until a fresh session's sidebar no longer says the server is preparing."""
    start = time.perf_counter()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    while time.perf_counter() - start < timeout_s:
        page.goto(url)
        page.wait_for_selector("[data-testid='stMain'] h1", timeout=600_000)
        page.wait_for_timeout(1500)
        if not page.get_by_text(PREPARING).count():
            break
        page.wait_for_timeout(10_000)
    context.close()
    return time.perf_counter() - start


FLOOR_APP = """import plotly.graph_objects as go
import streamlit as st

st.set_page_config(layout="wide")
st.sidebar.title("Floor")
st.title("One small chart")
st.plotly_chart(go.Figure(go.Heatmap(z=[[0, 1], [1, 0]])))
"""


def both(browser, url: str, returning) -> tuple[float, float, bool]:
    """(seconds until done in a new browser, in a returning browser's new tab, whether an error showed)."""
    _, fresh, error = first_view(browser, url)
    _, again, error_again = first_view(browser, url, context=returning)
    return fresh, again, error or error_again


def floor(browser, runs: int = 3) -> tuple[float, float]:
    """A fresh session's floor on this machine: the median first view of a Streamlit app of one title and one
    2 x 2 heatmap, in a new browser and in a returning browser's new tab."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "floor.py"
        script.write_text(FLOOR_APP)
        with streamlit_server(script=str(script)) as (url, _):
            returning = browser.new_context(viewport={"width": 1280, "height": 900})
            first_view(browser, url, context=returning)  # its scripts cached, as a returning visitor's are
            views = [both(browser, url, returning) for _ in range(runs)]
            returning.close()
    return statistics.median(v[0] for v in views), statistics.median(v[1] for v in views)
