"""Every page's first view on a bundled LLM: seconds until its first picture, and until it is done.

    python -m bench.bench_first_view [--model smollm2] [--pages foci,queries_keys] [--cold | --prepared] [--wait S]
    python -m bench.bench_first_view --model minilm --server-each [--preload none] [--at seconds]

Starts ``streamlit run app.py``, loads the model once (Explore, as whoever starts a server for a
class would), then opens each page in a fresh browser session, one at a time, on the otherwise idle
server. ``first picture``: the page's first chart drawn (for a page with none, when it is done);
``done``: the run finished (no running icon), every chart drawn. ``--wait S`` waits S seconds after the
model loads before the first page, for what the server computes in the background. ``--cold``: an empty
results folder, the preparation from nothing under way while the pages open. ``--prepared``: once the sidebar
no longer says the server is preparing (its results read from disk, or computed), each page in a new browser
and in a new tab of a returning one, beside this machine's floor (a page of one small chart) measured first;
aim: done within 5 s in the returning browser, or within 1.5 s of the floor. ``--server-each``: each page the
first one a new server shows (nothing stored), opened once the server has loaded what it loads as it starts
(``HEADLENS_PRELOAD``, the default model unless ``--preload`` says otherwise) and computed the results an
encoder's pages open with (``--at seconds``: as soon as the models are loaded, those results still being computed);
aim: its first picture within 3 s.
"""
from __future__ import annotations

import argparse
import tempfile
import time

from bench.common import machine
from bench.views import both, first_view, floor, prepared
from harness.browser import CHROMIUM, CHROMIUM_ARGS, preloaded, streamlit_server

PAGES = ["home", "foci", "compare", "overview", "tokens", "text", "generate", "roles", "effects", "circuits",
         "queries_keys", "head", "atlas", "layers", "pruning", "train"]


def main() -> None:
    from playwright.sync_api import sync_playwright


    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--pages", default=",".join(PAGES))
    parser.add_argument("--wait", type=float, default=0.0)
    parser.add_argument("--cold", action="store_true", help="an empty results folder: the server prepares from "
                        "nothing while the pages open")
    parser.add_argument("--prepared", action="store_true", help="the pages once the server has prepared, new and "
                        "returning browsers beside this machine's floor")
    parser.add_argument("--server-each", action="store_true", help="each page on a new server, its first page")
    parser.add_argument("--preload", help="HEADLENS_PRELOAD for --server-each (none: load nothing as it starts)")
    parser.add_argument("--at", choices=["seconds", "prepared"], default="prepared",
                        help="--server-each: open the page once the models are loaded (seconds) or once the results "
                             "an encoder's pages open with are computed too (prepared)")
    args = parser.parse_args()
    print(machine())
    if args.server_each:
        return server_each(args.model, args.pages.split(","), args.preload, args.at)
    env = {"HEADLENS_WARM_UP": "1"}
    if args.cold:
        env["HEADLENS_RESULTS"] = tempfile.mkdtemp(prefix="headlens-cold-")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        floor_fresh, floor_again = floor(browser) if args.prepared else (None, None)
        with streamlit_server(env=env) as (url, _):
            load, done, _ = first_view(browser, f"{url}/?model={args.model}")
            print(f"model loaded (Explore, first session): first picture {load:.1f} s, done {done:.1f} s")
            time.sleep(args.wait)
            if args.prepared:
                print(f"prepared after {prepared(browser, f'{url}/?model={args.model}'):.0f} s more")
                tour_prepared(browser, url, args.model, args.pages.split(","), floor_fresh, floor_again)
            else:
                tour(browser, url, args.model, args.pages.split(","))
        browser.close()


AIM_S, FLOOR_MARGIN_S = 5.0, 1.5  # a prepared page done within 5 s in a returning browser, or 1.5 s of the floor


def tour_prepared(browser, url: str, model: str, pages: list[str], floor_fresh: float, floor_again: float) -> None:
    returning = browser.new_context(viewport={"width": 1280, "height": 900})
    first_view(browser, f"{url}/?model={model}", context=returning)  # its scripts cached, as a returning visitor's
    print(f"{'page':<14} {'new browser':>11} {'returning':>10} {'less floor':>11}   aim")
    print(f"{'floor':<14} {floor_fresh:>11.1f} {floor_again:>10.1f}")
    met = 0
    for name in pages:
        path = "" if name == "home" else name
        fresh, again, error = both(browser, f"{url}/{path}?model={model}", returning)
        ok = again <= AIM_S or again - floor_again <= FLOOR_MARGIN_S
        met += ok
        print(f"{name:<14} {fresh:>11.1f} {again:>10.1f} {again - floor_again:>11.1f}   {'met' if ok else 'NOT met'}"
              + ("  error shown" if error else ""), flush=True)
    returning.close()
    print(f"within {AIM_S:g} s or {FLOOR_MARGIN_S:g} s of the floor, returning: {met} of {len(pages)} pages")


FIRST_AIM_S = 3.0  # a cold server's first picture of the default model's every page


def server_each(model: str, pages: list[str], preload: str | None, at: str = "prepared") -> None:
    from playwright.sync_api import sync_playwright

    env = {"HEADLENS_WARM_UP": "1"}
    if preload is not None:
        env["HEADLENS_PRELOAD"] = preload
    print(f"{'page':<14} {'preload':>8} {'first picture':>14} {'done':>8}   aim")
    met = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for name in pages:
            # a results folder of its own: a decoder's preparation on an earlier page's server kept its results
            own = {**env, "HEADLENS_RESULTS": tempfile.mkdtemp(prefix="headlens-cold-")}
            with streamlit_server(env=own) as (url, _):
                loaded = preloaded(url, until=at)[at]
                first, done, error = first_view(browser, f"{url}/{'' if name == 'home' else name}?model={model}")
            met += first <= FIRST_AIM_S
            print(f"{name:<14} {loaded:>6.1f} s {first:>12.1f} s {done:>6.1f} s   "
                  f"{'met' if first <= FIRST_AIM_S else 'NOT met'}" + ("  error shown" if error else ""), flush=True)
        browser.close()
    print(f"first picture within {FIRST_AIM_S:g} s of navigation on a new server: {met} of {len(pages)} pages")


def tour(browser, url: str, model: str, pages: list[str]) -> None:
    print(f"{'page':<14} {'first picture':>14} {'done':>8}")
    for name in pages:
        path = "" if name == "home" else name
        first, done, error = first_view(browser, f"{url}/{path}?model={model}")
        print(f"{name:<14} {first:>12.1f} s {done:>6.1f} s" + ("  error shown" if error else ""), flush=True)


if __name__ == "__main__":
    main()
