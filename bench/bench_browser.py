"""The app in a real browser: from committing a sentence to its figures on screen.

    python -m bench.bench_browser [--repeat 5]

Starts ``streamlit run app.py`` on a free loopback port and drives Debian's Chromium with
Playwright. Each timing runs from the Ctrl+Enter that commits new text to the moment every chart
of the page is drawn with it (Compare: the four picks and their difference). Every text is new, so
no cached result helps. Bytes are the WebSocket frames the page received in that time.

    python -m bench.bench_browser --long [--repeat 5]

SmolLM2 prompts of 2,048 and 4,096 tokens in Explore instead (``long_prompts``).
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench.common import machine
from models import load_model
from harness.browser import PLOT, chromium, streamlit_server

WORDS = ("river stone quietly carried seven small boats past the old mill while children watched from a "
         "bridge and their parents talked about harvest weather markets songs lanterns festivals and winter").split()

# Before a commit every chart's data is marked; plotly replaces a chart's data when it draws a new
# figure, and draws it in the same task, so a chart without the mark shows the new text.
MARK = "() => document.querySelectorAll('.js-plotly-plot').forEach(p => { if (p.data) p.data.seen = true; })"
ALL_NEW = """n => { const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
  return plots.length >= n && plots.every(p => p.data && !p.data.seen && p.querySelector('.main-svg')); }"""


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


def timed_commit(page, frames: Frames, text: str, n_charts: int) -> tuple[float, int]:
    """Seconds from Ctrl+Enter to ``n_charts`` charts drawn anew, and bytes received meanwhile."""
    box = page.get_by_role("textbox", name="Sentences, one per line")
    box.click()
    box.press("Control+a")
    box.fill(text)
    page.evaluate(MARK)
    before = frames.received
    start = time.perf_counter()
    box.press("Control+Enter")
    page.wait_for_function(ALL_NEW, arg=n_charts, timeout=120_000, polling=10)
    return time.perf_counter() - start, frames.received - before


def long_prompts(repeat: int) -> None:
    """SmolLM2 prompts of 2,048 and 4,096 tokens in Explore, from Ctrl+Enter to the layer's heatmaps and its zoom
    drawn, against transformers' SDPA forward pass over the same prompt timed in this process between commits;
    the server's resident memory above what it held with the model loaded, sampled every 50 ms."""
    import threading

    import torch
    import transformers

    from bench.bench_long import NAME, prompt
    from models.gguf import bundled_file, gguf_folder

    scratch = load_model(NAME, backend="scratch")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(gguf_folder(bundled_file(NAME)), attn_implementation="sdpa",
                                                               dtype=torch.float32).eval()
    rows = []
    with streamlit_server() as (url, proc), chromium() as browser:
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        frames = Frames(page)

        def rss(pid=proc.pid) -> int:
            with open(f"/proc/{pid}/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

        peak, stop = [0], threading.Event()

        def watch():
            while not stop.wait(0.05):
                peak[0] = max(peak[0], rss())

        for n, layer in ((2048, 29), (4096, 0), (4096, 15), (4096, 29)):
            page.goto(f"{url}/?model=smollm2_scratch&layer={layer}")
            page.wait_for_selector(PLOT, timeout=300_000)
            base = rss()
            peak[0] = base
            stop.clear()
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            times, sdpa, sizes = [], [], []
            for i in range(repeat):
                text = prompt(scratch, n, seed=10_000 + 100 * layer + n + i)
                t, b = timed_commit(page, frames, text, 2)
                times.append(t)
                sizes.append(b)
                ids = scratch.tokenizer(text, return_tensors="pt")
                with torch.inference_mode():
                    start = time.perf_counter()
                    theirs(**ids)
                    sdpa.append(time.perf_counter() - start)
            stop.set()
            watcher.join()
            ratios = [a / b for a, b in zip(times, sdpa)]
            rows.append((f"{n:,} tokens, layer {layer}", statistics.median(times), statistics.median(sdpa),
                         statistics.median(ratios), max(ratios), statistics.median(sizes), peak[0] - base))
    print(f"Explore on SmolLM2, Ctrl+Enter to the heatmaps and the zoom drawn, Chromium {machine()}, "
          f"median of {repeat} new prompts")
    print(f"{'prompt':<22} {'scratch s':>7} {'SDPA s':>7} {'ratio':>6} {'worst':>6} {'sent MB':>8} {'server MiB':>11}")
    for label, ours_s, sdpa_s, ratio, worst, size, memory in rows:
        print(f"{label:<22} {ours_s:7.2f} {sdpa_s:7.2f} {ratio:6.2f} {worst:6.2f} {size / 1e6:8.2f} {memory / 2**20:11.0f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="views whose label starts with one of these words")
    parser.add_argument("--long", action="store_true", help="SmolLM2 prompts of 2,048 and 4,096 tokens instead")
    args = parser.parse_args()
    if args.long:
        long_prompts(args.repeat)
        return
    model = load_model()
    tok = model.tokenizer
    rows = []
    with streamlit_server() as (url, _), chromium() as browser:
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        frames = Frames(page)
        page.goto(url + "/")
        page.wait_for_selector(PLOT, timeout=120_000)

        def measure(label, path, n_tokens, n_charts, target=None):
            if args.only and not label.startswith(tuple(args.only)):
                return
            page.goto(url + path)
            page.wait_for_selector(PLOT, timeout=120_000)
            timed_commit(page, frames, sentence(tok, n_tokens, seed=999), n_charts)  # models loaded, code warm
            times, sizes = [], []
            for i in range(args.repeat):
                t, b = timed_commit(page, frames, sentence(tok, n_tokens, seed=len(rows) * 100 + i), n_charts)
                times.append(t)
                sizes.append(b)
            rows.append((label, statistics.median(times), max(times), statistics.median(sizes), target))

        measure("Explore, 12 heatmaps, 32 tokens", "/", 32, 1, 1.0)
        measure("Overview, 72 heads, 32 tokens", "/overview", 32, 2, 1.5)
        measure("Overview, 72 heads, 512 tokens", "/overview", 512, 2, 5.0)
        measure("Explore, 12 heatmaps, 512 tokens", "/", 512, 1, 1.5)
        measure("Compare, 4 picks + difference, 512", "/compare?picks=4", 512, 5, 1.5)
        measure("Tokens, 12 heads, 512 tokens", "/tokens", 512, 1, 1.5)
        measure("Text, 512 tokens", "/text", 512, 1, 1.5)
    print(f"Commit to figures on screen, Chromium {machine()}, median of {args.repeat} new texts")
    print(f"{'view':<36} {'median s':>8} {'worst s':>8} {'sent MB':>8} {'target s':>8}")
    for label, med, worst, size, target in rows:
        print(f"{label:<36} {med:8.2f} {worst:8.2f} {size / 1e6:8.2f} {'' if target is None else f'{target:8.1f}'}")


if __name__ == "__main__":
    main()
