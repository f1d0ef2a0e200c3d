"""The Head and Atlas pages in Chromium at 1024 and 1600 px: every label inside its chart, and a click on a point of
the atlas, or on a cell of the Head roles grid, opening that head's card."""
from contextlib import contextmanager
from urllib.parse import urlencode

import pytest

from harness.browser import FIRST_FORM, assert_readable, click_until, shot

# the pixel centre of the atlas point of (layer, head) in the ``plot``-th chart
POINT = """([plot, layer, head]) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[plot];
  for (const t of gd._fullData) {
    if (!t.customdata) continue;
    const i = [...t.customdata].findIndex(c => c[0] === layer && c[1] === head);
    if (i < 0) continue;
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
    return {x: box.left + xa._offset + xa.l2p(t.x[i]), y: box.top + ya._offset + ya.l2p(t.y[i])};
  }
}"""
CELL = """([plot, layer, head]) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[plot];
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  return {x: box.left + xa._offset + xa.l2p(head), y: box.top + ya._offset + ya.l2p(layer)};
}"""


@contextmanager
def opened(browser, server, path: str, params: dict, width: int):
    context = browser.new_context(viewport={"width": width, "height": 1100})
    page = context.new_page()
    try:
        page.goto(f"{server}/{path}?" + urlencode({"model": "minilm", **params}))
        yield page
    finally:
        context.close()


def settled(page, plots: int) -> None:
    page.wait_for_function("n => document.querySelectorAll('.js-plotly-plot .main-svg').length >= n", arg=plots,
                           timeout=300_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')"
                           f" && !({FIRST_FORM})()", timeout=300_000)  # nor a first form whose full one comes later


def card_opens(page, name: str) -> None:
    """Wait for the card of head ``name`` ("L4 H2"): its title and its link; a page that never shows it fails
    saying what it shows instead."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("t => [...document.querySelectorAll('h1')].some(h => h.textContent.startsWith(t))",
                               arg=f"{name} · ", timeout=300_000)
        page.wait_for_function("s => location.pathname.endsWith('/head') && location.search.includes(s)",
                               arg=f"head={name[1:].replace(' H', '.')}", timeout=60_000)
    except PlaywrightTimeout as err:
        raise AssertionError(f"no card of {name}: {shown(page)}") from err


def shown(page) -> str:
    """What the page shows: its link, titles, messages and running state, for a failure to say."""
    return page.evaluate("""() => JSON.stringify({
      url: location.href, h1: [...document.querySelectorAll('h1')].map(h => h.textContent),
      running: !!document.querySelector('[data-testid="stStatusWidgetRunningIcon"]'),
      messages: [...document.querySelectorAll('[data-testid="stAlert"], [data-testid="stException"], '
                 + '[data-testid="stSpinner"], [data-testid="stProgress"]')].map(a => a.innerText.slice(0, 300))})""")


def click_to_card(page, target_js: str, arg, name: str | None = None) -> None:
    """Click the point ``target_js(arg)`` gives (``{x, y}`` on a chart, and the head's ``name`` unless given) and wait
    for that head's card; the click is made again, the point read afresh, while the page has not left for the card
    (a chart redrawn under the pointer)."""
    clicked = click_until(page, target_js, arg, "() => location.pathname.endsWith('/head')", None)
    card_opens(page, name or clicked["name"])


@pytest.mark.parametrize("width", [1024, 1600])
def test_a_card_reads_and_an_atlas_point_opens_its_card(width, browser, server):
    with opened(browser, server, "head", {"head": "2.5"}, width) as page:
        card_opens(page, "L2 H5")
        settled(page, 3)  # the heatmap, the shaded sentence, the seed foci
        assert_readable(page, f"a card · {width} px")
        shot(page, f"card-{width}")
    with opened(browser, server, "atlas", {"atlas_x": "prev_token", "atlas_y": "cls"}, width) as page:
        settled(page, 1)
        assert_readable(page, f"the atlas · {width} px")
        shot(page, f"atlas-{width}")
        click_to_card(page, POINT, [0, 4, 2], "L4 H2")


def test_a_click_on_the_role_grid_opens_a_card(browser, server):
    with opened(browser, server, "roles", {}, 1280) as page:
        settled(page, 1)
        click_to_card(page, CELL, [0, 3, 7], "L3 H7")


def test_effects_on_the_default_encoder_reads(browser, server):
    """all-MiniLM-L6-v2's Effects: the founding pair's grids, parts and residual drawn readable, no sentence about
    decoders."""
    with opened(browser, server, "effects", {}, 1280) as page:
        settled(page, 3)
        text = page.inner_text("body")
        assert "choose a decoder" not in text.lower() and "it is an encoder" not in text
        assert "cos(e, answer)" in text or "embedding" in text.lower()
        assert_readable(page, "effects on MiniLM")
        shot(page, "effects-minilm")
