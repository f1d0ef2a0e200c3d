"""A real Streamlit server on a free loopback port, driven by Playwright in Debian's Chromium."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "artifacts" / "screenshots"
LOGS = ROOT / "artifacts" / "logs"
PLOT = ".js-plotly-plot .main-svg"


def low_priority(executable: str = CHROMIUM) -> str:
    """A launcher of ``executable`` at the lowest CPU priority (nice 19) that every process it starts inherits: a
    class's browsers run on the students' own machines, so on a machine the server shares with them they take the
    cores it leaves idle. As root, Chromium would raise its own threads' priorities (to nice -8); the launcher takes
    it the right to (``setpriv``), as a user's browser lacks it."""
    launcher = Path(tempfile.gettempdir()) / f"headlens-nice-{Path(executable).name}"
    script = ("#!/bin/sh\n"
              'if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then\n'
              f'  exec setpriv --bounding-set=-sys_nice nice -n 19 {executable} "$@"\n'
              "fi\n"
              f'exec nice -n 19 {executable} "$@"\n')
    if not launcher.exists() or launcher.read_text() != script:
        written = launcher.with_name(f"{launcher.name}.{os.getpid()}")  # whole when renamed: a worker beside reads it
        written.write_text(script)
        written.chmod(0o755)
        os.replace(written, launcher)
    return str(launcher)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def streamlit_server(timeout: float = 120, env: dict | None = None, script: str = "app.py"):
    """``streamlit run app.py`` (or ``script``) on 127.0.0.1 (with ``env`` added to its environment); yields its
    base URL and stops it by its PID."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"streamlit-{port}.log"
    log = open(log_path, "wb")  # a pipe nobody reads would fill and stall the server
    # the address comes from .streamlit/config.toml (localhost), as for a person running the app
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", script, "--server.headless", "true",
         "--server.port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"streamlit exited: {log_path.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError("streamlit did not become healthy")
                time.sleep(0.3)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def preloaded(url: str, timeout: float = 300, until: str = "seconds") -> dict:
    """Wait until the server at ``url`` has loaded what it loads as it starts (``app_pages.ui.preload``; ``until``
    "prepared": and computed an encoder's first results); its report (``seconds``, ``prepared``: how long each
    took)."""
    import json

    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{url}/headlens/preload", timeout=10) as r:
            report = json.loads(r.read() or b"null") or {}
        if report.get(until) is not None:
            return report
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server's preload did not finish: {report}")
        time.sleep(0.2)


@contextmanager
def chromium(executable: str = CHROMIUM):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


# a page showing a first form whose full one is still to come (``Shared.now``) is not settled: it draws again
FIRST_FORM = """() => [...document.querySelectorAll('[data-testid="stAlert"]')]
  .some(a => a.innerText.includes('A first answer:'))"""
SETTLED = """n => {
  const busy = document.querySelector('[data-testid="stStatusWidgetRunningIcon"], [data-stale="true"]')
    || (""" + FIRST_FORM + """)();
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  if (busy || plots.length < n || plots.some(p => !p.querySelector('.main-svg'))) { window.__headlensDrawn = null; return false; }
  const drawn = plots.map(p => { const r = p.getBoundingClientRect();
    return [r.width, r.height, p.querySelectorAll('text').length].join(','); }).join(';') + ';' + document.body.scrollHeight;
  const same = window.__headlensDrawn === drawn;
  window.__headlensDrawn = drawn;
  return same;
}"""


def settled(page, charts: int = 0, timeout: float = 60_000) -> None:
    """Wait until the page's run has finished (no first form waiting for its full one either), at least ``charts``
    charts are drawn, and what is drawn (each chart's size and labels, the page's height) is the same at two polls
    in a row: every chart laid out."""
    page.evaluate("() => { window.__headlensDrawn = null; }")
    page.wait_for_function(SETTLED, arg=charts, timeout=timeout, polling=250)


def plot_title(page) -> str:
    """The first chart's title as one line: a wrapped title is drawn as one tspan a line."""
    return page.evaluate(
        "() => { const t = document.querySelector('.js-plotly-plot .gtitle'); if (!t) return '';"
        " const lines = Array.from(t.querySelectorAll('tspan.line')).map(l => l.textContent);"
        " return lines.length ? lines.join(' ') : t.textContent; }")


def wait_title(page, prefix: str, timeout: float = 60_000, plot: int = 0) -> None:
    """Wait until the ``plot``-th chart's title includes ``prefix``; a chart a rerun has not drawn yet is waited for,
    not an error."""
    page.wait_for_function(
        "([p, i]) => { const gd = document.querySelectorAll('.js-plotly-plot')[i];"
        " const t = gd && gd.querySelector('.gtitle'); return !!t && t.textContent.includes(p); }",
        arg=[prefix, plot], timeout=timeout)


