"""Why it attends here in Chromium: a click on a cell of a decoder head's heatmap on Explore opens the section for
that head, query and key (a tiny random Llama opened as a custom model), every label inside its charts."""
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from harness.browser import assert_readable, click_until, shot
from tests.test_browser_card import settled
from tests.test_llama import build

# the pixel centre of the clickable cell [head, query, key] of Explore's grid
CELL = """([head, q, k]) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[0];
  const t = gd._fullData.find(t => t.name === 'cells' && t.customdata[0][0] === head);
  const i = [...t.customdata].findIndex(c => c[1] === q && c[2] === k);
  const xa = gd._fullLayout['xaxis' + t.xaxis.slice(1)], ya = gd._fullLayout['yaxis' + t.yaxis.slice(1)];
  const box = gd.getBoundingClientRect();
  return {x: box.left + xa._offset + xa.l2p(xa.d2c(t.x[i])), y: box.top + ya._offset + ya.l2p(ya.d2c(t.y[i]))};
}"""
TITLES = "() => [...document.querySelectorAll('.js-plotly-plot .gtitle')].map(t => t.textContent)"
TITLED = """(start) => [...document.querySelectorAll('.js-plotly-plot .gtitle')]
  .some(t => t.textContent.startsWith(start))"""
SECTION = """() => [...document.querySelectorAll('h3')].some(h => h.textContent.includes('Why it attends here'))"""


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("why-browser")
    build("llama", folder)
    return str(folder)


@pytest.mark.parametrize("width", [1024, 1600])
def test_a_click_on_a_cell_asks_why_that_query_attends_to_that_key(width, browser, server, tiny_folder):
    context = browser.new_context(viewport={"width": width, "height": 1100})
    page = context.new_page()
    try:
        page.goto(f"{server}/explore?" + urlencode({"model": "custom", "custom_model": tiny_folder, "layer": "1",
                                                    "text": "Which do you like better, coffee or tea?"}))
        settled(page, 1)
        page.locator(".js-plotly-plot").nth(0).scroll_into_view_if_needed()
        click_until(page, CELL, [2, 6, 3], SECTION, None)
        page.wait_for_function("() => location.search.includes('xwhy_head=2')", timeout=60_000)
        page.wait_for_function(TITLED, arg="L1 H2: 6: ", timeout=120_000)  # the split's grid, drawn
        settled(page, 3)
        query = parse_qs(urlparse(page.url).query)
        assert query["xwhy_head"] == ["2"] and query["xwhy_query"] == ["6"]  # the key: in the URL unless the strongest
        titles = page.evaluate(TITLES)
        assert any(t.startswith("L1 H2: 6: ") and " → 3: " in t for t in titles), titles
        assert_readable(page, f"why it attends here · {width} px")
        shot(page, f"why-{width}")
    finally:
        context.close()


def test_on_the_default_encoder_a_click_on_a_cell_asks_why_and_the_key_may_follow_the_query(browser, server):
    """all-MiniLM-L6-v2 (no model in the link): a click on the cell from the first label to a later one opens the
    split of that score, a key after its query."""
    import re

    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    try:
        page.goto(f"{server}/explore?" + urlencode({"layer": "3", "head": "11",
                                                    "text": "Which do you like better, coffee or tea?"}))
        settled(page, 1)
        page.locator(".js-plotly-plot").nth(0).scroll_into_view_if_needed()
        click_until(page, CELL, [11, 0, 5], SECTION, None)
        page.wait_for_function(TITLED, arg="L3 H11: ", timeout=120_000)
        settled(page, 3)
        titles = [t for t in page.evaluate(TITLES) if t.startswith("L3 H11: ")]
        q, k = (int(x) for x in re.match(r"L3 H11: (\d+): .* → (\d+): ", titles[0]).groups())
        assert k > q, titles
        assert "choose a decoder" not in page.inner_text("body").lower()
        assert_readable(page, "why it attends here on MiniLM")
        shot(page, "why-minilm")
    finally:
        context.close()
