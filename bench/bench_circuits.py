"""Circuits on SmolLM2 over the indirect-object task: edge scores, the faithfulness curve, and how the scores rank
against exact edge patching.

    python -m bench.bench_circuits [--pairs 100] [--device cpu|cuda] [--exact 200] [--exact-pairs 20]
                                   [--memory 400] [--task ioi]

On ``--pairs`` pairs (seed 0), every one of SmolLM2's 70,651 edges scored by EAP (aim: <= 20 s on two cores) and by
EAP-IG in 5 steps (aim: <= 90 s), then the faithfulness curve at ten sizes, 10 to 10,000 edges (aim: <= 120 s).

``--exact N``: the union of EAP's and EAP-IG's top ``N`` edges patched exactly, one edge at a time, over the first
``--exact-pairs`` pairs; each method's Spearman rank correlation with exact patching on those edges.

``--memory N``: EAP-IG's peak memory over 100 and over ``N`` pairs, each in a fresh process: the pairs run in
batches of ``analysis.circuits.BATCH_PAIRS``, and what is kept between batches is one score matrix.
"""
from __future__ import annotations

import argparse

import numpy as np

from bench.common import machine, peak_in_fresh_process, timed

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def peak_memory(pairs: int, device: str, task: str) -> tuple[float, float]:
    """A fresh process scoring ``pairs`` pairs by EAP-IG: its resident memory (MiB) with the model loaded, and the
    most it held while the pairs ran (sampled every 20 ms)."""
    return peak_in_fresh_process(
        "from models import load_model\nfrom analysis.tasks.build import make_task\n"
        "from analysis.circuits import edge_scores\n"
        f"model = load_model({NAME!r}, backend='scratch', device={device!r})\n"
        f"task = make_task(model, {task!r}, n={pairs})",
        'edge_scores(model, task, "eap_ig")')


def main() -> None:
    from scipy.stats import spearmanr

    from analysis import circuits as AC
    from analysis.tasks.build import make_task
    from models import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--task", default="ioi")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--exact", type=int, default=0, help="also exact patching of each method's top N edges")
    parser.add_argument("--exact-pairs", type=int, default=20)
    parser.add_argument("--memory", type=int, default=0, help="also the peak memory over this many pairs")
    args = parser.parse_args()
    model = load_model(NAME, backend="scratch", device=args.device)
    task = make_task(model, args.task, n=args.pairs)
    print(f"{model.name}, {model.n_layers} x {model.n_heads} heads · {machine(args.device)} · {len(task)} "
          f"{args.task} pairs")
    AC.edge_scores(model, task.subset(range(2)), "eap")  # the first call's one-off costs
    t_eap, eap = timed(lambda: AC.edge_scores(model, task, "eap"), args.device)
    print(f"EAP over {eap.graph.n_edges:,} edges: {t_eap:.1f} s (aim <= 20 s)")
    t_ig, ig = timed(lambda: AC.edge_scores(model, task, "eap_ig", AC.STEPS), args.device)
    print(f"EAP-IG in {AC.STEPS} steps: {t_ig:.1f} s (aim <= 90 s)")
    sizes = list(AC.SIZES)
    t_curve, curve = timed(lambda: AC.faithfulness(model, ig, sizes), args.device)
    print(f"faithfulness curve at {len(sizes)} sizes: {t_curve:.1f} s (aim <= 120 s)")
    for n, f, lo, hi in zip(curve.sizes, curve.faithfulness, curve.low, curve.high):
        print(f"  {n:>6,} edges: {f:6.1%} [{lo:.1%}, {hi:.1%}]")
    print(f"smallest circuit reaching {AC.TARGET:.0%}: {curve.smallest()} edges")
    print("strongest EAP-IG edges: " + "; ".join(f"{r.sender} → {r.receiver} {r.share:+.3f}"
                                                  for r in ig.frame(8).itertuples()))
    if args.exact:
        part = task.subset(range(min(args.exact_pairs, len(task))))
        chosen = {}
        for s in (eap, ig):
            f = s.frame(args.exact)
            chosen.update({(a, b): None for a, b in zip(f.sender_index, f.receiver_index)})
        edges = list(chosen)
        t_ex, exact = timed(lambda: AC.exact_edges(model, part, edges).mean(0), args.device)
        print(f"exact patching of {len(edges)} edges over {len(part)} pairs: {t_ex:.1f} s")
        for name, s in (("EAP", eap), ("EAP-IG", ig)):
            sub = AC.edge_scores(model, part, s.method, s.steps)
            est = np.array([sub.scores[a, b] for a, b in edges])
            print(f"  {name} against exact on those edges: Spearman {spearmanr(est, exact)[0]:.3f}")
    if args.memory:
        for n in (100, args.memory):
            rest, peak = peak_memory(n, args.device, args.task)
            print(f"EAP-IG over {n} pairs: {rest:.0f} MiB resident with the model loaded, at most {peak:.0f} MiB "
                  f"while the pairs ran (+{peak - rest:.0f} MiB)")


if __name__ == "__main__":
    main()