def x_ticks(page, plot: int = 0) -> list[str]:
    """Tick labels drawn under the first x axis that has any (in a grid, the lowest cell's) of the
    ``plot``-th chart."""
    return page.evaluate(
        "i => { for (const ax of document.querySelectorAll('.js-plotly-plot')[i].querySelectorAll('.xaxislayer-above')) {"
        " const t = Array.from(ax.querySelectorAll('g[class^=\"x\"][class$=\"tick\"] text')).map(t => t.textContent);"
        " if (t.length) return t; } return []; }", plot)


def every_kth(ticks: list[str], labels: list[str]) -> bool:
    """Whether the drawn ticks are every k-th label from the first, as plotly thins a category axis."""
    return bool(ticks) and any(ticks == labels[::k] for k in range(1, len(labels) + 1))


def commit_text(page, text: str) -> None:
    """Type into the sidebar's sentences box and commit with Ctrl+Enter, as a person does."""
    box = page.get_by_role("textbox", name="Sentences, one per line")
    box.click()
    box.press("Control+a")
    box.fill(text)
    box.press("Control+Enter")


# Labels: tick labels of every axis (subplots too), token labels of the head view and of the shaded
# text; titles: figure
# and subplot titles. Boxes are the drawn text's, in page pixels.
GEOMETRY = """() => {
  const out = {labels: 0, titles: 0, outside: [], overlaps: []};
  const titles = [];
  const inside = (r, box) => r.left >= box.left - 1 && r.right <= box.right + 1 && r.top >= box.top - 1
                             && r.bottom <= box.bottom + 1;
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    const box = plot.getBoundingClientRect();
    if (!box.width) continue;  // a chart in a tab not shown
    for (const t of plot.querySelectorAll('.xaxislayer-above text, .yaxislayer-above text, .textpoint text, .heatmaplayer text')) {
      const r = t.getBoundingClientRect();
      if (!t.textContent.trim() || !r.width) continue;
      out.labels++;
      if (!inside(r, box)) out.outside.push(t.textContent);
    }
    for (const t of plot.querySelectorAll('.g-gtitle text, .annotation-text')) {
      const r = t.getBoundingClientRect();
      if (!r.width) continue;
      out.titles++;
      if (!inside(r, box)) out.outside.push('title: ' + t.textContent);
      titles.push([t.textContent, r]);
    }
  }
  for (let i = 0; i < titles.length; i++) for (let j = i + 1; j < titles.length; j++) {
    const [a, p] = titles[i], [b, q] = titles[j];
    if (p.left < q.right && q.left < p.right && p.top < q.bottom && q.top < p.bottom) out.overlaps.push(a + ' / ' + b);
  }
  return out;
}"""


def assert_readable(page, where: str) -> dict:
    """Every label of the page's charts inside its chart, no two titles overlapping, no exception shown."""
    r = page.evaluate(GEOMETRY)
    assert r["labels"] > 0 and r["titles"] > 0, where
    assert not r["outside"], f"{where}: drawn outside the chart: {r['outside'][:5]}"
    assert not r["overlaps"], f"{where}: titles overlap: {r['overlaps'][:3]}"
    assert not page.locator("[data-testid='stException']").count(), where
    return r


# Scroll the page's scrolling container so that the point {x, y} sits mid-height, clear of the fixed header
CENTRE = """({x, y}) => {
  let el = document.querySelector('.js-plotly-plot');
  while (el && !(el.scrollHeight > el.clientHeight && /(auto|scroll)/.test(getComputedStyle(el).overflowY))) {
    el = el.parentElement;
  }
  const dy = y - window.innerHeight / 2;
  if (el) el.scrollTop += dy; else window.scrollBy(0, dy);
}"""

# The point {x, y} lies inside the viewport on a chart's drawing, nothing drawn over it
ON_A_PLOT = """({x, y}) => {
  const el = document.elementFromPoint(x, y);
  return !!el && !!el.closest('.js-plotly-plot');
}"""


def click_until(page, target_js: str, target_arg, done_js: str, done_arg, tries: int = 3,
                each: float = 60_000) -> dict:
    """Click the point ``target_js(target_arg)`` gives until ``done_js(done_arg)`` holds, as a person clicks again
    when a chart was redrawn under the pointer; the point is read afresh before each click, after scrolling it to
    the middle of the window, and clicked once nothing covers it. The point last clicked (what ``target_js`` gave)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        page.evaluate(CENTRE, page.evaluate(target_js, target_arg))
        target = page.evaluate(target_js, target_arg)
        page.wait_for_function(ON_A_PLOT, arg=target, timeout=each)
        page.mouse.click(target["x"], target["y"])
        try:
            page.wait_for_function(done_js, arg=done_arg, timeout=each)
            return target
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise
