"""The Train page in Chromium: it updates live while it trains, stops, and every label is readable."""
import re

from harness.browser import GEOMETRY, settled, shot


def progress_step(page) -> int:
    text = page.get_by_text(re.compile(r"^Step [\d,]+ of")).first.inner_text()
    return int(re.match(r"Step ([\d,]+)", text).group(1).replace(",", ""))


def test_training_updates_live_then_stops_and_reads_well(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = context.new_page()
    try:
        page.goto(f"{server}/train")
        page.wait_for_selector("h1:has-text('Train')", timeout=120_000)
        steps = page.get_by_label("Steps")
        steps.fill("20000")
        steps.press("Enter")
        settled(page)
        page.get_by_role("button", name="Start").click()
        page.get_by_text(re.compile(r"^Step [\d,]+ of 20,000")).first.wait_for(timeout=60_000)
        page.wait_for_function("n => document.querySelectorAll('.js-plotly-plot .main-svg').length >= n", arg=3,
                               timeout=60_000)
        first = progress_step(page)
        page.wait_for_function(f"() => [...document.querySelectorAll('p')].some(p => /^Step [\\d,]+ of/.test(p.textContent)"
                               f" && parseInt(p.textContent.slice(5).replace(/,/g, '')) > {first + 100})",
                               timeout=60_000)  # the page updated itself, no click
        page.get_by_role("button", name="Stop").click()
        page.get_by_text(re.compile(r"^Stopped after")).wait_for(timeout=60_000)
        settled(page, 1)
        r = page.evaluate(GEOMETRY)
        assert not r["outside"], f"drawn outside the chart: {r['outside'][:5]}"
        assert not r["overlaps"], f"titles overlap: {r['overlaps'][:3]}"
        assert not page.locator("[data-testid='stException']").count()
        assert page.get_by_role("button", name="Explore this model").count() == 1
        page.set_viewport_size({"width": 1400, "height": 3000})
        settled(page, 1)
        shot(page, "train-1400")
    finally:
        context.close()
