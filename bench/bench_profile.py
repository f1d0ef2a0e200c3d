"""Profiling a corpus from the command line: sentences per second, local against Ray, and peak memory.

    python -m bench.bench_profile [--sentences 10000] [--engines local,ray] [--device cpu] [--runs 1]

Writes a corpus of N sentences (the built-in corpus, repeated, each copy numbered so that no two
lines are the same), then runs ``python -m analysis.profiles.run`` on it once per engine and run, each
in a fresh process, alternately. Reported per run: wall time from start to the written file
(model loading and, for Ray, starting a local instance included), sentences per second, and the
peak resident memory of the whole process tree (the command, and with Ray its raylet, object
store and actor), sampled every 0.2 s with psutil.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.common import machine
from models.corpus import CORPUS



def write_corpus(path: Path, n: int) -> None:
    base = list(CORPUS)
    with open(path, "w", encoding="utf-8") as out:
        for i in range(n):
            copy, s = divmod(i, len(base))
            out.write(f"{base[s]} ({copy})\n" if copy else f"{base[s]}\n")


def tree_rss(root: psutil.Process) -> int:
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run(engine: str, corpus: Path, out: Path, device: str) -> tuple[float, int, str]:
    """Wall seconds, peak bytes of the process tree, and the command's last line."""
    cmd = [sys.executable, "-m", "analysis.profiles.run", str(corpus), "--out", str(out), "--engine", engine,
           "--device", device]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(root))
        time.sleep(0.2)
    wall = time.perf_counter() - start
    output = proc.stdout.read().strip()
    if proc.returncode != 0:
        raise SystemExit(f"{engine} failed ({proc.returncode}): {output}")
    return wall, peak, output.splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=10_000)
    parser.add_argument("--engines", default="local,ray")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    engines = args.engines.split(",")
    print(f"{machine(args.device)}; {args.sentences:,} sentences, bundled model, batches of 32")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        write_corpus(corpus, args.sentences)
        results: dict[str, list[tuple[float, int]]] = {e: [] for e in engines}
        for r in range(args.runs):
            for engine in engines:  # alternately, so that each sees the same machine
                wall, peak, line = run(engine, corpus, Path(tmp) / f"{engine}.parquet", args.device)
                results[engine].append((wall, peak))
                print(f"run {r + 1} {engine:>5}: {wall:7.1f} s, {args.sentences / wall:6.1f} sentences/s, "
                      f"peak {peak / 2**20:,.0f} MiB  ({line})", flush=True)
        if len(engines) == 2:
            a, b = engines
            ratios = [rb[0] / ra[0] for ra, rb in zip(results[a], results[b])]
            print(f"{b} / {a} wall time: " + ", ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
