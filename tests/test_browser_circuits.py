"""The Circuits page on SmolLM2 in Chromium at 1024 and 1600 px: every label inside its chart, and a click on a
head of the circuit opening that head's card."""
from urllib.parse import urlencode

import pytest

from harness.browser import assert_readable, shot, wait_title
from tests.test_browser_card import click_to_card, settled

# the pixel centre and name of the first head node of the circuit (the trace "head") in the ``plot``-th chart
NODE = """(plot) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[plot];
  const t = gd._fullData.find(t => t.name === 'head');
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  const i = t.x.length - 1;
  return {x: box.left + xa._offset + xa.l2p(t.x[i]), y: box.top + ya._offset + ya.l2p(t.y[i]),
          name: `L${t.customdata[i][0]} H${t.customdata[i][1]}`};
}"""


@pytest.mark.parametrize("width", [1024, 1600])
def test_the_circuit_reads_and_a_click_on_a_head_opens_its_card(width, browser, server):
    context = browser.new_context(viewport={"width": width, "height": 1100})
    page = context.new_page()
    try:
        page.goto(f"{server}/circuits?" + urlencode({"model": "smollm2_scratch", "task_pairs": "10",
                                                     "circuit_edges": "30"}))
        settled(page, 2)  # the circuit and its faithfulness curve
        wait_title(page, "over 10 pairs", timeout=300_000)  # the full circuit, not the first form's over fewer pairs
        page.wait_for_function("() => [...document.querySelectorAll('h3')].some(h => h.textContent.includes("
                               "'What its heads are'))", timeout=300_000)
        settled(page, 2)
        assert_readable(page, f"circuits · {width} px")
        shot(page, f"circuits-{width}")
        click_to_card(page, NODE, 0)
    finally:
        context.close()


def test_the_default_encoders_circuit_reads(browser, server):
    """all-MiniLM-L6-v2 (no model in the link): its objects task's circuit and curve, ending in the embedding."""
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    try:
        page.goto(f"{server}/circuits?" + urlencode({"task_pairs": "10", "circuit_edges": "30"}))
        settled(page, 2)
        page.wait_for_function("() => [...document.querySelectorAll('h3')].some(h => h.textContent.includes("
                               "'Path patching'))", timeout=300_000)
        settled(page, 2)
        text = page.inner_text("body")
        assert "choose a decoder" not in text.lower() and "it is an encoder" not in text
        assert page.evaluate("() => document.querySelectorAll('.js-plotly-plot')[0]._fullData"
                             ".some(t => (t.text || []).includes('embedding'))")
        assert_readable(page, "circuits on MiniLM")
        shot(page, "circuits-minilm")
    finally:
        context.close()
