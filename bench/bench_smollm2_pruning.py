"""Pruning SmolLM2-135M-Instruct by next-token loss: what each way of ranking heads keeps, and what it costs.

    python -m bench.bench_smollm2_pruning [--sentences N]

1. Importance of all 270 heads on N sentences spread over the built-in corpus (24, as the page),
   by ablation (the loss with each head alone switched off) and by gradient (Michel et al.): the
   seconds each takes, and their Spearman correlation, over all heads and within layers.
2. The pruning curves (10% of the heads a step): by importance (gradient, recomputed each step),
   at random (mean of 3 seeds) and by attention alone (most weight on the sink first): the
   next-token loss and top-1 agreement with the full model at 10, 20 and 40% pruned.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from analysis.pruning.importance import head_importance
from analysis.pruning.curves import curve_summary, pruning_curve
from bench.common import machine
from models import load_model
from models.corpus import CORPUS

POINTS = {27: "10%", 54: "20%", 108: "40%"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=24)
    args = parser.parse_args()
    print(machine())
    model = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="scratch")
    sentences = [CORPUS[i] for i in np.linspace(0, len(CORPUS) - 1, args.sentences).round().astype(int)]
    imp = {}
    for method in ("ablation", "gradient"):
        start = time.perf_counter()
        imp[method] = head_importance(model, sentences, method=method, measure="loss")["importance"].to_numpy()
        print(f"importance by {method}: {time.perf_counter() - start:.1f} s for 270 heads on "
              f"{len(sentences)} sentences")
    a, g = imp["ablation"].reshape(30, 9), imp["gradient"].reshape(30, 9)
    within = np.nanmean([spearmanr(a[l], g[l]).statistic for l in range(30)])
    print(f"Spearman, ablation vs gradient: {spearmanr(a.ravel(), g.ravel()).statistic:.2f} over all heads, "
          f"{within:.2f} within a layer (mean of 30)")
    print(f"ablation: loss rises {a.max():.3f} nats at most (L{a.argmax() // 9} H{a.argmax() % 9}), "
          f"median {np.median(a):.4f}; {int((a < 0).sum())} heads lower the loss when switched off")
    frames = []
    for order, seed in [("importance", 0), ("random", 0), ("random", 1), ("random", 2), ("proxy", 0)]:
        start = time.perf_counter()
        frames.append(pruning_curve(model, sentences, order=order, seed=seed, measure="loss"))
        print(f"curve {order} (seed {seed}): {time.perf_counter() - start:.1f} s")
    summary = curve_summary(pd.concat(frames, ignore_index=True))
    full = summary[summary["n_pruned"] == 0].iloc[0]
    print(f"full model: loss {full['loss']:.3f}")
    rows = summary[summary["n_pruned"].isin(list(POINTS))]
    for row in rows.itertuples():
        print(f"{POINTS[row.n_pruned]:>4} pruned, {row.order:<10}: loss {row.loss:.3f}, "
              f"top-1 agreement {row.agreement:.3f}")


if __name__ == "__main__":
    main()
