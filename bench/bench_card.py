"""A head's card and the atlas in Chromium: their first view once the server has prepared a bundled decoder, and
an encoder's card with no preparation.

    python -m bench.bench_card [--model smollm2] [--heads 23.3,29.1,18.6] [--minilm-head 2.5]

Starts ``streamlit run app.py`` (``--fresh``: its results kept in a new folder, so the preparation runs from
nothing; else it reads what an earlier server kept on disk), opens Explore on the model (it loads and the server starts preparing), and waits until the sidebar no longer
says it is preparing; then opens each head's card and the atlas, each in a fresh browser session, and reports
the seconds to the first picture and until done (``bench_first_view.first_view``). Then MiniLM: Explore once
(the model loads), and a card in a fresh session, nothing prepared. Aims: a card and the atlas <= 2 s after
the preparation, MiniLM's card <= 5 s. ``python -m bench.bench_warm_up`` gives what the preparation costs.
"""
from __future__ import annotations

import argparse
import tempfile
import time

from bench.bench_first_view import first_view
from bench.common import machine
from tests.browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server

PREPARING = "Preparing this model's pages"


def prepared(browser, url: str, timeout_s: float = 1800) -> float:
    """Seconds until a fresh session's sidebar no longer says the server is preparing."""
    start = time.perf_counter()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    while time.perf_counter() - start < timeout_s:
        page.goto(url)
        page.wait_for_selector("[data-testid='stMain'] h1", timeout=600_000)
        page.wait_for_timeout(1500)
        if not page.get_by_text(PREPARING).count():
            break
        page.wait_for_timeout(10_000)
    context.close()
    return time.perf_counter() - start


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--heads", default="23.3,29.1,18.6")
    parser.add_argument("--minilm-head", default="2.5")
    parser.add_argument("--fresh", action="store_true", help="prepare from nothing (else what is kept on disk is read)")
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as results, \
            streamlit_server(env={"HEADLENS_RESULTS": results} if args.fresh else None) as (url, _), \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        _, done, _ = first_view(browser, f"{url}/?model={args.model}")
        print(f"{args.model} loaded (Explore, first session): {done:.1f} s")
        print(f"prepared after {prepared(browser, f'{url}/?model={args.model}'):.0f} s more")
        print(f"{'page':<22} {'first picture':>14} {'done':>8}   aim")
        for head in args.heads.split(","):
            first, done, error = first_view(browser, f"{url}/head?model={args.model}&head={head}")
            print(f"{'card ' + head:<22} {first:>12.1f} s {done:>6.1f} s   <= 2 s {'met' if done <= 2 else 'NOT met'}"
                  + ("  error shown" if error else ""), flush=True)
        first, done, error = first_view(browser, f"{url}/atlas?model={args.model}")
        print(f"{'atlas':<22} {first:>12.1f} s {done:>6.1f} s   <= 2 s {'met' if done <= 2 else 'NOT met'}"
              + ("  error shown" if error else ""), flush=True)
        for light in ("text", "generate"):  # pages with one small figure, on the same server: a fresh session's floor
            first, done, _ = first_view(browser, f"{url}/{light}?model={args.model}")
            print(f"{light + ' (for comparison)':<22} {first:>12.1f} s {done:>6.1f} s", flush=True)
        _, done, _ = first_view(browser, f"{url}/?model=minilm")
        print(f"minilm loaded (Explore, first session): {done:.1f} s")
        first, done, error = first_view(browser, f"{url}/head?model=minilm&head={args.minilm_head}")
        print(f"{'minilm card ' + args.minilm_head:<22} {first:>12.1f} s {done:>6.1f} s   <= 5 s "
              f"{'met' if done <= 5 else 'NOT met'}" + ("  error shown" if error else ""), flush=True)
        browser.close()


if __name__ == "__main__":
    main()
