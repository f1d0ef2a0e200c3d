"""Every chart readable, checked by geometry in Chromium: each drawn label lies inside its chart and
no two titles overlap, on every page, for 1 to 4 picks on Compare, for a 3-token sentence and an
80-token one with a 30-character word, in windows 1024 and 1920 px wide."""
from urllib.parse import urlencode

from harness.browser import PLOT, assert_readable, settled, shot

LONG_WORD = "Pneumonoultramicroscopicsilico"  # 30 characters: one label once pieces are merged into words
LONG = (f"The {LONG_WORD} samples were sealed in glass before the long winter, and every technician in the "
        "northern laboratory wrote down the weight, colour, smell and temperature of each jar twice a day "
        "while the river froze over.")
TEXTS = {"3 tokens": ("Hi", {}), "80 tokens, a 30-character word": (LONG, {"merge_words": "true"})}
VIEWS = [("", {}), ("explore", {}), ("overview", {}), ("tokens", {}), ("text", {}), ("roles", {}), ("layers", {}), ("foci", {})] + [
    ("compare", {"picks": str(n)}) for n in (1, 2, 3, 4)]

WIDTHS = (1024, 1920)
# the first chart's width, to tell that a resized window has laid the page out again
FIRST_WIDTH = "() => document.querySelector('.js-plotly-plot').getBoundingClientRect().width"


def test_every_label_inside_its_chart_and_no_titles_overlap(browser, server):
    """Each view opened once, in the narrow window, then laid out again in the wide one (as a window resized is):
    the page's run is the same at both widths, only the browser's layout differs."""
    context = browser.new_context(viewport={"width": WIDTHS[0], "height": 1200})
    page = context.new_page()
    checked = []
    try:
        for name, (text, options) in TEXTS.items():
            for path, params in VIEWS:
                query = urlencode({"text": text, **options, **params})
                page.set_viewport_size({"width": WIDTHS[0], "height": 1200})
                page.goto(f"{server}/{path}?{query}")
                page.wait_for_selector(PLOT, timeout=120_000)
                for width in WIDTHS:
                    if width != WIDTHS[0]:
                        narrow = page.evaluate(FIRST_WIDTH)
                        page.set_viewport_size({"width": width, "height": 1200})
                        page.wait_for_function(f"() => ({FIRST_WIDTH})() > {narrow}", timeout=60_000)
                    settled(page, 1)  # every chart of the page drawn
                    r = assert_readable(page, f"{path or 'home'} {params} · {name} · {width} px")
                    checked.append(r["labels"])
                    if name != "3 tokens":
                        shot(page, f"layout-{width}-{path or 'home'}{params.get('picks', '')}")
        assert len(checked) == len(TEXTS) * len(VIEWS) * len(WIDTHS)
    finally:
        context.close()


def test_explore_has_its_own_address_and_a_copied_link_reopens_the_view(page, server):
    page.goto(f"{server}/explore?layer=4&heads=2&heads=9")
    page.wait_for_selector("h1:has-text('Explore')", timeout=60_000)
    page.wait_for_function("() => { const t = document.querySelector('.js-plotly-plot .gtitle');"
                           " return t && t.textContent.startsWith('Layer 4'); }", timeout=60_000)
    assert not page.get_by_text("Page not found").count()
    subplot_titles = page.locator(".js-plotly-plot .annotation-text").all_text_contents()
    assert subplot_titles == ["Head 2", "Head 9"]
    copied = page.url
    other = page.context.new_page()
    other.goto(copied)
    other.wait_for_function("() => { const t = document.querySelector('.js-plotly-plot .gtitle');"
                            " return t && t.textContent.startsWith('Layer 4'); }", timeout=60_000)
    assert other.locator(".js-plotly-plot .annotation-text").all_text_contents() == ["Head 2", "Head 9"]
    other.close()
