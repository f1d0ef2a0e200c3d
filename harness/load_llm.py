"""A class on the LLM: browser sessions on one server, one training a decoder, some on long prompts
switching layers, the others typing sentences and opening pages, all on a bundled decoder.

``run_llm_load(url, pid, ...)`` waits for the server to load the model and finish its warm-up (its CPU
quiet), notes its memory, runs the sessions side by side for ``seconds`` (and on until each has tried
``at_least`` actions, however slow the machine), closes them, then follows
the server's memory while it drops what they held. Every action counts as done when the page shows
what it asked for with nothing left running; one slower than ``ACTION_TIMEOUT`` is an error. Used by
tests/test_load_llm.py and bench/bench_load.py --llm.
"""
from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote

from models.catalog import bundled
from models.corpus import CORPUS
from harness.browser import CHROMIUM_ARGS, low_priority
from harness.load import LoadReport, _sample_memory, cpu_seconds, finished, machine_ticks, server_mib

ACTION_TIMEOUT = 120_000  # ms: an action slower than this is an error (the target is 60 s)
# the pages a visitor opens, by their link's name, which is their heading but for the Head page's (HEADINGS)
PAGES = ["Explore", "Foci", "Compare", "Overview", "Tokens", "Text", "Generate", "Head roles", "Head", "Atlas",
         "Effects", "Circuits", "Queries & keys", "Across layers", "Pruning"]
HEADINGS = {"Head": "re:^L[0-9]+ H[0-9]+ · "}  # the head it shows; "re:" marks a pattern, else the heading itself
SHOWS_TEXT = {"Explore", "Overview", "Tokens", "Text"}  # their first chart's title shows the typed sentence

# the start of a page predicate: false unless the page shown is ``heading``'s, by its exact heading (or pattern)
ON_PAGE = """  const h1 = document.querySelector('[data-testid="stMain"] h1');
  const text = h1 ? h1.textContent.trim() : null;  // the page itself: "Head roles" is not "Head"
  if (text === null || (heading.startsWith('re:') ? !new RegExp(heading.slice(3)).test(text) : text !== heading))
    return false;
"""

DONE = """([heading, title]) => {
""" + ON_PAGE + """  if (document.querySelector('[data-stale="true"]')) return false;
  if (document.querySelector('[data-testid="stStatusWidgetRunningIcon"]')) return false;
  if (document.querySelector('[data-testid="stException"]')) return true;  // done, and reported as an error
  if (!title) return true;  // a page opened: done when its run is (some draw no chart before a click)
  const t = document.querySelector('.js-plotly-plot .gtitle');
  if (!t) return false;
  const shown = t.textContent.replace(/\\s/g, ''), want = title.replace(/\\s/g, '');
  return shown.includes(want);
}"""


@dataclass
class LlmLoadReport(LoadReport):
    loaded_mib: float = 0.0  # the server's memory once the model had loaded
    sessions_at: float = 0.0  # when the sessions started (seconds since the start)
    before_mib: float = 0.0  # and once its warm-up had finished, before the sessions
    after_mib: list = field(default_factory=list)  # (seconds after the sessions closed, MiB)
    trained_steps: int = 0  # the training's steps while the class worked
    idle_steps_s: float = 0.0  # its steps per second alone, before the class
    class_steps_s: float = 0.0  # and while the class worked

    @property
    def peak_mib(self) -> float:
        """The server's peak while the sessions ran (the warm-up before them is the server's own)."""
        return max(m for t, m in self.memory_mib if t >= self.sessions_at)

    @property
    def warm_up_peak_mib(self) -> float:
        return max((m for t, m in self.memory_mib if t < self.sessions_at), default=float("nan"))

    @property
    def returned_mib(self) -> float:
        """Where the server's memory settled after the sessions closed, above where it was before them."""
        return self.after_mib[-1][1] - self.before_mib

    def memory(self) -> str:
        return (f"server memory {self.loaded_mib:.0f} MiB with the model loaded, {self.before_mib:.0f} MiB warmed up "
                f"before the sessions (peak {self.warm_up_peak_mib:.0f} MiB while warming up); with the sessions, peak {self.peak_mib:.0f} MiB, "
                "after they closed " + ", ".join(f"{m:.0f} MiB at {t:.0f} s" for t, m in self.after_mib)
                + f" ({self.returned_mib:+.0f} MiB from before)")


