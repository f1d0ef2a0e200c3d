"""Many people at once: browser sessions on one server, each typing sentences and switching pages.

``run_load(url, pid, sessions, seconds)`` drives ``sessions`` Chromium contexts (each a separate
Streamlit session) for ``seconds`` (and until each has tried ``at_least`` actions and typed a sentence)
and reports errors, rerun latencies and the server's memory.
A rerun counts as done when the page shows what the action asked for (its heading and the
chart's title) and no element is left over from the previous run. Used by tests/test_load.py and
bench/bench_load.py.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from models.corpus import CORPUS
from harness.browser import CHROMIUM, CHROMIUM_ARGS, PLOT, preloaded

# page name, its path, and whether its chart title shows the sentence
PAGES = [("Explore", "", True), ("Compare", "compare", False), ("Overview", "overview", True),
         ("Tokens", "tokens", True), ("Text", "text", True), ("Head roles", "roles", False),
         ("Across layers", "layers", False)]
SHOWS_TEXT = {name: shows for name, _, shows in PAGES}
TITLE_START = {"Compare": "1: ", "Head roles": "Roles over ", "Across layers": "Layer "}
ACTION_TIMEOUT = 90_000  # ms; a rerun slower than this counts as an error

DONE = """([heading, title]) => {
  const h1 = document.querySelector('[data-testid="stMain"] h1');
  const t = document.querySelector('.js-plotly-plot .gtitle');
  if (!h1 || !t || !h1.textContent.includes(heading)) return false;
  if (document.querySelector('[data-stale="true"]')) return false;
  if (document.querySelector('[data-testid="stStatusWidgetRunningIcon"]')) return false;
  // a long title is drawn as lines, whose text runs together where a space was
  const shown = t.textContent.replace(/\s/g, ''), want = title.replace(/\s/g, '');
  return want.startsWith('^') ? shown.startsWith(want.slice(1)) : shown.includes(want);
}"""


@dataclass
class LoadReport:
    sessions: int
    seconds: float
    actions: int = 0
    latencies: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # what each latency was: "type" or the page opened
    firsts: list[float] = field(default_factory=list)  # each action's time to its first answer, where it is measured
    errors: list[str] = field(default_factory=list)
    memory_mib: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, MiB)
    warm_at: float = 0.0  # when every session had its first page
    warm_up_s: float = 0.0  # the first visitor's tour of every page and the server's preload, before the sessions
    server_cpu_s: float = 0.0  # CPU the server used while the sessions ran
    machine_busy: float = 0.0  # share of all cores busy meanwhile (the browsers run here too)
    # the server's memory once its janitor had swept (``held_log``): after the warm-up, before the sessions came, and
    # after they closed; NaN where not measured
    swept_before_mib: float = float("nan")
    swept_after_mib: float = float("nan")

    def record(self, kind: str, done_s: float, first_s: float | None = None) -> None:
        """An action of ``kind`` done after ``done_s``; its first answer (a chart drawn for it, or the nearest
        ready layer for a layer not run yet) after ``first_s``, where it is measured."""
        self.latencies.append(done_s)
        self.kinds.append(kind)
        if first_s is not None:
            self.firsts.append(min(first_s, done_s))
        self.actions += 1

    def percentile(self, q: float, kind: str | None = None, first: bool = False) -> float:
        times = self.firsts if first else self.latencies
        xs = sorted(x for x, k in zip(times, self.kinds) if kind in (None, k))
        return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")

    def by_kind(self) -> str:
        """Each action kind's time to done (p50, p95, max) and, where measured, to its first answer."""
        def line(k: str) -> str:
            done = (f"p50 {self.percentile(50, k):.2f} s p95 {self.percentile(95, k):.2f} s "
                    f"max {self.percentile(100, k):.2f} s")
            first = (f"first answer p50 {self.percentile(50, k, True):.2f} s max {self.percentile(100, k, True):.2f} s; "
                     "done " if len(self.firsts) == len(self.latencies) else "")
            return f"{k} {first}{done} ({self.kinds.count(k)})"
        return "; ".join(line(k) for k in sorted(set(self.kinds)))

    def memory_at(self, t: float) -> float:
        return min(self.memory_mib, key=lambda s: abs(s[0] - t))[1]

    @property
    def rss_growth_second_half(self) -> float:
        """MiB gained between the middle of the measured run and its end."""
        mid = (self.warm_at + self.memory_mib[-1][0]) / 2
        return self.memory_mib[-1][1] - self.memory_at(mid)

    @property
    def swept_returned_mib(self) -> float:
        """What the sessions left held once they closed and the janitor swept: ``swept_after_mib`` over
        ``swept_before_mib``."""
        return self.swept_after_mib - self.swept_before_mib

    def summary(self) -> str:
        warm, end, peak = self.memory_at(self.warm_at), self.memory_mib[-1][1], max(m for _, m in self.memory_mib)
        return (f"{self.sessions} sessions x {self.seconds:.0f} s after a {self.warm_up_s:.0f} s warm-up: "
                f"{self.actions} reruns, {len(self.errors)} errors; "
                f"rerun latency p50 {self.percentile(50):.2f} s, p95 {self.percentile(95):.2f} s, "
                f"max {max(self.latencies, default=float('nan')):.2f} s; server memory {warm:.0f} MiB when all "
                f"sessions were open, {end:.0f} MiB at the end (peak {peak:.0f}); second half "
                f"{self.rss_growth_second_half:+.0f} MiB; the server used {self.server_cpu_s / self.seconds:.2f} "
                f"cores, the machine was {self.machine_busy:.0%} busy"
                + ("" if self.swept_before_mib != self.swept_before_mib else
                   f"; swept, {self.swept_before_mib:.0f} MiB before the sessions and {self.swept_after_mib:.0f} MiB "
                   f"after they closed ({self.swept_returned_mib:+.0f} MiB)"))


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process and its threads."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    values = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def server_mib(pid: int) -> float:
    """The server's memory with its children's (a training runs in a process of its own): each one's
    proportional set (a page of a file that two engines map counts once; resident memory counts it per
    mapping), read from ``/proc/PID/smaps_rollup``."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024
        except (OSError, StopIteration):  # a child that has just ended
            pass
    return total


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid``."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}/task") else []:
            try:
                kids = [int(k) for k in open(f"/proc/{p}/task/{task}/children").read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


async def swept(log: str, pid: int, timeout: float = 120.0) -> float:
    """The server's memory just after its janitor's next sweep that notes what it holds (a line added to ``log``,
    ``HEADLENS_HELD_LOG``, once the sweep has dropped what closed sessions held and given freed memory back)."""
    since = time.time()

    def noted() -> bool:
        try:
            with open(log) as f:
                return any(json.loads(line)["t"] > since for line in f if line.strip())
        except OSError:
            return False

    deadline = time.monotonic() + timeout
    while not noted():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server's janitor noted nothing in {log} for {timeout:.0f} s")
        await asyncio.sleep(0.2)
    return server_mib(pid)


async def _sample_memory(pid: int, report: LoadReport, start: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        report.memory_mib.append((time.monotonic() - start, server_mib(pid)))
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except asyncio.TimeoutError:
            pass
    report.memory_mib.append((time.monotonic() - start, server_mib(pid)))


async def _session(n: int, browser, url: str, clock: dict, report: LoadReport, opened: list) -> None:
    rng = random.Random(n)
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(ACTION_TIMEOUT)  # a click waits on a redrawing page as long as a rerun may take
    page = await context.new_page()
    page.on("dialog", lambda d: (report.errors.append(f"session {n}: dialog {d.message!r}"),
                                 asyncio.ensure_future(d.dismiss())))
    page.on("pageerror", lambda e: report.errors.append(f"session {n}: page error {e}"))
    try:
        await page.goto(url + "/")
        await page.wait_for_selector(PLOT, timeout=180_000)
        opened.append(n)
        current, text, k, tried, at_least = "Explore", None, 0, 0, clock["at_least"]
        while time.monotonic() < clock["end"] or tried < at_least or at_least and not k:
            tried += 1
            typing_owed = at_least and not k and tried >= at_least  # its last owed action, and no sentence yet
            if SHOWS_TEXT[current] and (rng.random() < 0.5 or typing_owed):
                k += 1
                text = f"{n}.{k}: {rng.choice(CORPUS)}"
                action, kind, expect = f"type on {current}", "type", (current, text[:24])
                box = page.get_by_role("textbox", name="Sentences, one per line")
                start = time.perf_counter()
                await box.fill(text)
                await box.press("Control+Enter")
            else:
                current = rng.choice([p[0] for p in PAGES if p[0] != current])
                action, kind = f"open {current}", current
                expect = (current, "^" + TITLE_START[current] if current in TITLE_START else (text or "")[:24])
                start = time.perf_counter()
                await page.get_by_role("link", name=current, exact=True).click()
            try:
                await page.wait_for_function(DONE, arg=list(expect), timeout=ACTION_TIMEOUT, polling=50)
            except Exception as err:  # noqa: BLE001 - a timeout is one of the errors reported
                report.errors.append(f"session {n}: {action} did not finish ({type(err).__name__})")
                continue
            report.record(kind, time.perf_counter() - start)
            for testid in ("stException", "stAlertContentError"):
                if await page.locator(f"[data-testid='{testid}']").count():
                    report.errors.append(f"session {n}: {testid} after {action}: "
                                         f"{await page.locator(f'[data-testid={testid!r}]').first.inner_text()}")
    finally:
        await context.close()


async def _warm_up(browser, url: str, report: LoadReport) -> None:
    """One visitor opens every page once, as whoever starts the server for a class would."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    try:
        for name, path, _ in PAGES:
            await page.goto(f"{url}/{path}")
            expect = "^" + TITLE_START.get(name, "")
            await page.wait_for_function(DONE, arg=[name, expect], timeout=300_000, polling=100)
    except Exception as err:  # noqa: BLE001 - reported, and the run goes on
        report.errors.append(f"warm-up: {type(err).__name__}: {err}")
    finally:
        await context.close()


