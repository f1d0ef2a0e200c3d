"""The README's pictures, taken from the running app so that they show what it shows today.

    python scripts/screenshots.py        # writes assets/screenshot-foci.png and assets/screenshot-explore.png

It starts the app on a free loopback port, opens Foci and Explore in Debian's Chromium
(``bash scripts/install-browser``), waits for their charts and saves the page's main column.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.browser import PLOT, chromium, streamlit_server  # noqa: E402

SHOTS = {  # file -> (address, charts to wait for, window height)
    "screenshot-foci.png": ("/foci", 4, 1500),
    "screenshot-explore.png": ("/?layer=0", 1, 1320),
}


def take(page, url: str, charts: int, height: int, out: Path) -> None:
    page.set_viewport_size({"width": 1280, "height": height})
    page.goto(url)
    page.wait_for_function(f"document.querySelectorAll('{PLOT}').length >= {charts}", timeout=600_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=600_000)
    page.wait_for_timeout(1500)  # plotly's last transition
    page.screenshot(path=str(out), clip={"x": 0, "y": 0, "width": 1280, "height": height})
    print(f"{out.relative_to(ROOT)}: {out.stat().st_size // 1024} KiB")


def main() -> None:
    with streamlit_server() as (base, _), chromium() as browser:
        page = browser.new_page()
        for name, (address, charts, height) in SHOTS.items():
            take(page, base + address, charts, height, ROOT / "assets" / name)


if __name__ == "__main__":
    main()
