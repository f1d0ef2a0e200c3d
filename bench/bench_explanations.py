"""Every head explained: the time to explain every head over 300 fit and 300 held-out sentences, and what the
explanations find on the built-in corpus's halves (the app's default).

    python -m bench.bench_explanations [--model minilm] [--model smollm2] [--model gemma3] [--replace]

For each model: ``explain_heads`` end to end on 600 sentences (the built-in corpus, each copy after the first
numbered so that no two are the same; alternate ones fitted and held out), the forward passes and spaCy's parse
included (the pipeline loaded first), its first call and a second one (the parse kept); aims: SmolLM2 <= 60 s, MiniLM
<= 10 s on two cores. Then the default explanations: the share of heads explained (held-out score >= 0.7), the rule
families, the heads named in the docs, and a decoder's named heads again on sentences said twice; with
``--replace``, the best-explained quarter of the heads replaced by their rules and mean-ablated on the held-out half
(a decoder's next-token loss and its perplexity's rise, an encoder's cosine), and the whole replacement curve's time.
"""
from __future__ import annotations

import argparse
import math
import time

from analysis.explanations import EXPLAINED, corpus_halves, explain_heads, explained_share, replacement_curve
from analysis.roles.measure import load_spacy
from bench.common import machine
from models import load_model
from models.corpus import CORPUS

MODELS = {"minilm": ("sentence-transformers/all-MiniLM-L6-v2", 10.0, [(0, 2), (5, 11), (2, 11)]),
          "smollm2": ("HuggingFaceTB/SmolLM2-135M-Instruct", 60.0, [(16, 0), (18, 6), (8, 0)]),
          "gemma3": ("google/gemma-3-270m", None, [])}
SENTENCES = 600
REPEATED = 80  # sentences of each half said twice


def texts(n: int = SENTENCES) -> list[str]:
    base = list(CORPUS)
    return [base[s] if not copy else f"{base[s]} ({copy})" for copy, s in (divmod(i, len(base)) for i in range(n))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", choices=list(MODELS))
    ap.add_argument("--replace", action="store_true", help="the replacement of the best-explained quarter as well")
    args = ap.parse_args()
    load_spacy()
    print(f"# every head explained, {machine('cpu')}")
    for key in args.model or list(MODELS):
        name, aim, known = MODELS[key]
        model = load_model(name, backend="scratch")
        model.attend(list(CORPUS[:8]))  # warm-up
        all_texts = texts()
        fit, held = all_texts[0::2], all_texts[1::2]
        times = []
        for _ in range(2):
            t = time.perf_counter()
            explain_heads(model, fit, held)
            times.append(time.perf_counter() - t)
        said = "" if aim is None else f"   aim <= {aim:.0f} s   {'met' if times[0] <= aim else 'NOT met'}"
        print(f"{key}: {model.n_layers * model.n_heads} heads over {len(fit)} fit + {len(held)} held-out sentences: "
              f"{times[0]:.1f} s the first time, {times[1]:.1f} s again (the parse kept){said}")
        frame = explain_heads(model)  # the app's default: the built-in corpus's halves
        print(f"  built-in corpus's halves: {explained_share(frame):.1%} of heads explained (>= {EXPLAINED}); "
              f"median score {frame['score'].median():.2f}")
        print("  families: " + ", ".join(f"{k} {v}" for k, v in frame["family"].value_counts().items()))
        print("  rules: " + ", ".join(f"{k} {v}" for k, v in frame["rule"].value_counts().head(6).items()))
        rows = frame.set_index(["layer", "head"])
        for layer, head in known:
            r = rows.loc[(layer, head)]
            print(f"  L{layer} H{head}: {r['rule']}, {r['score']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}], lift "
                  f"{r['lift']:.2f}, over {r['positional']} {r['lift_positional']:.2f}x, sink {r['sink_share']:.0%}")
        if model.causal and known:  # on sentences said twice, where a repeat gives induction and duplicates a cue
            fit, held = (corpus_halves()[i][:REPEATED] for i in (0, 1))
            twice = explain_heads(model, [f"{t} {t}" for t in fit], [f"{t} {t}" for t in held])
            twice = twice.set_index(["layer", "head"])
            print(f"  on {REPEATED} + {REPEATED} sentences said twice: " + "; ".join(
                f"L{layer} H{head} {twice.loc[(layer, head), 'rule']} {twice.loc[(layer, head), 'score']:.2f}"
                for layer, head in known))
        if args.replace:
            quarter = round(len(frame) / 4)
            t = time.perf_counter()
            curve = replacement_curve(model, frame)
            seconds = time.perf_counter() - t
            row = curve[curve["k"] == quarter].iloc[0]
            if row["measure"] == "loss":
                rise = {c: math.exp(row[c] - row["unedited"]) - 1 for c in ("replaced", "mean_ablated")}
                print(f"  the best-explained quarter ({quarter} heads) on the held-out half: loss "
                      f"{row['unedited']:.3f} -> replaced {row['replaced']:.3f} (perplexity {rise['replaced']:+.1%}), mean-ablated "
                      f"{row['mean_ablated']:.3f} ({rise['mean_ablated']:+.1%})")
            else:
                print(f"  the best-explained quarter ({quarter} heads) on the held-out half: cosine to the unedited "
                      f"embedding, replaced {row['replaced']:.3f}, mean-ablated {row['mean_ablated']:.3f}")
            print("  curve (k: replaced / mean-ablated): " + ", ".join(
                f"{int(r.k)}: {r.replaced:.3f} / {r.mean_ablated:.3f}" for r in curve.itertuples())
                  + f"; {seconds:.1f} s")


if __name__ == "__main__":
    main()