# an action's first answer: the page asked for, with a chart drawn for this run (none stale) whose title shows one of
# ``wants`` (the asked layer or "the nearest ready layer to" it; a want ending in a number is not followed by a digit,
# so that "to 1" is not "to 12"); with no ``wants``, any chart
# drawn for the page, or the page done
FIRST = """([heading, wants]) => {
""" + ON_PAGE + """  if (document.querySelector('[data-testid="stException"]')) return true;
  const drawn = [...document.querySelectorAll('.js-plotly-plot')]
    .filter(p => !p.closest('[data-stale="true"]') && p.querySelector('.main-svg'));
  if (!wants.length) return drawn.length > 0 || (!document.querySelector('[data-stale="true"]')
    && !document.querySelector('[data-testid="stStatusWidgetRunningIcon"]'));
  const shows = (shown, want) => {
    for (let i = shown.indexOf(want); i >= 0; i = shown.indexOf(want, i + 1))
      if (!/[0-9]$/.test(want) || !/[0-9]/.test(shown.charAt(i + want.length))) return true;
    return false;
  };
  return drawn.some(p => {
    const t = p.querySelector('.gtitle');
    const shown = t ? t.textContent.replace(/\\s/g, '') : '';
    return wants.some(w => shows(shown, w.replace(/\\s/g, '')));
  });
}"""


async def _wait(page, heading: str, title: str, timeout: float = ACTION_TIMEOUT) -> None:
    await page.wait_for_function(DONE, arg=[heading, title], timeout=timeout, polling=100)


async def _errors_shown(page, n: int, action: str, report: LlmLoadReport) -> None:
    for testid in ("stException", "stAlertContentError"):
        boxes = page.locator(f"[data-testid='{testid}']")
        if await boxes.count():
            report.errors.append(f"session {n}: {testid} after {action}: {await boxes.first.inner_text()}")


SHOWN = """() => [document.querySelector('[data-testid="stMain"] h1')?.textContent,
  document.querySelector('.js-plotly-plot .gtitle')?.textContent,
  !!document.querySelector('[data-testid="stStatusWidgetRunningIcon"]'),
  !!document.querySelector('[data-stale="true"]')]"""


async def _shown(page) -> str:
    """What the page shows, for an action that did not finish: its heading, its first chart's title, and whether a
    run is under way or parts of the page are stale."""
    try:
        heading, title, running, stale = await page.evaluate(SHOWN)
    except Exception as err:  # noqa: BLE001 - a page that cannot say is reported as such
        return f"the page could not be read: {type(err).__name__}"
    return f"the page shows {heading!r}, chart {title!r}, running {running}, stale {stale}"


async def _timed(page, n: int, action: str, kind: str, report: LlmLoadReport, do, heading: str, title: str,
                 first: tuple[str, ...] | None = None) -> bool:
    """``do`` the action, timed to its first answer (``FIRST`` with ``first``, by default the title) and to done."""
    start, answered = time.perf_counter(), []
    wants = list(first if first is not None else (title,) if title else ())
    watch = asyncio.create_task(page.wait_for_function(FIRST, arg=[heading, wants], timeout=ACTION_TIMEOUT,
                                                       polling=100))
    watch.add_done_callback(lambda _: answered.append(time.perf_counter() - start))
    await do()
    try:
        await _wait(page, heading, title)
    except Exception as err:  # noqa: BLE001 - a timeout is one of the errors reported
        report.errors.append(f"session {n}: {action} did not finish ({type(err).__name__}; {await _shown(page)})")
        return False
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    done = time.perf_counter() - start
    report.record(kind, done, answered[0] if answered and not watch.cancelled() and watch.exception() is None else done)
    await _errors_shown(page, n, action, report)
    return True


async def _visitor(n: int, page, url: str, model: str, clock: dict, report: LlmLoadReport) -> None:
    rng = random.Random(n)
    await page.goto(f"{url}/?model={model}")
    await _wait(page, "Explore", "", timeout=300_000)
    current, k, tried = "Explore", 0, 0
    while time.monotonic() < clock["end"] or tried < clock["at_least"]:
        tried += 1
        if current in SHOWS_TEXT and rng.random() < 0.4:
            k += 1
            text = f"{n}.{k}: {rng.choice(CORPUS)}"
            box = page.get_by_role("textbox", name="Sentences, one per line")

            async def do():
                await box.fill(text)
                await box.press("Control+Enter")
            await _timed(page, n, f"type on {current}", "type", report, do, current, text[:20])
        else:
            current = rng.choice([p for p in PAGES if p != current])
            link = page.get_by_role("link", name=current, exact=True)
            await _timed(page, n, f"open {current}", current, report, link.click, HEADINGS.get(current, current), "")


IN_URL = "([key, value]) => new RegExp(`[?&]${key}=${value}(&|$)`).test(location.search)"


