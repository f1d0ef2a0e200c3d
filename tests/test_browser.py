"""The app in a real browser: typing, every page, links, downloads, markup. Screenshots go to artifacts/."""
import io

import numpy as np

from harness.browser import PLOT, commit_text, every_kth, plot_title, settled, shot, wait_title, x_ticks

PAGES = [("Explore", "", "Layer 0 · Which do you like better"), ("Foci", "foci", "Sentence type · L3 H11"),
         ("Compare", "compare", "1: all-MiniLM-L6-v2 · L0 H0"),
         ("Overview", "overview", "All 6 layers × 12 heads · Which"), ("Tokens", "tokens", "Layer 0 · Which"),
         ("Text", "text", "Attention from “which” · L0 H0"),
         ("Head roles", "roles", "Roles over 335 sentences")]


def test_typed_sentence_reaches_every_heatmap(page, hf_model):
    text = "The old lighthouse keeper watched the storm roll in."
    commit_text(page, text)
    wait_title(page, text)
    tokens = hf_model.attend(text).tokens
    page.wait_for_function("n => document.querySelectorAll('.js-plotly-plot .xaxislayer-above').length >= n", arg=12)
    assert every_kth(x_ticks(page), tokens) and len(x_ticks(page)) >= len(tokens) // 2
    # one raster per head, once the rerun has replaced the previous sentence's chart (on a busy machine both
    # are in the page for a moment)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .heatmaplayer image').length === 12",
                           timeout=60_000)
    assert "text=The+old+lighthouse" in page.url or "text=The%20old%20lighthouse" in page.url
    shot(page, "explore-typed")


def test_every_page_in_the_browser(page):
    for name, path, title in PAGES:
        page.get_by_role("link", name=name, exact=True).click()
        page.wait_for_url(f"**/{path}*")
        page.wait_for_selector(f"h1:has-text('{name}')")
        page.wait_for_selector(PLOT, timeout=60_000)
        wait_title(page, title)
        assert not page.locator("[data-testid='stException']").count()
        shot(page, f"page-{name.lower()}")


def test_link_reproduces_a_view_and_state_survives_page_switches(page, server):
    page.goto(server + "/tokens?layer=2&query=7")
    page.wait_for_selector(PLOT, timeout=60_000)
    wait_title(page, "Layer 2")
    page.get_by_role("link", name="Text", exact=True).click()
    wait_title(page, "from “coffee” · L2 H")
    page.wait_for_url("**/text?*layer=2*")
    assert "query=7" in page.url


def test_overview_is_one_image(page, server):
    page.goto(server + "/overview")
    page.wait_for_selector(".js-plotly-plot .layer-above image, .js-plotly-plot image", timeout=60_000)
    wait_title(page, "All 6 layers × 12 heads")
    thumbnails = page.locator(".js-plotly-plot").first  # the reach grid below is a chart of its own
    assert thumbnails.locator(".heatmaplayer image").count() == 0 and thumbnails.locator("image").count() == 1
    shot(page, "overview")


def test_clicking_a_thumbnail_opens_that_head(page, server):
    page.goto(server + "/overview")
    wait_title(page, "All 6 layers × 12 heads")
    box = page.locator(".js-plotly-plot .nsewdrag").first.bounding_box()
    (left, right), (bottom, top) = page.evaluate(
        "() => { const l = document.querySelector('.js-plotly-plot')._fullLayout; return [l.xaxis.range, l.yaxis.range]; }")
    pitch = (right - left) / 12  # the thumbnails tile the x range evenly; y runs downwards from layer 0

    def to_px(x, y):
        return (box["x"] + (x - left) / (right - left) * box["width"],
                box["y"] + (y - top) / (bottom - top) * box["height"])

    page.mouse.click(*to_px(left + 5.5 * pitch, top + 3.5 * pitch))  # layer 3, head 5
    page.wait_for_selector("h1:has-text('Explore')", timeout=30_000)
    wait_title(page, "Layer 3 ·")
    page.wait_for_url("**/?*layer=3*")
    assert "head=5" in page.url
    shot(page, "overview-click")


def test_markup_in_text_shows_as_text(page, hf_model):
    text = '<img src=x onerror=alert(1)> <script>alert(2)</script> & "quotes"'
    commit_text(page, text)
    wait_title(page, "<img")
    assert "<img src=x onerror=alert(1)>" in plot_title(page)
    assert page.locator("img[src='x']").count() == 0
    ticks = x_ticks(page)
    tokens = hf_model.attend(text).tokens  # 33 tokens: plotly labels as many as fit under a cell
    assert every_kth(ticks, tokens)
    assert "<" in ticks and ">" in ticks and "script" in ticks
    settled(page, 1)
    assert not page.dialogs
    shot(page, "markup")


