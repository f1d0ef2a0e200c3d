"""What SmolLM2's heads write, and the routes of its predictions, against patching.

    python -m bench.bench_routes [--device cpu|cuda] [--rounds 3]

For each built-in pair, timed back to back in one process: the routes (``analysis.prediction_flow``,
one forward pass that splits every residual update into its parts' shares) against exact patching of
every head (``analysis.patch_heads``); then how far the heads the routes pass through
(``analysis.effects.routes.flow_heads``, every route, its shares multiplied) agree with the share patching
recovers (Spearman over all 270 heads, by size, and the heads the two top-10 lists share). Then every
head's OV copying and suppression scores (``analysis.copying_scores``): their time and the heads that
copy or suppress most, and what the three heads that recover most on each pair write at its last token.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from scipy.stats import spearmanr

from analysis.defaults import PAIRS

from analysis.effects import grid, patch_heads
from analysis.effects.routes import flow_graph, flow_heads, prediction_flow, strongest_route
from analysis.effects.vocabulary import copying_scores, head_vocabulary
from bench.common import best_time, machine
from models import head_label, load_model

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine(args.device))
    model = load_model(NAME, backend="scratch", device=args.device)
    L, H = model.n_layers, model.n_heads
    print("\nRoutes against patching every head, per built-in pair")
    print(f"{'pair':34s} {'routes':>8s} {'patching':>9s} {'ratio':>6s} {'Spearman':>9s} {'top 10':>7s}  strongest route")
    ratios, rhos, found = [], [], {}
    for name, pair in PAIRS.items():
        flow_s = best_time(lambda: prediction_flow(model, pair.clean), args.device, args.rounds)
        patch_s = best_time(lambda: patch_heads(model, pair.clean, pair.corrupted, pair.answer, pair.distractor),
                            args.device, 1)
        flow = prediction_flow(model, pair.clean)
        heads = patch_heads(model, pair.clean, pair.corrupted, pair.answer, pair.distractor)
        recovered = grid(heads, "recovered", L, H)
        through = flow_heads(flow)
        rho = spearmanr(through.reshape(-1), np.abs(recovered).reshape(-1)).statistic
        top = lambda a: set(np.argsort(-a, axis=None, kind="stable")[:10].tolist())  # noqa: E731
        shared = len(top(through) & top(np.abs(recovered)))
        route = strongest_route(flow_graph(flow))
        moved = "; ".join(f"{head_label(r.layer, r.head)} from {flow.tokens[r.source]!r} ({r.share:.2f})"
                          for r in route[route["kind"] == "head"].itertuples())
        ratios.append(flow_s / patch_s)
        rhos.append(rho)
        found[name] = recovered
        print(f"{name[:34]:34s} {flow_s:7.2f}s {patch_s:8.2f}s {flow_s / patch_s:6.3f} {rho:9.2f} {shared:7d}  {moved}")
    print(f"median ratio {np.median(ratios):.3f}; Spearman {min(rhos):.2f} to {max(rhos):.2f}, median "
          f"{np.median(rhos):.2f}")

    print("\nOV copying and suppression over the vocabulary")
    start = time.perf_counter()
    scores = copying_scores(model)
    print(f"{time.perf_counter() - start:.1f} s for {L * H} heads over {scores.attrs['tokens']} tokens x "
          f"{scores.attrs['vocabulary']:,}; chance {scores.attrs['chance']:.5f}")
    for column in ("copying", "suppression"):
        best = scores.sort_values(column, ascending=False).head(8)
        print(f"  most {column}: " + ", ".join(f"{head_label(r.layer, r.head)} {getattr(r, column):.2f}"
                                                for r in best.itertuples()))
    print(f"  heads above 0.2: copying {(scores['copying'] > 0.2).sum()}, suppression "
          f"{(scores['suppression'] > 0.2).sum()}")

    print("\nWhat the three heads that recover most write at each pair's last token (clean prompt)")
    for name, pair in PAIRS.items():
        recovered = found[name]
        for i in np.argsort(-np.abs(recovered), axis=None, kind="stable")[:3]:
            layer, head = divmod(int(i), H)
            words = head_vocabulary(model, pair.clean, layer, head, k=5)
            up = ", ".join(repr(t) for t in words.query("direction == 'up'")["text"])
            down = ", ".join(repr(t) for t in words.query("direction == 'down'")["text"])
            row = scores.query("layer == @layer and head == @head").iloc[0]
            print(f"  {name[:28]:28s} L{layer} H{head} recovers {recovered[layer, head]:+.2f}, copies "
                  f"{row['copying']:.2f}, suppresses {row['suppression']:.2f}: up {up} | down {down}")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
