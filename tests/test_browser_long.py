"""A 2,048-token prompt on SmolLM2 in Chromium: Explore's pooled heads with every label inside its chart,
and a click on a head's heatmap that zooms there, weight by weight."""
from urllib.parse import quote

import pytest

from models import load_model
from harness.browser import assert_readable, shot
from harness.texts import prompt
from tests.test_app_long import NAME

# The pixel centre of the ``index``-th click target over head ``head``'s heatmap, and its customdata.
TARGET = """([head, index]) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[0];
  const trace = gd._fullData.find(t => t.name === 'zoom ' + head);
  const xa = gd._fullLayout[trace.xaxis.replace('x', 'xaxis')], ya = gd._fullLayout[trace.yaxis.replace('y', 'yaxis')];
  const box = gd.getBoundingClientRect();
  return {x: box.left + xa._offset + xa.c2p(xa.d2c(trace.x[index])),
          y: box.top + ya._offset + ya.c2p(ya.d2c(trace.y[index])), custom: trace.customdata[index]};
}"""
PLOTS = "n => document.querySelectorAll('.js-plotly-plot .main-svg').length >= n"


@pytest.fixture(scope="module")
def text():
    return prompt(load_model(NAME, backend="transformers").tokenizer, 2048, seed=1)


def test_explore_at_2048_tokens_reads_and_zooms_on_a_click(browser, server, text):
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = context.new_page()
    try:
        page.goto(f"{server}/?model=smollm2_scratch&layer=3&text={quote(text)}")
        page.wait_for_function(PLOTS, arg=2, timeout=300_000)
        # the nearest ready layer comes first, titled so; layer 3 replaces it once the prompt has run up to it
        page.wait_for_function("() => { const e = document.querySelector('.js-plotly-plot .gtitle'), t = e ? e.textContent : '';"
                               " return t.includes('Layer 3 · 2,048 tokens') && !t.includes('nearest'); }",
                               timeout=300_000)
        assert_readable(page, "explore, 2,048 tokens")
        shot(page, "explore-long")
        page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
        target = page.evaluate(TARGET, [2, 40])
        head, q, k = target["custom"]
        assert head == 2
        page.mouse.click(target["x"], target["y"])
        start_q, start_k = q, k  # a click target stands for 2,048 / 16 = 128 tokens a side: the zoom's size
        page.wait_for_function("s => location.search.includes(s)", arg=f"zoom_k={start_k}", timeout=120_000)
        assert f"zoom_q={start_q}&" in page.url and "zoom_head=2" in page.url
        page.wait_for_function(
            "s => { const t = document.querySelectorAll('.js-plotly-plot')[1].querySelector('.gtitle');"
            " return t && t.textContent.includes(s); }", arg=f"queries {start_q}–{start_q + 127}", timeout=120_000)
        assert_readable(page, "explore, 2,048 tokens, zoomed")
        shot(page, "explore-long-zoom")
    finally:
        context.close()
