"""The Pruning page in Chromium: every label readable at 1024 and 1920 px, the grid's grey cells are the
pruned heads, and the pruned model downloads and opens."""
import zipfile
from urllib.parse import urlencode

import numpy as np
import pytest

from models import load_model
from harness.browser import GEOMETRY, settled, shot
from tests.test_app_pruning import SENTENCES

LINK = {"prune_on": "sidebar", "text": "\n".join(SENTENCES)}


def open_pruning(page, server, **params):
    page.goto(f"{server}/pruning?{urlencode({**LINK, **params})}")
    page.wait_for_selector("h1:has-text('Pruning')", timeout=120_000)
    page.get_by_text("Heads to switch off together").wait_for(timeout=300_000)
    settled(page, 3)


def cell_texts(page, chart: int) -> list[str]:
    return page.locator(".js-plotly-plot").nth(chart).locator(".heatmaplayer text").all_text_contents()


@pytest.mark.parametrize("width", [1024, 1920])
def test_pruning_page_is_readable(width, browser, server):
    context = browser.new_context(viewport={"width": width, "height": 1200})
    page = context.new_page()
    try:
        open_pruning(page, server, prune_to=14)
        r = page.evaluate(GEOMETRY)
        assert r["labels"] > 100 and r["titles"] >= 6  # three charts, three subplot titles
        assert not r["outside"], f"drawn outside the chart: {r['outside'][:5]}"
        assert not r["overlaps"], f"titles overlap: {r['overlaps'][:3]}"
        assert not page.locator("[data-testid='stException']").count()
        texts = cell_texts(page, 0)
        assert texts.count("✕") == 14
        assert sum(t.startswith("0.") for t in texts) >= 72 - 14  # every other head shows its importance
        shot(page, f"pruning-{width}")
    finally:
        context.close()


def test_the_pruned_model_downloads_and_opens(page, server, scratch_model, tmp_path):
    open_pruning(page, server, prune_to=22)
    with page.expect_download() as info:
        page.get_by_role("button", name="Pruned model · ZIP").click()
    path = tmp_path / "pruned.zip"
    info.value.save_as(path)
    with zipfile.ZipFile(path) as z:
        z.extractall(tmp_path)
    opened = load_model(tmp_path / "headlens-pruned", backend="scratch")
    assert opened.pruned_heads.sum() == 22
    heads = [tuple(map(int, x)) for x in zip(*np.nonzero(opened.pruned_heads))]
    means = scratch_model.head_means(SENTENCES)
    np.testing.assert_allclose(opened.embed(SENTENCES), scratch_model.pruned(heads, head_means=means).embed(SENTENCES),
                               atol=1e-5)
    grey = [i for i, t in enumerate(cell_texts(page, 0)) if t == "✕"]
    assert len(grey) == 22
