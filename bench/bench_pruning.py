"""Pruned all-MiniLM-L6-v2 against the full model: forward time, and what pruning keeps.

    python -m bench.bench_pruning [--device cpu|cuda] [--sentences N] [--ablation mean|zero]
    python -m bench.bench_pruning --rank [N]

1. Forward time, pruned / full, with half the heads (36 of 72) pruned in the order the pruning
   curve by importance removes them: 64 sentences as one padded batch, and one 512-token text.
   Timed alternately in one process (``bench.common.ratio``).
2. Fidelity (mean embedding cosine to the full model) and neighbour agreement (top-5 overlap) at
   20, 40 and 60% of the heads pruned (14, 29 and 43 of 72), by importance and at random (mean
   of 3 seeds), on the built-in corpus. Aim: at 40% by importance, cosine >= 0.95 and
   agreement >= 0.8.

``--rank N`` (32 when not given, the Pruning page's ``PRUNING_RANK``): the curve by importance with its later steps
re-ranking on N of 100 sentences, against re-ranking on all 100, on three samples of the corpus (the page's, and
two others): fidelity and agreement at each step, every pruned model measured on all 100, and the seconds of each,
run alternately in one process; then the page's five curves with N, timed as the page computes them.
"""
from __future__ import annotations

import argparse
import time

import pandas as pd
import torch

from analysis.defaults import ENCODER_SAMPLE, PRUNING_RANK
from analysis.pruning.curves import curve_summary, full_run, pruning_curve
from analysis.pruning.importance import attention_proxies, head_importance
from models.corpus import CORPUS, corpus_sample
from bench.bench_encoder import long_text, sentences
from bench.common import machine, ratio
from models import load_model

POINTS = {14: "20%", 29: "40%", 43: "60%"}


def forward(model, inputs):
    def run():
        with torch.inference_mode():
            model.encoder(inputs["input_ids"], inputs.get("attention_mask"), inputs.get("token_type_ids"))
    return run