async def _choose(page, label: str, key: str, value: str, tries: int = 3) -> None:
    """Choose ``value`` in the selectbox ``label`` by typing it, until the page's URL holds it under ``key`` (the
    server has taken the choice). A click that lands while the page redraws can leave the list shut, the keys going
    nowhere: the choice is then made again (a state waited on, ``tries`` times)."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout
    picker = page.get_by_test_id("stSelectbox").filter(has_text=label).first
    for _ in range(tries):
        await picker.click()
        await page.keyboard.type(value)
        await page.keyboard.press("Enter")
        try:
            await page.wait_for_function(IN_URL, arg=[key, value], timeout=ACTION_TIMEOUT / 4, polling=100)
            return
        except PlaywrightTimeout:
            await page.keyboard.press("Escape")


async def _switch_layer(page, n: int, layer: int, kind: str, report: LlmLoadReport) -> None:
    """A switch to ``layer``: its first answer is the layer, or the nearest ready one, titled so."""
    await _timed(page, n, f"layer {layer}", kind, report, lambda: _choose(page, "Layer", "layer", str(layer)), "Explore",
                 f"Layer {layer} ·", first=(f"Layer {layer} ·", f"the nearest ready layer to {layer}"))


async def _open_long(page, n: int, url: str, model: str, text: str, report: LlmLoadReport) -> None:
    await _timed(page, n, "open a long prompt", "long prompt", report,
                 lambda: page.goto(f"{url}/?model={model}&text={quote(text)}"), "Explore", "Layer 0 ·")


async def _long_prompt(n: int, page, n_layers: int, clock: dict, report: LlmLoadReport) -> None:
    rng = random.Random(100 + n)
    tried = 0
    while time.monotonic() < clock["end"] or tried < clock["at_least"]:
        tried += 1
        await _switch_layer(page, n, rng.randrange(1, n_layers), "layer switch", report)


TRAINING = "train_task=text&train_steps=20000"  # the Train page's URL: its default decoder on the text task


async def _steps(page) -> int:
    """The step the Train page shows ("Step 1,234 of 20,000"), or 0 before the first."""
    shown = await page.get_by_text("of 20,000").first.inner_text()
    return int(shown.split()[1].replace(",", "")) if shown.startswith("Step") else 0


async def _past(page, step: int, timeout_s: float = ACTION_TIMEOUT / 1000) -> int:
    """The step the Train page shows once it is past ``step`` (a state waited on, within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while (now := await _steps(page)) <= step:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the training showed no step past {step} in {timeout_s:.0f} s")
        await asyncio.sleep(0.5)
    return now


async def _trainer(n: int, page, url: str, clock: dict, report: LlmLoadReport, training: str,
                   alone: asyncio.Event, idle_s: float) -> None:
    """Starts a training, measures its speed alone for ``idle_s`` (then sets ``alone``: the class may start),
    and its speed while the class works."""
    await page.goto(f"{url}/train?{training}")
    await page.wait_for_selector("h1:has-text('Train')", timeout=120_000)
    start = time.perf_counter()
    await page.get_by_role("button", name="Start").click()
    await page.get_by_text("of 20,000").first.wait_for(timeout=ACTION_TIMEOUT)
    started = time.perf_counter() - start
    report.record("start training", started, started)
    first = await _past(page, 0)  # its first logged step: the model built, the training under way
    t0 = time.monotonic()
    await asyncio.sleep(idle_s)
    steps = await _past(page, first)  # at least one more logged step, however long a busy machine takes
    report.idle_steps_s = (steps - first) / (time.monotonic() - t0)
    alone.set()
    while clock["end"] == float("inf"):
        await asyncio.sleep(0.5)
    begin, t2 = await _steps(page), time.monotonic()
    while time.monotonic() < clock["end"]:
        await asyncio.sleep(2)
    end = await _past(page, begin)  # the training went on while the class worked: a step logged since it began
    report.trained_steps, report.class_steps_s = end - begin, (end - begin) / (time.monotonic() - t2)
    await _errors_shown(page, n, "training", report)


async def _quiet(pid: int, below: float = 0.1, for_s: float = 6.0, timeout: float = 900) -> None:
    """Until the server uses less than ``below`` of a core for ``for_s`` seconds (its warm-up done)."""
    deadline, quiet_since, last = time.monotonic() + timeout, None, cpu_seconds(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = cpu_seconds(pid)
        busy, last = now - last, now
        quiet_since = (quiet_since or time.monotonic()) if busy < below else None
        if quiet_since is not None and time.monotonic() - quiet_since >= for_s:
            return


async def _run(url: str, pid: int, model: str, long_texts: list[str], n_layers: int, visitors: int, long_prompts: int,
               trainers: int, seconds: float, settle: float, training: str, idle_s: float,
               idle_switches: int, at_least: int, returned_within: float | None) -> LlmLoadReport:
    from playwright.async_api import async_playwright

    sessions = visitors + long_prompts + trainers
    report = LlmLoadReport(sessions, seconds)
    start, stop = time.monotonic(), asyncio.Event()
    clock = {"end": float("inf"), "at_least": at_least}
    sampler = asyncio.create_task(_sample_memory(pid, report, start, stop))
    async with async_playwright() as p:
        # the browsers at the lowest priority, as students' browsers run on their own machines
        browser = await p.chromium.launch(executable_path=low_priority(), args=CHROMIUM_ARGS)
        try:
            # whoever starts the server opens the model once; the server then warms up on its own
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            page = await context.new_page()
            await page.goto(f"{url}/?model={model}")
            await _wait(page, "Explore", "", timeout=600_000)
            await context.close()
            report.loaded_mib = server_mib(pid)
            await _quiet(pid)
            report.warm_up_s = report.sessions_at = time.monotonic() - start
            report.before_mib = server_mib(pid)
            contexts, pages = [], []
            for n in range(sessions):
                contexts.append(await browser.new_context(viewport={"width": 1280, "height": 900}))
                # a click or a key waits for its element as long as an action may take: on a busy machine the
                # page under it can be redrawing for more than Playwright's 30 s, which is a slow action, not a lost one
                contexts[-1].set_default_timeout(ACTION_TIMEOUT)
                pages.append(await contexts[-1].new_page())
                pages[-1].on("pageerror", lambda e, n=n: report.errors.append(f"session {n}: page error {e}"))
            alone, tasks = asyncio.Event(), []
            for n in range(trainers):  # each training alone first: its steps per second before the class
                tasks.append(asyncio.create_task(_trainer(n, pages[n], url, clock, report, training, alone, idle_s)))
            if trainers:
                await alone.wait()
            if long_prompts:  # the long prompts open, and one switches layers alone: what a switch costs when idle
                for i, n in enumerate(range(trainers, trainers + long_prompts)):
                    await _open_long(pages[n], n, url, model, long_texts[i % len(long_texts)], report)
                for layer in (n_layers - 1, n_layers // 2, n_layers // 3)[:idle_switches]:
                    await _switch_layer(pages[trainers], trainers, layer, "idle layer switch", report)
            clock["end"] = time.monotonic() + seconds
            cpu, ticks = cpu_seconds(pid), machine_ticks()
            engines = list(bundled(model).engines())  # the visitors take both engines of the model in turn
            for n, page in enumerate(pages[trainers:], trainers):
                if n < trainers + long_prompts:
                    work = _long_prompt(n, page, n_layers, clock, report)
                else:
                    work = _visitor(n, page, url, engines[n % len(engines)], clock, report)
                tasks.append(asyncio.create_task(work))
                await asyncio.sleep(1.0)
            report.warm_at = time.monotonic() - start
            await finished(tasks, pid, cpu, ticks, report)
            for context in contexts:
                await context.close()
        finally:
            await browser.close()
        closed = time.monotonic()
        while time.monotonic() - closed < settle:
            await asyncio.sleep(5.0)
            report.after_mib.append((time.monotonic() - closed, server_mib(pid)))
            if returned_within is not None and report.returned_mib <= returned_within:
                break  # back where it was: the rest of ``settle`` would only wait
        stop.set()
        await sampler
    return report


def run_llm_load(url: str, pid: int, model: str, long_texts: list[str], n_layers: int, *, visitors: int = 3,
                 long_prompts: int = 2, trainers: int = 1, seconds: float = 240, settle: float = 60,
                 training: str = TRAINING, idle_s: float = 20, idle_switches: int = 3,
                 at_least: int = 0, returned_within: float | None = None) -> LlmLoadReport:
    """``training``: the Train page's URL query for the sessions that train; ``idle_s``: how long a training
    runs alone first, for its speed before the class; ``idle_switches``: how many layer switches a long prompt
    makes alone first, for what a switch costs before the class; ``at_least``: the actions each visitor and long
    prompt tries whatever the time (each bounded by ``ACTION_TIMEOUT``); ``returned_within``: once the sessions
    closed, the server's memory is followed every 5 s for ``settle`` seconds, or until it is back within this many
    MiB of where it was before them."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _run(url, pid, model, long_texts, n_layers, visitors, long_prompts, trainers,
                                             seconds, settle, training, idle_s, idle_switches, at_least,
                                             returned_within)).result()
