"""A head's card and the atlas in Chromium: their first view once the server has prepared a bundled decoder, and
an encoder's card with no preparation.

    python -m bench.bench_card [--model smollm2] [--heads 23.3,29.1,18.6] [--minilm-head 2.5]

First a fresh session's floor on this machine: a Streamlit app of one title and one small chart, opened in a
new browser (nothing cached) and in a new tab of a returning browser (the app's scripts cached, as for anyone
who has opened the app before; a new session all the same). Then ``streamlit run app.py`` (``--fresh``: its
results kept in a new folder, so the preparation runs from nothing; else it reads what an earlier server kept
on disk): Explore on the model (it loads and the server starts preparing), a wait until the sidebar no longer
says it is preparing, then each head's card and the atlas, each in a new session both ways, with the seconds
until done (``bench_first_view.first_view``) and those less the floor. Then MiniLM: Explore once (the model
loads), and a card in a new session, nothing prepared. Aims: a card and the atlas <= 2 s after the preparation,
MiniLM's card <= 5 s. ``python -m bench.bench_warm_up`` gives what the preparation costs.
"""
from __future__ import annotations

import argparse
import tempfile

from bench.common import machine
from bench.views import both, first_view, floor, prepared
from harness.browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server

def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--heads", default="23.3,29.1,18.6")
    parser.add_argument("--minilm-head", default="2.5")
    parser.add_argument("--fresh", action="store_true", help="prepare from nothing (else what is kept on disk is read)")
    args = parser.parse_args()
    print(machine())
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        base_fresh, base_again = floor(browser)
        with tempfile.TemporaryDirectory() as results, \
                streamlit_server(env={"HEADLENS_RESULTS": results} if args.fresh else None) as (url, _):
            returning = browser.new_context(viewport={"width": 1280, "height": 900})
            _, done, _ = first_view(browser, f"{url}/?model={args.model}", context=returning)
            print(f"{args.model} loaded (Explore, first session): {done:.1f} s")
            print(f"prepared after {prepared(browser, f'{url}/?model={args.model}'):.0f} s more")
            print(f"{'first view, seconds':<26} {'new browser':>11} {'returning':>10} {'less floor':>11}   aim")
            print(f"{'floor: one small chart':<26} {base_fresh:>11.1f} {base_again:>10.1f}")

            def report(name: str, url_: str, aim: float) -> None:
                fresh, again, error = both(browser, url_, returning)
                print(f"{name:<26} {fresh:>11.1f} {again:>10.1f} {again - base_again:>11.1f}   <= {aim:g} s "
                      f"{'met' if again <= aim else 'NOT met'} (returning)" + ("  error shown" if error else ""),
                      flush=True)

            for head in args.heads.split(","):
                report(f"card {head}", f"{url}/head?model={args.model}&head={head}", 2)
            report("atlas", f"{url}/atlas?model={args.model}", 2)
            for light in ("text", "generate"):  # pages with one small figure on the same server
                fresh, again, _ = both(browser, f"{url}/{light}?model={args.model}", returning)
                print(f"{light + ' (for comparison)':<26} {fresh:>11.1f} {again:>10.1f} {again - base_again:>11.1f}",
                      flush=True)
            _, done, _ = first_view(browser, f"{url}/?model=minilm")
            print(f"minilm loaded (Explore, first session): {done:.1f} s")
            head = args.minilm_head
            _, done, error = first_view(browser, f"{url}/head?model=minilm&head={head}", context=returning)
            print(f"{'minilm card ' + head + ', cold':<26} {'':>11} {done:>10.1f} {done - base_again:>11.1f}   <= 5 s "
                  f"{'met' if done <= 5 else 'NOT met'}" + ("  error shown" if error else ""), flush=True)
            report(f"minilm card {head}, again", f"{url}/head?model=minilm&head={head}", 2)
            returning.close()
        browser.close()


if __name__ == "__main__":
    main()
