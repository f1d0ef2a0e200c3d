"""Raw attention against attention weighted by what each key sends (``value_norms``, Kobayashi et al. 2020).

    python -m bench.bench_value_norms [--sentences N]

On N sentences spread over the built-in corpus (100 by default): for all-MiniLM-L6-v2, the share of
each layer's attention on [CLS] and [SEP], raw and weighted; for SmolLM2, the share on the first
token (the sink), raw and weighted, by layer and over all layers. A share is a mean over the
queries (for SmolLM2, those after the first) of the row's weight on those keys over the row's total.
"""
from __future__ import annotations

import argparse

import numpy as np

from bench.common import machine
from models import load_model
from models.corpus import CORPUS


def shares(model, sentences, keys, first_query: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: mean share of the rows' attention on ``keys(att)``, raw and weighted by what keys send."""
    raw, moved = [], []
    for text in sentences:
        att = model.attend(text)
        norms = model.value_norms(text)
        k = keys(att)
        for out, w in ((raw, att.weights), (moved, norms)):
            rows = w[..., first_query:, :]
            out.append((rows[..., k].sum(-1) / rows.sum(-1)).mean(axis=(1, 2)))
    return np.mean(raw, axis=0), np.mean(moved, axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=100)
    args = parser.parse_args()
    print(machine())
    sentences = [CORPUS[i] for i in np.linspace(0, len(CORPUS) - 1, args.sentences).round().astype(int)]
    minilm = load_model(backend="scratch")
    raw, moved = shares(minilm, sentences, lambda att: np.asarray(att.special, bool), 0)
    print("all-MiniLM-L6-v2, share on [CLS] and [SEP] by layer (raw -> weighted):")
    print("  " + ", ".join(f"L{i} {r:.2f} -> {m:.2f}" for i, (r, m) in enumerate(zip(raw, moved))))
    llm = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="scratch")
    first = lambda att: np.arange(len(att.tokens)) == 0  # noqa: E731
    raw, moved = shares(llm, sentences, first, 1)
    print(f"SmolLM2, share on the first token over all layers: raw {raw.mean():.2f}, weighted {moved.mean():.2f}")
    print("  by layer: " + ", ".join(f"L{i} {r:.2f} -> {m:.2f}" for i, (r, m) in enumerate(zip(raw, moved))))


if __name__ == "__main__":
    main()