def test_download_npz_holds_the_attention(page, hf_model):
    with page.expect_download() as info:
        page.get_by_role("button", name="Attention · NPZ").click()
    data = np.load(io.BytesIO(open(info.value.path(), "rb").read()))
    ref = hf_model.attend("Which do you like better, coffee or tea?")
    assert data["tokens"].tolist() == ref.tokens
    np.testing.assert_allclose(data["weights"], ref.weights, atol=1e-6)


def test_server_side_png_and_svg(page):
    page.get_by_role("button", name="PNG and SVG…").click()
    page.get_by_role("button", name="Download SVG").wait_for(timeout=60_000)
    with page.expect_download() as info:
        page.get_by_role("button", name="Download SVG").click()
    svg = open(info.value.path(), encoding="utf-8").read()
    assert svg.startswith("<svg") and "coffee" in svg and "Layer 0" in svg
    with page.expect_download() as info:
        page.get_by_role("button", name="Download PNG").click()
    assert open(info.value.path(), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_foci_shades_coffee_and_tea_darkest_under_object(page, server):
    """Read off the screen: the colour of each cell of the seed sentence in the "Object" chart."""
    from PIL import Image

    page.goto(server + "/foci")
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4", timeout=120_000)
    plot = page.locator(".js-plotly-plot").nth(1)
    plot.scroll_into_view_if_needed()
    assert page.evaluate("el => el.querySelector('.gtitle').textContent", plot.element_handle()).startswith("Object")
    box = plot.bounding_box()
    cells = page.evaluate(
        "el => Array.from(el.querySelectorAll('.heatmaplayer text')).map(t => { const r = t.getBoundingClientRect();"
        " return [t.textContent, (r.left + r.right) / 2, r.top]; })", plot.element_handle())
    assert [c[0] for c in cells] == ["which", "do", "you", "like", "better", ",", "coffee", "or", "tea", "?"]
    image = Image.open(io.BytesIO(plot.screenshot())).convert("L")  # grey level: 0 black, 255 white
    # a point of the cell's own colour: above its label, inside the cell
    grey = {text: image.getpixel((int(x - box["x"]), int(top - box["y"]) - 5)) for text, x, top in cells}
    darkest = sorted(grey, key=grey.get)[:2]
    assert set(darkest) == {"coffee", "tea"}, grey
    assert max(grey["coffee"], grey["tea"]) < min(v for k, v in grey.items() if k not in darkest) - 30
    shot(page, "foci")


SECTIONS = {"Looking at attention": ["Explore", "Compare", "Overview", "Tokens", "Text", "Across layers"],
            "What heads are": ["Foci", "Head roles", "Head", "Atlas", "Queries & keys"],
            "What they cause": ["Effects", "Circuits", "Pruning"], "Making models": ["Generate", "Train"]}


def test_a_newcomer_finds_the_sections_and_reaches_the_object_heads_card_in_one_click(page, server):
    nav = page.locator("[data-testid='stSidebarNav']")
    for section, pages in SECTIONS.items():
        assert nav.get_by_text(section, exact=True).count() == 1, section
        # each page's link below its section's heading, in the table's order
        order = nav.evaluate("(nav, names) => names.map(n => [...nav.querySelectorAll('a')].findIndex("
                             "a => a.innerText.trim().split('\\n').pop().trim() === n))", pages)
        assert -1 not in order and order == sorted(order), (section, order)
    question = page.locator("[data-testid='stMain'] [data-testid='stCaptionContainer']").first.inner_text()
    assert question.endswith("?") and "head" in question  # the page's first line: the question it answers
    page.get_by_text("Start with one head", exact=False).first.click()  # the one click
    page.wait_for_selector("h1:has-text('· all-MiniLM-L6-v2')", timeout=120_000)
    card = page.locator("[data-testid='stMain'] h1").first.inner_text().split(" · ")[0]
    page.wait_for_selector("text=Role: object focus", timeout=120_000)
    assert "/head" in page.url
    shot(page, "home-to-card")
    # the same head the Foci page names as the objects' head
    page.goto(server + "/foci")
    page.wait_for_selector(PLOT, timeout=120_000)
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                           ".some(t => t.textContent.startsWith('Object'))", timeout=120_000)
    titles = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot .gtitle')].map(t => t.textContent)")
    objects = next(t for t in titles if t.startswith("Object"))
    assert objects.endswith(card), (objects, card)


def test_the_server_loads_the_default_model_as_it_starts(server):
    from harness.browser import preloaded

    report = preloaded(server, until="prepared")  # and the encoder's first results computed
    assert report["models"] == report["done"] == ["minilm"] and report["error"] is None
