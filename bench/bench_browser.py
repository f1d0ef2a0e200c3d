"""The app in a real browser: from committing a sentence to its figures on screen.

    python -m bench.bench_browser [--repeat 5]

Starts ``streamlit run app.py`` on a free loopback port and drives Debian's Chromium with
Playwright. Each timing runs from the Ctrl+Enter that commits new text to the moment the page
shows it: every heatmap's tick labels are the new tokens (Explore), or the overview image carries
the new title (Overview). Every text is new, so no cached result helps. Bytes are the WebSocket
frames the page received in that time.
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench.common import machine
from models import load_model
from tests.browser import PLOT, chromium, streamlit_server
from viz.figures import GRID_LABELS, tick_step

WORDS = ("river stone quietly carried seven small boats past the old mill while children watched from a "
         "bridge and their parents talked about harvest weather markets songs lanterns festivals and winter").split()

# The chart the page shows is the one with the new title; plotly appends the previous figure's
# axis layers after the new ones until it cleans them up, so the first 12 are the visible ones.
ALL_TICKS_ARE = """tokens => {
  const axes = Array.from(document.querySelectorAll('.js-plotly-plot .xaxislayer-above')).slice(0, 12);
  if (axes.length < 12) return false;
  for (const ax of axes) {
    // plotly names each axis's tick groups after it: xtick, x2tick, x3tick...
    const ticks = Array.from(ax.querySelectorAll('g[class^="x"][class$="tick"] text')).map(t => t.textContent);
    if (ticks.length !== tokens.length || ticks.some((t, i) => t !== tokens[i])) return false;
  }
  return true;
}"""

# plotly draws a figure's title and its rasters (overview image, heatmaps) in one render
TITLE_HAS = """p => { const t = document.querySelector('.js-plotly-plot .gtitle');
  return t && t.textContent.includes(p) && document.querySelector('.js-plotly-plot image') !== null; }"""


def sentence(tokenizer, n_tokens: int, seed: int) -> str:
    """A new sentence of exactly ``n_tokens`` tokens, [CLS] and [SEP] included."""
    words = [WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n_tokens)]
    for k in range(n_tokens, 0, -1):  # drop words until the text fits
        text = f"{seed} " + " ".join(words[:k])
        length = len(tokenizer(text)["input_ids"])
        if length == n_tokens:
            return text
        if length < n_tokens:
            break
    raise ValueError("no sentence of that length")


class Frames:
    """Counts the bytes of WebSocket frames the page receives."""

    def __init__(self, page):
        self.received = 0
        page.on("websocket", lambda ws: ws.on("framereceived", self._add))

    def _add(self, payload):
        self.received += len(payload)


def timed_commit(page, frames: Frames, text: str, wait_js: str, arg) -> tuple[float, int]:
    box = page.get_by_role("textbox", name="Sentences, one per line")
    box.click()
    box.press("Control+a")
    box.fill(text)
    before = frames.received
    start = time.perf_counter()
    box.press("Control+Enter")
    page.wait_for_function(wait_js, arg=arg, timeout=120_000, polling=10)
    return time.perf_counter() - start, frames.received - before


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    model = load_model()
    tok = model.tokenizer
    rows = []
    with streamlit_server() as (url, _), chromium() as browser:
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        frames = Frames(page)
        page.goto(url + "/")
        page.wait_for_selector(PLOT, timeout=120_000)

        def measure(label, path, n_tokens, wait_js, arg_of, target=None):
            page.goto(url + path)
            page.wait_for_selector(PLOT, timeout=120_000)
            times, sizes = [], []
            for i in range(args.repeat):
                text = sentence(tok, n_tokens, seed=len(rows) * 100 + i)
                t, b = timed_commit(page, frames, text, wait_js, arg_of(text))
                times.append(t)
                sizes.append(b)
            rows.append((label, statistics.median(times), max(times), statistics.median(sizes), target))

        shown = lambda t: model.attend(t).tokens[::tick_step(32, GRID_LABELS)]  # noqa: E731 - labels drawn
        measure("Explore, 12 heatmaps, 32 tokens", "/", 32, ALL_TICKS_ARE, shown, 1.0)
        measure("Overview, 72 heads, 32 tokens", "/overview", 32, TITLE_HAS, lambda t: t[:40], 1.5)
        measure("Overview, 72 heads, 512 tokens", "/overview", 512, TITLE_HAS, lambda t: t[:40], 5.0)
        # beyond 64 tokens the axes carry no tick labels: wait for the new title on the redrawn figure
        measure("Explore, 12 heatmaps, 512 tokens", "/", 512, TITLE_HAS, lambda t: t[:40])
    print(f"Commit to figures on screen, Chromium {machine()}, median of {args.repeat} new texts")
    print(f"{'view':<36} {'median s':>8} {'worst s':>8} {'sent MB':>8} {'target s':>8}")
    for label, med, worst, size, target in rows:
        print(f"{label:<36} {med:8.2f} {worst:8.2f} {size / 1e6:8.2f} {'' if target is None else f'{target:8.1f}'}")


if __name__ == "__main__":
    main()
