"""Queries & keys (analysis.qk_attribution.pictures): how long a head's picture takes over the built-in corpus, and how faithful each
projection is.

    python -m bench.bench_qk [--tsne HEADS] [--page]

On all-MiniLM-L6-v2 (from-scratch engine) and the built-in corpus (335 sentences):

- one head, vectors and picture (``qk_vectors`` + ``qk_embedding``), median of 5 heads: target <= 5 s;
- every head (``qk_heads`` + 72 ``qk_embedding``): target <= 60 s;
- faithfulness over the 72 heads for the fitted plane and for PCA (AttentionViz's plain version), and for
  the fitted plane fitted on half the sentences and measured on the other half (is it learning the corpus?);
- ``--tsne N``: t-SNE on the first N of the heads named in ``SINK_HEADS`` (tens of seconds each);
- ``--page``: the page's first run in AppTest and the bytes its charts send.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from analysis.qk_attribution.pictures import (QK, _fitted_planes, fit_weights, lifted, most_attended, nearest_keys, normalised, qk_embedding,
                         qk_embeddings, qk_heads, qk_vectors, word_queries)
from bench.common import machine
from models import head_label, load_model
from models.corpus import CORPUS

HEADS = [(0, 2), (1, 6), (2, 5), (3, 11), (5, 11)]
SINK_HEADS = [(0, 2), (3, 11), (5, 11)]


def half(qk: QK, keep: np.ndarray) -> QK:
    rows = np.isin(qk.tokens["sentence"].to_numpy(), keep)
    tokens = qk.tokens[rows].copy()
    tokens["sentence"] = np.searchsorted(keep, tokens["sentence"].to_numpy())
    return QK(qk.queries[rows], qk.keys[rows], tokens.reset_index(drop=True), [qk.sentences[i] for i in keep],
              qk.layer, qk.head, qk.causal)


def held_out(qk: QK) -> float:
    """Faithfulness on the odd sentences of a plane fitted on the even ones."""
    n = len(qk.sentences)
    train, test = half(qk, np.arange(0, n, 2)), half(qk, np.arange(1, n, 2))
    q, k = lifted(*normalised(train.queries, train.keys))
    target = most_attended(train)
    (plane,) = _fitted_planes([q], [k], [target], train.spans, train.causal, 0, [fit_weights(word_queries(train, target))])
    q, k = lifted(*normalised(test.queries, test.keys))
    return float((nearest_keys(q @ plane, k @ plane, test.spans, test.causal) == most_attended(test)).mean())


def page_bytes() -> None:
    import json

    from streamlit.testing.v1 import AppTest

    start = time.perf_counter()
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "headlens.py"), default_timeout=600)
    at.switch_page("app_pages/queries_keys.py")
    at.run()
    seconds = time.perf_counter() - start
    sizes = [len(el.proto.spec) for el in at.get("plotly_chart")]
    titles = [json.loads(el.proto.spec)["layout"]["title"]["text"][:40] for el in at.get("plotly_chart")]
    print(f"page, first run (model load, every head): {seconds:.1f} s; charts {', '.join(map(str, sizes))} bytes "
          f"= {sum(sizes) / 1e6:.2f} MB ({titles})")


def by_layer(heads: dict) -> list:
    """``qk_embeddings`` of each layer's heads side by side, as the page draws them."""
    layers = sorted({layer for layer, _ in heads})
    return [f for layer in layers for f in qk_embeddings([qk for (lay, _), qk in heads.items() if lay == layer])]


