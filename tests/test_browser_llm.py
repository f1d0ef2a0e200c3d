"""SmolLM2 in Chromium: on every page that draws attention, each label inside its chart and no titles
overlapping; on Explore, the cells a causal query cannot see painted grey and the cells it can see
painted by their weight, read back from the screenshot's pixels."""
import io
from contextlib import contextmanager
from urllib.parse import urlencode

import numpy as np
import pytest

from harness.browser import PLOT, assert_readable, click_until, shot
from viz.figures import HIDDEN_COLOR

TEXT = "Which do you like better, coffee or tea?"
PAGES = ["", "overview", "compare", "tokens", "text", "layers", "foci", "roles"]

# The first heatmap's cell centres in page pixels, from plotly's own axes: rows are queries (top down)
CELLS = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  const nx = xa._categories.length, ny = ya._categories.length;
  const cx = i => box.left + xa._offset + (i + 0.5) * xa._length / nx;
  const cy = j => box.top + ya._offset + (j + 0.5) * ya._length / ny;
  return {n: nx, m: ny, xs: [...Array(nx).keys()].map(cx), ys: [...Array(ny).keys()].map(cy)};
}"""


@contextmanager
def opened(browser, server, path: str, params: dict, width: int = 1280, height: int = 1100):
    """A new browser session on ``path`` with SmolLM2 and ``params`` in the link."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        page.goto(f"{server}/{path}?" + urlencode({"model": "smollm2_scratch", **params}))
        yield page
    finally:
        context.close()


def rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])


@pytest.mark.parametrize("width,model,sizes", [(1024, "smollm2_scratch", "30 layers × 9 heads"),
                                                (1600, "smollm2_scratch", "30 layers × 9 heads"),
                                                (1024, "gemma3", "18 layers × 4 heads")])
def test_llm_pages_are_readable(width, model, sizes, browser, server):
    context = browser.new_context(viewport={"width": width, "height": 1200})
    page = context.new_page()
    try:
        for path in PAGES + (["effects"] if model == "gemma3" else []):
            page.goto(f"{server}/{path}?" + urlencode({"model": model, "text": TEXT, "corpus": "sidebar"}))
            page.wait_for_selector(PLOT, timeout=300_000)
            page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')",
                                   timeout=300_000)
            where = f"{model} · {path or 'explore'} · {width} px"
            assert_readable(page, where)
            assert sizes in page.inner_text("[data-testid='stSidebar']"), where
            shot(page, f"llm-{model}-{width}-{path or 'explore'}")
    finally:
        context.close()


def test_the_causal_triangle_is_grey_and_the_rest_is_weight(browser, server):
    from PIL import Image

    with opened(browser, server, "", {"text": TEXT, "layer": "20"}, width=1400) as page:
        page.wait_for_selector(PLOT, timeout=180_000)
        page.wait_for_selector(".js-plotly-plot .heatmaplayer image", state="attached", timeout=60_000)
        cells = page.evaluate(CELLS)
        n = cells["n"]
        assert n == cells["m"] == 10
        pixels = np.asarray(Image.open(io.BytesIO(page.screenshot())).convert("RGB")).astype(int)
        scale = pixels.shape[1] / 1400

        def colour(q: int, k: int) -> np.ndarray:
            return pixels[int(cells["ys"][q] * scale), int(cells["xs"][k] * scale)]

        shot(page, "llm-causal-triangle")
        grey = rgb(HIDDEN_COLOR)
        hidden = [(q, k) for q in range(n) for k in range(q + 1, n)]
        seen = [(q, k) for q in range(n) for k in range(q + 1)]
        assert all(np.abs(colour(q, k) - grey).max() <= 3 for q, k in hidden)
        # a visible cell is drawn from the Blues scale: white to blue, never this grey
        assert all(np.abs(colour(q, k) - grey).max() > 3 for q, k in seen)
        assert (colour(9, 0)[2] > colour(9, 0)[0])  # the sink: the strongest weight of the last row, blue


def test_generate_streams_a_continuation_and_every_label_stays_readable(browser, server):
    with opened(browser, server, "generate", {"text": "The capital of France is"}) as page:
        page.get_by_role("button", name="Continue").click(timeout=180_000)
        page.wait_for_selector(PLOT, timeout=180_000)  # the shading of what the first generated token looked at
        code = page.locator("[data-testid='stCode']").first.inner_text()
        assert code.strip().startswith("Paris")
        assert_readable(page, "generate")
        shot(page, "llm-generate")
        page.get_by_role("link", name="Explore", exact=True).click()
        page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot .ytick text')]"
                               ".some(t => t.textContent.startsWith('▸'))", timeout=120_000)
        assert_readable(page, "explore with a continuation")
        shot(page, "llm-generate-explore")


