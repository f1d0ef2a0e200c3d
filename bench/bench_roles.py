"""Profiling head roles over 1,000 sentences with the bundled model, spaCy included.

    python -m bench.bench_roles [--sentences 1000]

Times the model's forward passes (``attend`` in batches of 32) and the analysis (spaCy's parse
plus every measure) separately, end to end, and prints sentences per second. The foci's bootstrap
intervals are timed by measuring twice more, with and without them, alternately.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from analysis.roles import measure as roles
from analysis.roles.measure import load_spacy, measure_heads
from bench.common import machine
from models import load_model
from models.corpus import CORPUS



class _NoBootstrap:
    """Stands in for LiftBootstrap to time the analysis without the intervals."""

    def __init__(self, shape):
        self.shape = shape

    def add(self, *args) -> None:
        pass

    def interval(self):
        return np.full(self.shape, np.nan), np.full(self.shape, np.nan)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=1000)
    args = parser.parse_args()
    corpus = list(CORPUS)
    sentences = (corpus * (args.sentences // len(corpus) + 1))[: args.sentences]
    start = time.perf_counter()
    model = load_model()
    nlp = load_spacy()
    loaded = time.perf_counter()
    model.attend(sentences[:32])  # warm-up
    t0 = time.perf_counter()
    attentions = model.attend(sentences, batch_size=32)
    t1 = time.perf_counter()
    list(nlp.pipe(sentences, batch_size=256))  # the parse alone; measure_heads parses again
    t2 = time.perf_counter()
    measure_heads(attentions, nlp).frame()
    t3 = time.perf_counter()
    forward, parse = t1 - t0, t2 - t1
    with_boot, without = [], []
    for _ in range(2):  # alternately, so that both see the same machine
        a = time.perf_counter()
        measure_heads(attentions, nlp).frame()
        b = time.perf_counter()
        real, roles.LiftBootstrap = roles.LiftBootstrap, _NoBootstrap
        try:
            measure_heads(attentions, nlp).frame()
        finally:
            roles.LiftBootstrap = real
        with_boot.append(b - a)
        without.append(time.perf_counter() - b)
    boot = min(with_boot) - min(without)
    total = t3 - start
    print(f"Head roles over {len(sentences)} sentences, all-MiniLM-L6-v2, {machine()}")
    print(f"  load model and spaCy     {loaded - start:6.2f} s")
    print(f"  forward (attend)         {forward:6.2f} s")
    print(f"  analysis incl. spaCy     {t3 - t2:6.2f} s  = {(t3 - t2) / forward:.0%} of the forward time")
    print(f"    of which spaCy's parse {parse:6.2f} s (timed alone); the measures "
          f"{t3 - t2 - parse:.2f} s = {(t3 - t2 - parse) / forward:.0%} of the forward time")
    print(f"    of which the foci's bootstrap intervals ({len(roles.FOCI)} foci x 1,000 resamples) "
          f"{boot:.2f} s = {boot / (t3 - t2):.0%} of the analysis (best of 2 with and without: "
          f"{min(with_boot):.2f} s, {min(without):.2f} s)")
    print(f"  end to end               {total:6.2f} s  ({len(sentences) / total:.0f} sentences/s; "
          f"{len(sentences) / (forward + t3 - t2):.0f} sentences/s once loaded)")


if __name__ == "__main__":
    main()
