"""A server's preparation of a bundled decoder, step by step: what each declared result costs from nothing.

    python -m bench.bench_warm_up [--model smollm2] [--model gemma3]

Runs the app's own preparation command (``python -m app_pages.results.preparation``: both engines opened, then
every step the server's background thread runs, in its order, with nothing cached) in a process of its own,
and samples that process's memory from outside; prints each step's seconds, the cores it kept busy (its CPU
seconds over its seconds), the process's memory after it and its highest during it, the total, and the peak.
Memory is the proportional set size (each page counted once): both engines map the one weights file, and
resident memory counts each of its pages once per mapping. Aims: <= 120 s a model from nothing on two cores
(<= 180 s for both), peak <= 2.5 GiB.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.common import PeakMemory, machine, memory_mib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a bundled decoder's key (default: smollm2, then gemma3)")
    keys = ap.parse_args().model or ["smollm2", "gemma3"]
    print(f"# the preparation, step by step, on {machine('cpu')}")
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "app_pages.results.preparation", *keys], stdout=subprocess.PIPE,
                             text=True)
    totals: dict[str, float] = {}
    with PeakMemory(pid=child.pid) as peak:
        for line in child.stdout:
            key, step, seconds, cpu = line.rstrip("\n").split("\t")
            now = memory_mib(pid=child.pid)
            if step == "opened":
                print(f"{key}: both engines opened in {float(seconds):.1f} s, {now:.0f} MiB "
                      f"(at most {peak.reset():.0f} MiB)")
                continue
            totals[key] = totals.get(key, 0.0) + float(seconds)
            busy = float(cpu) / max(float(seconds), 1e-9)
            print(f"  {step:<18} {float(seconds):7.1f} s   {busy:4.2f} cores   {now:6.0f} MiB, "
                  f"at most {peak.reset():6.0f} MiB")
    if child.wait():
        sys.exit(f"the preparation failed ({child.returncode})")
    for key, total in totals.items():
        print(f"{key}: the steps took {total:.1f} s   aim <= 120 s   {'met' if total <= 120 else 'NOT met'}")
    print(f"all: {time.perf_counter() - start:.1f} s; peak memory {peak.highest:.0f} MiB (aim <= 2,560 MiB, the models "
          "included)")


if __name__ == "__main__":
    main()
