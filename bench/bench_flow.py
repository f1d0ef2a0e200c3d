"""Attention rollout and flow: their cost by text length, and how well each agrees with token ablation.

    python -m bench.bench_flow [--sentences 335]

Times rollout and flow of the bundled model's attention at 16, 32 and 64 tokens (best of 3), then
reports over the built-in corpus the Spearman correlation of raw attention (last layer, mean of
heads), rollout and flow with token ablation, beside Abnar & Zuidema's (2020) figures.
"""
from __future__ import annotations

import argparse
import time

from analysis import agreement, flow, rollout
from bench.bench_browser import sentence
from bench.common import best_time, machine
from models import load_model
from models.corpus import CORPUS

PAPER = {"raw attention": 0.29, "rollout": 0.71, "flow": 0.70}  # their Table 1, on their own model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=335)
    args = parser.parse_args()
    model = load_model()
    print(f"Rollout and flow of all-MiniLM-L6-v2's attention (6 layers), {machine()}")
    print(f"{'tokens':>6} {'rollout ms':>10} {'flow s':>8}")
    for n in (16, 32, 64):
        att = model.attend(sentence(model.tokenizer, n, seed=n))
        print(f"{n:>6} {1000 * best_time(lambda: rollout(att)):>10.2f} {best_time(lambda: flow(att)):>8.2f}")
    corpus = list(CORPUS)
    start = time.perf_counter()
    scores = agreement(model, corpus[: args.sentences])
    print(f"\nSpearman correlation with token ablation, {scores['sentences']} sentences "
          f"({time.perf_counter() - start:.0f} s), mean over content positions:")
    print(f"{'':>14} {'scratch':>6} {'Abnar & Zuidema':>16}")
    for name, theirs in PAPER.items():
        print(f"{name:>14} {scores[name]:>6.2f} {theirs:>16.2f}")


if __name__ == "__main__":
    main()