def batch(model, texts):
    enc = model.tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
    return {k: v.to(model.device) for k, v in enc.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sentences", type=int, default=len(CORPUS), help="sentences of the built-in corpus to measure on")
    ap.add_argument("--ablation", default="mean", choices=["mean", "zero"])
    ap.add_argument("--rank", type=int, nargs="?", const=PRUNING_RANK, default=None,
                    help="compare re-ranking on N sentences with re-ranking on all (see above)")
    a = ap.parse_args()
    model = load_model(backend="scratch", device=a.device)
    if a.rank is not None:
        return ranking(model, a.rank, a.ablation)
    corpus = CORPUS[: a.sentences]
    print(f"{machine(a.device)}; {len(corpus)} sentences of the built-in corpus; {a.ablation} ablation")

    start = time.perf_counter()
    means = model.head_means(corpus) if a.ablation == "mean" else None
    curves = [pruning_curve(model, corpus, order="importance", ablation=a.ablation, head_means=means)]
    print(f"curve by importance: {time.perf_counter() - start:.0f} s")
    for seed in (0, 1, 2):
        curves.append(pruning_curve(model, corpus, order="random", seed=seed, ablation=a.ablation, head_means=means))
    summary = curve_summary(pd.concat(curves, ignore_index=True)).set_index(["order", "n_pruned"])

    print("\npruned        by importance: fidelity, agreement   at random (3 seeds): fidelity, agreement")
    for count, name in POINTS.items():
        imp, rnd = summary.loc[("importance", count)], summary.loc[("random", count)]
        print(f"{name} ({count:2d})       {imp.fidelity:.3f}      {imp.agreement:.3f}"
              f"                    {rnd.fidelity:.3f}      {rnd.agreement:.3f}")
    at40 = summary.loc[("importance", 29)]
    print(f"aim at 40% by importance: cosine {at40.fidelity:.3f} (>= 0.95: {'met' if at40.fidelity >= 0.95 else 'not met'}), "
          f"agreement {at40.agreement:.3f} (>= 0.8: {'met' if at40.agreement >= 0.8 else 'not met'})")

    half = curves[0].set_index("n_pruned").loc[36, "heads"]
    pruned = model.pruned(half, head_means=means)
    per_layer = pruned.pruned_heads.sum(axis=1).tolist()
    print(f"\nhalf the heads pruned (36, by importance; per layer {per_layer}): forward time pruned / full")
    for name, texts in (("64 sentences", sentences(64)), ("one 512-token text", [long_text(model.tokenizer)])):
        inputs = batch(model, texts)
        r, mine, full = ratio(forward(pruned, inputs), forward(model, inputs), a.device)
        print(f"  {name:20s} {r:.3f}  ({mine * 1e3:.1f} ms against {full * 1e3:.1f} ms)")
    params = [sum(p.numel() for p in m.encoder.parameters()) for m in (pruned, model)]
    print(f"parameters {params[0]:,} of {params[1]:,} ({params[0] / params[1]:.3f})")


def ranking(model, rank_on: int, ablation: str) -> None:
    """``--rank``: the curve by importance re-ranked on ``rank_on`` sentences against on all, three samples."""
    samples = {"the page's": corpus_sample(ENCODER_SAMPLE), "the corpus's first": list(CORPUS[:ENCODER_SAMPLE]),
               "the corpus's last": list(CORPUS[-ENCODER_SAMPLE:])}
    print(f"{machine(str(model.device))}; the curve by importance, its later steps re-ranked on {rank_on} of "
          f"{ENCODER_SAMPLE} sentences against on all; {ablation} ablation")
    gaps = []
    for name, texts in samples.items():
        means = model.head_means(texts) if ablation == "mean" else None
        full = full_run(model, texts)
        first = head_importance(model, texts, ablation=ablation, head_means=means, reference=full[0])
        got, seconds = {}, {}
        for ranked in (None, rank_on, None, rank_on):  # alternately, each timed twice; the second of each kept
            start = time.perf_counter()
            got[ranked] = pruning_curve(model, texts, order="importance", ablation=ablation, head_means=means,
                                        full=full, importance=first, rank_on=ranked)
            seconds[ranked] = time.perf_counter() - start
        every, few = got[None].set_index("n_pruned"), got[rank_on].set_index("n_pruned")
        print(f"\n{name} {len(texts)} sentences: {seconds[None]:.1f} s on all, {seconds[rank_on]:.1f} s on "
              f"{rank_on} ({seconds[rank_on] / seconds[None]:.2f})")
        print("pruned   fidelity: all  ranked   agreement: all  ranked")
        for count in every.index[1:-1]:
            print(f"{count:5d}    {every.fidelity[count]:.4f}  {few.fidelity[count]:.4f}"
                  f"       {every.agreement[count]:.3f}   {few.agreement[count]:.3f}")
            gaps.append((few.fidelity[count] - every.fidelity[count], few.agreement[count] - every.agreement[count]))
    fid, agr = map(list, zip(*gaps))
    print(f"\nranked minus all, over {len(gaps)} steps: fidelity mean {sum(fid) / len(fid):+.4f} "
          f"(from {min(fid):+.4f} to {max(fid):+.4f}), agreement mean {sum(agr) / len(agr):+.3f} "
          f"(from {min(agr):+.3f} to {max(agr):+.3f})")

    texts = samples["the page's"]  # the page's five curves, as app_pages.results.pruning.curves runs them
    start = time.perf_counter()
    means = model.head_means(texts) if ablation == "mean" else None
    full = full_run(model, texts)
    first = head_importance(model, texts, ablation=ablation, head_means=means, reference=full[0])
    importance_s = time.perf_counter() - start
    proxies, runs = attention_proxies(model.attend(texts)), {}
    for order, seed in [("importance", 0), ("random", 0), ("random", 1), ("random", 2), ("proxy", 0)]:
        pruning_curve(model, texts, order=order, seed=seed, ablation=ablation, head_means=means, proxies=proxies,
                      full=full, runs=runs, importance=first, rank_on=rank_on)
    print(f"\nthe page's importance {importance_s:.1f} s; with its five curves {time.perf_counter() - start:.1f} s "
          "(aim: the curves within 20 s of the page)")


if __name__ == "__main__":
    main()
