"""Every head explained by its program: the time to explain every head over the built-in paragraphs (65 fit and 65
held out, about 126 tokens each in SmolLM2's tokens), and what the programs find there and on short sentences.

    python -m bench.bench_explanations [--model minilm] [--model smollm2] [--model gemma3] [--replace] [--memory]

For each model: ``explain_heads`` end to end on the paragraphs' halves (the default), the forward passes and spaCy's
parse included (the pipeline loaded first), its first call and a second one (the parse kept); aims: SmolLM2 <= 60 s,
MiniLM <= 10 s on two cores. Then: the share of heads explained (held-out score >= 0.7 with lift >= 3) on the
paragraphs and on the sentence corpus's halves (8 words a sentence), the mean IoU of the rows (content and whole;
aim for SmolLM2: whole rows >= 0.75), the families, the heads named in the docs, and a decoder's named heads again on
paragraphs said twice; with ``--replace``, the heads replaced by their programs' rows and mean-ablated on the held-out
paragraphs, best predicted first (a decoder's next-token loss and its perplexity's rise, an encoder's cosine; aims:
the best quarter raises SmolLM2's perplexity by <= 16%, and the program costs less than mean ablation at every k).
``--memory``: the most memory ``explain_heads`` holds above the loaded model, in a fresh process each, with its texts
attended 8 at a time (the default) and all 130 at once.
"""
from __future__ import annotations

import argparse
import math
import time

from analysis.explanations import corpus_halves, explain_heads, explained_share, replacement_curve
from analysis.roles.measure import load_spacy
from bench.common import machine, peak_in_fresh_process
from models import load_model
from models.corpus import CORPUS, paragraph_halves

MODELS = {"minilm": ("sentence-transformers/all-MiniLM-L6-v2", 10.0, [(0, 2), (5, 11), (2, 11)]),
          "smollm2": ("HuggingFaceTB/SmolLM2-135M-Instruct", 60.0, [(16, 0), (18, 6), (8, 0), (5, 3)]),
          "gemma3": ("google/gemma-3-270m", None, [])}
TWICE = 16  # paragraphs of each half said twice


def _summary(name: str, frame) -> str:
    return (f"  {name}: {explained_share(frame):.1%} of heads explained ({(frame['score'] >= 0.7).mean():.1%} with "
            f"score >= 0.7 alone); median score {frame['score'].median():.2f}; mean IoU {frame['iou'].mean():.2f} "
            f"content, {frame['iou_full'].mean():.2f} whole rows")


def peak_memory(name: str, batch_size: int) -> tuple[float, float]:
    """A fresh process explaining every head on the paragraphs, ``batch_size`` texts attended at a time: its resident
    memory (MiB) with the model loaded and spaCy's pipeline, and the most it held meanwhile."""
    return peak_in_fresh_process(
        "from analysis.explanations import explain_heads\nfrom analysis.roles.measure import load_spacy\n"
        f"from models import load_model\nmodel = load_model({name!r}, backend='scratch')\nload_spacy()",
        f"explain_heads(model, batch_size={batch_size}, replicates=100)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", choices=list(MODELS))
    ap.add_argument("--replace", action="store_true", help="the replacement curve on the held-out paragraphs too")
    ap.add_argument("--memory", action="store_true", help="the peak memory, 8 texts at a time and all at once")
    args = ap.parse_args()
    if args.memory:
        for key in args.model or list(MODELS):
            (rest, few), (_, every) = (peak_memory(MODELS[key][0], b) for b in (8, 130))
            print(f"{key}: explain_heads' peak above the loaded model ({rest:,.0f} MiB): {few - rest:,.0f} MiB "
                  f"attending 8 texts at a time, {every - rest:,.0f} MiB all 130 at once "
                  f"({(few - rest) / max(every - rest, 1):.2f}x)")
        return
    load_spacy()
    fit, held = paragraph_halves()
    print(f"# every head explained by its program, {machine('cpu')}")
    for key in args.model or list(MODELS):
        name, aim, known = MODELS[key]
        model = load_model(name, backend="scratch")
        model.attend(list(CORPUS[:8]))  # warm-up
        tokens = sum(model.token_counts(fit + held)) / len(fit + held)
        times, frame = [], None
        for _ in range(2):
            t = time.perf_counter()
            frame = explain_heads(model)  # the default: the paragraphs' halves
            times.append(time.perf_counter() - t)
        said = "" if aim is None else f"   aim <= {aim:.0f} s   {'met' if times[0] <= aim else 'NOT met'}"
        print(f"{key}: {model.n_layers * model.n_heads} heads over {len(fit)} fit + {len(held)} held-out paragraphs "
              f"({tokens:.0f} tokens each): {times[0]:.1f} s the first time, {times[1]:.1f} s again (the parse "
              f"kept){said}")
        print(_summary("held-out paragraphs", frame))
        print(_summary("sentence corpus's halves", explain_heads(model, *corpus_halves())))
        print("  families: " + ", ".join(f"{k} {v}" for k, v in frame["family"].value_counts().head(6).items()))
        print("  first rules: " + ", ".join(f"{k} {v}" for k, v in
                                           frame["rule"].str.split(" or ").str[0].value_counts().head(8).items()))
        rows = frame.set_index(["layer", "head"])
        for layer, head in known:
            r = rows.loc[(layer, head)]
            print(f"  L{layer} H{head}: {r['program']}; score {r['score']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}], lift "
                  f"{r['lift']:.1f}, IoU {r['iou']:.2f} / {r['iou_full']:.2f}")
        if model.causal and known:  # paragraphs said twice: a repeat gives induction and duplicates a cue
            twice = explain_heads(model, [f"{t} {t}" for t in fit[:TWICE]], [f"{t} {t}" for t in held[:TWICE]])
            twice = twice.set_index(["layer", "head"])
            print(f"  on {TWICE} + {TWICE} paragraphs said twice: " + "; ".join(
                f"L{layer} H{head} {twice.loc[(layer, head), 'program']}" for layer, head in known))
        if args.replace:
            quarter = round(len(frame) / 4)
            t = time.perf_counter()
            curve = replacement_curve(model, frame)
            seconds = time.perf_counter() - t
            row = curve[curve["k"] == quarter].iloc[0]
            if row["measure"] == "loss":
                rise = {c: math.exp(row[c] - row["unedited"]) - 1 for c in ("replaced", "mean_ablated")}
                print(f"  the best-predicted quarter ({quarter} heads) on the held-out paragraphs: loss "
                      f"{row['unedited']:.3f} -> replaced {row['replaced']:.3f} (perplexity {rise['replaced']:+.1%}), "
                      f"mean-ablated {row['mean_ablated']:.3f} ({rise['mean_ablated']:+.1%})   aim <= +16%   "
                      f"{'met' if rise['replaced'] <= 0.16 else 'NOT met'}")
            else:
                print(f"  the best-predicted quarter ({quarter} heads) on the held-out paragraphs: cosine to the "
                      f"unedited embedding, replaced {row['replaced']:.3f}, mean-ablated {row['mean_ablated']:.3f}")
            better = (curve["replaced"] < curve["mean_ablated"]) if row["measure"] == "loss" else (
                curve["replaced"] > curve["mean_ablated"])
            print("  curve (k: replaced / mean-ablated): " + ", ".join(
                f"{int(r.k)}: {r.replaced:.3f} / {r.mean_ablated:.3f}" for r in curve.itertuples())
                  + f"; the program costs less at {int(better.sum())} of {len(curve)} k; {seconds:.1f} s")


if __name__ == "__main__":
    main()