def test_head_roles_show_the_decoder_heads_readably(browser, server):
    with opened(browser, server, "roles", {"corpus": "sidebar"}) as page:
        page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                               ".some(t => t.textContent.includes('repeated twice'))", timeout=300_000)
        assert_readable(page, "roles with the decoder heads")
        grids = page.evaluate(GRID_RANGES)
        assert len(grids) >= 2, grids  # the roles grid and the decoder heads' grid
        for grid in grids:  # each drawn to its cells' edges: SmolLM2's 30 layers padded no row past them
            layers, heads = grid["layers"], grid["heads"]
            assert (layers, heads) == (30, 9), grid
            assert np.allclose(grid["y"], [layers - 0.5, -0.5]) and np.allclose(grid["x"], [-0.5, heads - 0.5]), grid
        shot(page, "llm-roles-detector")


# Every layer x head grid's drawn ranges and its cells (its "heads" trace's extent), as the browser's plotly laid
# them out
GRID_RANGES = """() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => {
  const trace = (gd._fullData || []).find(t => t.name === 'heads');
  if (!trace) return null;
  return {x: gd._fullLayout.xaxis.range, y: gd._fullLayout.yaxis.range,
          layers: Math.max(...trace.y) + 1, heads: Math.max(...trace.x) + 1};
}).filter(g => g)"""


# The pixel centre of head (layer, head)'s click target in the ``plot``-th chart
HEAD_TARGET = """([plot, layer, head]) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[plot];
  const trace = gd._fullData.find(t => t.name === 'heads');
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  return {x: box.left + xa._offset + xa.l2p(head), y: box.top + ya._offset + ya.l2p(layer)};
}"""


EDGE_TARGET = """([plot, layer, head]) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[plot];
  const trace = gd._fullData.find(t => t.name === 'edges');
  const i = trace.customdata.findIndex(c => c[0] === layer && c[1] === head);
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  return {x: box.left + xa._offset + xa.l2p(trace.x[i]), y: box.top + ya._offset + ya.l2p(trace.y[i])};
}"""


HEADING = "t => [...document.querySelectorAll('h3')].some(h => h.textContent.includes(t))"


def heading(page, text: str) -> None:
    page.wait_for_function(HEADING, arg=text, timeout=120_000)


def settled(page, plots: int) -> None:
    page.wait_for_function("n => document.querySelectorAll('.js-plotly-plot .main-svg').length >= n", arg=plots,
                           timeout=300_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')",
                           timeout=300_000)


@pytest.mark.parametrize("width", [1024, 1600])
def test_effects_reads_and_a_click_on_a_head_or_a_route_opens_it(width, browser, server):
    with opened(browser, server, "effects", {"effects_copying": "true"}, width=width) as page:
        settled(page, 10)  # grids, parts, residual, two heads and their vocabularies, copying, routes
        assert_readable(page, f"effects · {width} px")
        heading(page, "L23 H3: where it looks and what it writes")  # the head that recovers most opens first
        plot = page.locator(".js-plotly-plot").nth(1)
        plot.scroll_into_view_if_needed()
        click_until(page, HEAD_TARGET, [1, 29, 1], HEADING, "L29 H1: where it looks and what it writes")
        page.wait_for_function("s => location.search.includes(s)", arg="effects_head=29.1", timeout=60_000)
        settled(page, 10)
        routes = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].findIndex("
                               "gd => gd._fullData.some(t => t.name === 'edges'))")
        page.locator(".js-plotly-plot").nth(routes).scroll_into_view_if_needed()
        # the strongest route: Mary through L23 H0
        click_until(page, EDGE_TARGET, [routes, 23, 0], HEADING, "L23 H0: where it looks and what it writes")
        page.wait_for_function("s => location.search.includes(s)", arg="effects_head=23.0", timeout=60_000)
        settled(page, 10)
        shot(page, f"llm-effects-{width}")


@pytest.mark.parametrize("width", [1024, 1600])
def test_effects_over_a_task_reads_and_a_click_on_a_head_opens_it(width, browser, server):
    with opened(browser, server, "effects", {"effects_scope": "task", "task_pairs": "10"}, width=width) as page:
        settled(page, 5)  # the two grids, the residual stream by role, the head's strip and its role attention
        assert_readable(page, f"effects over a task · {width} px")
        heading(page, "L23 H3 over the task")  # the head of largest mean effect opens first
        page.locator(".js-plotly-plot").nth(0).scroll_into_view_if_needed()
        click_until(page, HEAD_TARGET, [0, 29, 1], HEADING, "L29 H1 over the task")
        page.wait_for_function("s => location.search.includes(s)", arg="task_head=29.1", timeout=60_000)
        settled(page, 5)
        shot(page, f"llm-effects-task-{width}")
