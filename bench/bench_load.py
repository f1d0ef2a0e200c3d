"""Many people at once: browser sessions on one server for a while, each typing and switching pages.

    python -m bench.bench_load [--sessions 8] [--seconds 60]
    python -m bench.bench_load --llm [--model smollm2] [--seconds 240] [--tokens 4000]

Starts ``streamlit run app.py`` with the repository's server defaults, lets one visitor open every
page (model, spaCy and the corpus profile loaded, as whoever starts the server for a class would),
then runs the sessions side by side in one Chromium (each context its own Streamlit session).
Prints the errors (target 0), the rerun latency percentiles per action, the server's memory over
the run (target: bounded) and how busy the machine was: the browsers share its cores with the
server, so latencies here include rendering eight pages on the same two cores.

``--llm``: a class on a bundled decoder (harness/load_llm.py): the model opened once and the server's
warm-up finished, then one session trains a decoder on Train, two read a ``--tokens`` prompt and
switch layers, three type sentences and open every page, for ``--seconds``; then the sessions close
and the server's memory is followed for ``--settle`` seconds (targets: no action past 60 s, no long-prompt action past
30 s to its first answer, peak 3 GiB, back within 300 MiB of where it was before the sessions). Each action kind is
timed to its first answer (a chart drawn for it; for a layer not run yet, the nearest ready layer) and to done. The
browsers run at the lowest CPU priority (``harness.browser.low_priority``), as students' browsers run on their own
machines.
"""
from __future__ import annotations

import argparse
import json
import tempfile

from bench.common import machine
from harness.browser import streamlit_server
from harness.load import run_load
from app_pages.ui.janitor import HELD_LOG


def llm(args) -> None:
    from models import load_model
    from models.catalog import bundled
    from harness.load_llm import run_llm_load
    from harness.texts import prompt

    model = load_model(bundled(args.model).name, backend="transformers")
    texts = [prompt(model.tokenizer, args.tokens, seed=3 + i) for i in range(args.long)]
    env = {"HEADLENS_WARM_UP": "1", "HEADLENS_PRELOAD": args.model}  # as a class on it is served (docs/app.md)
    with tempfile.TemporaryDirectory() as results:
        if args.cold:  # nothing kept from an earlier run: the warm-up computes everything
            env["HEADLENS_RESULTS"] = results
        env[HELD_LOG] = held_log = f"{results}/held.jsonl"  # what the shared results hold, at each janitor's sweep
        with streamlit_server(env=env) as (url, proc):
            report = run_llm_load(url, proc.pid, args.model, texts, model.n_layers, visitors=args.visitors,
                                  long_prompts=args.long, trainers=args.trainers, seconds=args.seconds,
                                  settle=args.settle)
        most = max(map(json.loads, open(held_log)), key=lambda line: sum(b for _, b in line["held"].values()))
    print(f"warm-up (model opened, server quiet) took {report.warm_up_s:.0f} s")
    print(report.summary())
    print("by action:", report.by_kind())
    slow = [x for x in report.latencies if x > 60]
    print(f"actions past 60 s: {len(slow)} of {len(report.latencies)}")
    long = [(f, d) for f, d, k in zip(report.firsts, report.latencies, report.kinds) if "layer switch" in k or k == "long prompt"]
    print(f"long-prompt actions (opens and layer switches): {sum(f > 30 for f, _ in long)} of {len(long)} past 30 s to "
          f"their first answer (aim 0), {sum(d > 60 for _, d in long)} past 60 s to done (aim 0)")
    if report.idle_steps_s:
        share = report.class_steps_s / report.idle_steps_s
        print(f"training: {report.idle_steps_s:.1f} steps/s alone, {report.class_steps_s:.1f} with the class "
              f"({share:.2f} of it; aim >= 1/3: {'met' if share >= 1 / 3 else 'NOT met'}), {report.trained_steps:,} steps")
    print(report.memory())
    total = sum(b for _, b in most["held"].values())
    print(f"the shared results at their most, {total / 2**20:,.0f} MiB:", ", ".join(
        f"{name} {b / 2**20:,.0f} MiB ({n})" for name, (n, b) in most["held"].items() if b >= 2**20))
    timeline = [f"{t:.0f} s {m:.0f}" for t, m in report.memory_mib[::15]]
    print("server memory over the run (MiB, every 15 s):", ", ".join(timeline))
    for line in report.errors:
        print("error:", line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--llm", action="store_true", help="a class on a bundled decoder")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--visitors", type=int, default=3)
    parser.add_argument("--long", type=int, default=2)
    parser.add_argument("--trainers", type=int, default=1)
    parser.add_argument("--settle", type=float, default=90)
    parser.add_argument("--cold", action="store_true", help="--llm: no results kept on disk from before")
    args = parser.parse_args()
    print(machine())
    if args.llm:
        args.seconds = args.seconds or 240
        llm(args)
        return
    args.seconds = args.seconds or 60
    with tempfile.TemporaryDirectory() as folder:
        held = f"{folder}/held.jsonl"
        with streamlit_server(env={HELD_LOG: held}) as (url, proc):
            report = run_load(url, proc.pid, args.sessions, args.seconds, held_log=held)
    print(report.summary())
    print("by action:", report.by_kind())
    thirds = [report.memory_at(report.warm_at + f * (report.memory_mib[-1][0] - report.warm_at)) for f in (0, 1 / 3, 2 / 3, 1)]
    print("server memory at 0, 1/3, 2/3 and the end of the run (MiB):", ", ".join(f"{m:.0f}" for m in thirds))
    for line in report.errors:
        print("error:", line)


if __name__ == "__main__":
    main()
