"""The Queries & keys page in Chromium: labels inside their charts, a click on a head's thumbnail draws that head,
a click on a point draws its sentence with its row framed."""
import pytest

from harness.browser import PLOT, assert_readable, shot, wait_title

# The most isolated query point of the scatter (the second chart), other than ``skip``, in page pixels.
ISOLATED = """skip => {
  const gd = document.querySelectorAll('.js-plotly-plot')[1];
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  const pts = [];
  gd._fullData.forEach(t => { if (t.name === 'picked') return; for (let i = 0; i < t.x.length; i++)
    pts.push({query: t.name === 'queries', pos: Number(t.customdata[i][2]),
              x: box.left + xa._offset + xa.l2p(t.x[i]), y: box.top + ya._offset + ya.l2p(t.y[i])}); });
  let best = null, room = -1;
  for (const p of pts) {
    if (!p.query || p.pos === skip) continue;
    const gap = Math.min(...pts.filter(o => o !== p).map(o => Math.hypot(o.x - p.x, o.y - p.y)));
    if (gap > room) { room = gap; best = p; }
  }
  return {...best, room};
}"""


@pytest.fixture
def qk_page(browser, server):
    context = browser.new_context(viewport={"width": 1500, "height": 1300})
    page = context.new_page()
    page.goto(f"{server}/queries_keys?qk_corpus=sidebar")
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3",
                           timeout=180_000)
    # the pictures are drawn a layer at a time while they are computed: wait for the run that drew them all
    page.wait_for_selector("[data-testid='stStatusWidgetRunningIcon']", state="detached", timeout=180_000)
    yield page
    context.close()


def test_labels_are_readable_and_a_thumbnail_opens_its_head(qk_page):
    page = qk_page
    assert_readable(page, "queries & keys")
    grid = page.locator(".js-plotly-plot").first
    box = grid.locator(".nsewdrag").first.bounding_box()
    (left, right), (bottom, top) = page.evaluate(
        "() => { const l = document.querySelector('.js-plotly-plot')._fullLayout; return [l.xaxis.range, l.yaxis.range]; }")
    pitch = (right - left) / 12
    x = box["x"] + 5.5 * pitch / (right - left) * box["width"]
    y = box["y"] + 2.5 * pitch / (bottom - top) * box["height"]
    page.mouse.click(x, y)  # layer 2, head 5
    page.wait_for_url(lambda url: "qk_layer=2" in url and "qk_head=5" in url, timeout=60_000)
    wait_title(page, "L2 H5", plot=1)
    shot(page, "queries-keys-head")


def test_clicking_a_point_draws_its_sentence_with_its_row_framed(qk_page):
    page = qk_page
    page.locator(".js-plotly-plot").nth(1).scroll_into_view_if_needed()
    target = page.evaluate(ISOLATED, 1)  # position 1 is the query framed at first
    assert target["room"] > 6, target
    page.mouse.click(target["x"], target["y"])
    page.wait_for_url(f"**/queries_keys?*qk_query={target['pos']}*", timeout=60_000)
    caption = page.locator("[data-testid='stCaptionContainer']", has_text=f"Query {target['pos']} “")
    caption.first.wait_for(timeout=60_000)
    page.wait_for_function(  # the heatmap's red frame on the clicked query's row
        "y => { const gd = document.querySelectorAll('.js-plotly-plot')[2];"
        " const s = gd && gd._fullLayout && gd._fullLayout.shapes; return s && s.length && s[0].y0 === y; }",
        arg=target["pos"] - 0.5, timeout=60_000)
    assert page.locator(PLOT).count() >= 3
    shot(page, "queries-keys-point")