async def finished(tasks: list, pid: int, cpu: float, ticks: tuple[int, int], report: LoadReport) -> None:
    """Wait for the sessions' ``tasks``; note the server's CPU and the machine's load since ``cpu`` and
    ``ticks``, and each session that ended in an exception as an error."""
    results = await asyncio.gather(*tasks, return_exceptions=True)
    report.server_cpu_s = cpu_seconds(pid) - cpu
    busy, total = (b - a for a, b in zip(ticks, machine_ticks()))
    report.machine_busy = busy / max(total, 1)
    for n, r in enumerate(results):
        if isinstance(r, BaseException):
            report.errors.append(f"session {n}: {type(r).__name__}: {r}")


async def _run(url: str, pid: int, sessions: int, seconds: float, held_log: str | None, at_least: int) -> LoadReport:
    from playwright.async_api import async_playwright

    report = LoadReport(sessions, seconds)
    start, stop, opened = time.monotonic(), asyncio.Event(), []
    clock = {"end": float("inf"), "at_least": at_least}  # the end set once every session is open
    sampler = asyncio.create_task(_sample_memory(pid, report, start, stop))
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            await _warm_up(browser, url, report)
            # and what the server computes as it starts (the default model's first results) in its caches too, so
            # that the memory before the sessions holds all that it keeps
            await asyncio.to_thread(preloaded, url, 600, "prepared")
            report.warm_up_s = time.monotonic() - start
            if held_log:
                report.swept_before_mib = await swept(held_log, pid)
            # sessions open one after another (people arrive), then all run until the same deadline
            tasks = []
            for n in range(sessions):
                tasks.append(asyncio.create_task(_session(n, browser, url, clock, report, opened)))
                await asyncio.sleep(0.5)
            while len(opened) < sessions and not all(t.done() for t in tasks):
                await asyncio.sleep(0.2)
            report.warm_at = time.monotonic() - start
            clock["end"] = time.monotonic() + seconds
            cpu, ticks = cpu_seconds(pid), machine_ticks()
            await finished(tasks, pid, cpu, ticks, report)  # each session's context closed
            if held_log:
                report.swept_after_mib = await swept(held_log, pid)
        finally:
            await browser.close()
            stop.set()
            await sampler
    return report


def run_load(url: str, pid: int, sessions: int = 8, seconds: float = 60, held_log: str | None = None,
             at_least: int = 0) -> LoadReport:
    """``held_log``: the server's ``HEADLENS_HELD_LOG``, whose janitor's notes say when it has swept: the server's
    memory is then also measured once it has, before the sessions and after they closed. ``at_least``: the actions
    each session tries whatever the time (each bounded by ``ACTION_TIMEOUT``); one that has typed no sentence by
    then goes on until it types one (its next action on a page that takes text)."""
    # a thread of its own: the caller may already run an event loop (sync Playwright does)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _run(url, pid, sessions, seconds, held_log, at_least)).result()
