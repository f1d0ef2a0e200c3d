"""The class harness's own measures: its browsers at the lowest CPU priority, and an action's first answer read
from the page (the asked layer, or the nearest ready one titled so), never from a chart left from before."""
import os
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from harness.browser import chromium, low_priority
from harness.load import LoadReport
from harness.load_llm import FIRST, HEADINGS

pytestmark = pytest.mark.browser

PAGE = """<div data-testid="stMain"><h1>{heading}</h1>
<div class="element" {stale}><div class="js-plotly-plot"><svg class="main-svg"></svg>
<div class="gtitle">{title}</div></div></div></div>"""


def _chromes() -> set[psutil.Process]:
    return {p for p in psutil.Process(os.getpid()).children(recursive=True) if "chrom" in p.name()}


def _low_priority_browser(check) -> None:
    """``check(page)`` in a Chromium of the class's launcher, run in a thread of its own: Playwright's sync API
    refuses a thread where another browser of the run (the suite's shared one) holds its loop."""
    def run():
        with chromium(low_priority()) as browser:
            check(browser.new_page())
    with ThreadPoolExecutor(1) as pool:
        pool.submit(run).result()


def test_the_class_browsers_run_at_the_lowest_priority_and_their_first_answer_is_read_from_the_page():
    others, seen = _chromes(), []  # a browser the run has open already is not the class's

    def check(page):
        def first(title: str, wants: list[str], stale: bool = False, heading: str = "Explore",
                  shown: str = "Explore") -> bool:
            page.set_content(PAGE.format(title=title, stale='data-stale="true"' if stale else "", heading=shown))
            return page.evaluate(FIRST, [heading, wants])

        seen.extend(_chromes() - others)
        assert len(seen) >= 2  # the browser and its renderers
        assert {p.nice() for p in seen} == {19}, [(p.name(), p.nice()) for p in seen]

        nearest = "Layer 3 · 2,048 tokens · the nearest ready layer to 12"
        assert first(nearest, ["Layer 12 ·", "the nearest ready layer to 12"])
        assert not first(nearest, ["Layer 1 ·", "the nearest ready layer to 1"])  # 12 is not 1
        assert first("Layer 12 · 2,048 tokens", ["Layer 12 ·", "the nearest ready layer to 12"])
        assert not first("Layer 12 · 2,048 tokens", ["Layer 12 ·"], stale=True)  # a chart left from the last run
        assert not first("Layer 12 · 2,048 tokens", ["Layer 12 ·"], heading="Foci")
        assert first("Roles over 335 sentences", [])  # a page opened: any chart drawn for it
        assert not first("Roles over 335 sentences", [], stale=True)  # the page still running
        assert first("Roles over 335 sentences", [], heading="Head roles", shown="Head roles")
        head = HEADINGS["Head"]  # the Head page's heading is the head it shows
        assert not first("Roles over 335 sentences", [], heading=head, shown="Head roles")  # not the Head page yet
        assert first("L18 H6 on your sentence", [], heading=head, shown="L18 H6 · SmolLM2-135M-Instruct")
        assert not first("Roles over 335 sentences", [], heading="Head", shown="Head roles")

    _low_priority_browser(check)
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in seen)


def test_the_report_gives_each_kind_its_first_answer_and_its_done():
    report = LoadReport(2, 60)
    for done, first in ((40.0, 4.0), (20.0, 2.0), (10.0, 10.0)):
        report.record("layer switch", done, first)
    report.record("Foci", 3.0, 5.0)  # a first answer after done is done
    assert report.percentile(50, "layer switch", first=True) == 4.0
    assert report.percentile(100, "layer switch") == 40.0
    assert report.percentile(100, "Foci", first=True) == 3.0
    assert report.by_kind() == ("Foci first answer p50 3.00 s max 3.00 s; done p50 3.00 s p95 3.00 s max 3.00 s (1); "
                                "layer switch first answer p50 4.00 s max 10.00 s; done p50 20.00 s p95 40.00 s "
                                "max 40.00 s (3)")