def smollm2() -> None:
    """Every head of SmolLM2 over the built-in corpus: the time (each layer's heads fitted side by side, and one
    head at a time), and how faithful the pictures are."""
    model = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="scratch")
    start = time.perf_counter()
    heads = qk_heads(model, list(CORPUS))
    read = time.perf_counter() - start
    frames = by_layer(heads)
    total = time.perf_counter() - start
    start = time.perf_counter()
    alone = [qk_embedding(qk) for qk in heads.values()]
    print(f"SmolLM2, the pictures of every head: {total - read:.1f} s a layer's heads side by side, "
          f"{time.perf_counter() - start:.1f} s one head at a time; the same faithfulness on "
          f"{sum(a.attrs['faithfulness'] == f.attrs['faithfulness'] for a, f in zip(alone, frames))} of {len(frames)} heads")
    faithful = np.array([f.attrs["faithfulness"] for f in frames])
    words = np.array([f.attrs["word_faithfulness"] for f in frames])
    share = np.array([f.attrs["word_share"] for f in frames])
    print(f"SmolLM2, every head: {total:.1f} s ({read:.1f} s reading vectors) for {len(frames)} heads, "
          f"{len(frames[0]) // 2} tokens; chance {frames[0].attrs['chance']:.3f}")
    print(f"  faithfulness mean {faithful.mean():.3f} median {np.median(faithful):.3f} min {faithful.min():.3f}; "
          f"word to word mean {np.nanmean(words):.3f} median {np.nanmedian(words):.3f} over a mean {share.mean():.2f} "
          f"of the queries (heads with a word share >= 0.1: {np.nanmean(words[share >= 0.1]):.3f}, "
          f"{int((share >= 0.1).sum())} heads)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tsne", type=int, default=0)
    parser.add_argument("--page", action="store_true")
    parser.add_argument("--page-only", action="store_true")
    parser.add_argument("--smollm2", action="store_true")
    args = parser.parse_args()
    print(machine())
    if args.page_only:
        return page_bytes()
    model = load_model(backend="scratch")
    sentences = list(CORPUS)
    qk_embedding(qk_vectors(model, sentences[:20], 0, 0))  # spaCy and torch warmed up

    times = []
    for layer, head in HEADS:
        start = time.perf_counter()
        frame = qk_embedding(qk_vectors(model, sentences, layer, head))
        times.append(time.perf_counter() - start)
    print(f"one head over {len(sentences)} sentences ({frame.attrs['chance']:.3f} chance, {len(frame) // 2} tokens): "
          f"median {statistics.median(times):.2f} s of {len(times)} heads (target <= 5 s)")

    start = time.perf_counter()
    heads = qk_heads(model, sentences)
    read = time.perf_counter() - start
    frames = dict(zip(heads, by_layer(heads)))
    total = time.perf_counter() - start
    print(f"every head: {total:.1f} s ({read:.1f} s reading vectors) for {len(frames)} heads (target <= 60 s)")

    fitted = np.array([f.attrs["faithfulness"] for f in frames.values()])
    plain = np.array([qk_embedding(qk, method="pca").attrs["faithfulness"] for qk in heads.values()])
    chance = next(iter(frames.values())).attrs["chance"]
    out = np.array([held_out(qk) for qk in heads.values()])
    for name, values in (("fitted plane", fitted), ("PCA (plain AttentionViz)", plain),
                         ("fitted on even sentences, measured on odd", out)):
        print(f"{name:42s} mean {values.mean():.3f}  median {np.median(values):.3f}  min {values.min():.3f}  "
              f"below chance {int((values < chance).sum())}  below 0.5 {int((values < 0.5).sum())}")
    for layer, head in SINK_HEADS:
        print(f"  L{layer} H{head}: fitted {fitted[layer * 12 + head]:.3f}, PCA {plain[layer * 12 + head]:.3f}")
    words = np.array([f.attrs["word_faithfulness"] for f in frames.values()])
    share = np.array([f.attrs["word_share"] for f in frames.values()])
    print(f"word to word (fitted): mean {np.nanmean(words):.3f} over a mean {share.mean():.2f} of the queries; "
          f"below 0.5 on {int((words < 0.5).sum())} heads")
    worst = np.argsort(fitted)[:4]
    print("  least faithful (fitted):", ", ".join(f"{head_label(*divmod(int(i), 12))} {fitted[i]:.2f}" for i in worst))

    for layer, head in SINK_HEADS[:args.tsne]:
        start = time.perf_counter()
        frame = qk_embedding(heads[(layer, head)], method="tsne")
        print(f"t-SNE L{layer} H{head}: {frame.attrs['faithfulness']:.3f} in {time.perf_counter() - start:.1f} s")
    if args.page:
        page_bytes()
    if args.smollm2:
        smollm2()


if __name__ == "__main__":
    main()
