"""Pruning curves, as Michel et al. (2019) draw them: 10% of the heads go per step, the least important first,
importance recomputed on the pruned model after each step; against random order and an order read from
attention alone. At each step the pruned model is measured on the same sentences: fidelity (mean cosine of
each embedding to the full model's), neighbour agreement (overlap of each sentence's nearest neighbours by
embedding with the full model's) or, for a language model, its next-token loss and top-1 agreement (the share
of next-token predictions equal to the full model's), and forward time.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from models import AttentionModel, HeadLensError
from models.memory import release_memory
from models.run import editable

from .ablation import ablation_means, cosines, neighbour_agreement
from .importance import attention_proxies, check_measure, head_importance

ORDERS = {"importance": "by importance, recomputed each step", "random": "at random (mean of 3 seeds)",
          "proxy": "by attention alone (most weight on [CLS]/[SEP] first)"}
Progress = Callable[[int, int], None]


def proxy_order(proxies: pd.DataFrame) -> list[tuple[int, int]]:
    """Heads from the least to the most important by attention alone: the most weight on special
    tokens first (a head parked on [CLS]/[SEP] does little), ties broken by higher entropy."""
    ranked = proxies.sort_values(["special", "entropy_norm"], ascending=[False, False], kind="stable")
    return [(int(r.layer), int(r.head)) for r in ranked.itertuples()]


def prune_counts(n_heads: int, step: float = 0.1) -> list[int]:
    """Heads pruned at each step: 0, then ``step`` of them more each time, up to all."""
    if not 0 < step <= 1:
        raise HeadLensError("The pruning step must be a fraction between 0 and 1.")
    fractions = np.append(np.arange(0.0, 1.0, step), 1.0)
    return sorted({int(round(f * n_heads)) for f in fractions})


def pruning_curve(model: AttentionModel, sentences: Sequence[str], *, order: str = "importance",
                  step: float = 0.1, seed: int = 0, ablation: str = "zero", head_means=None,
                  proxies: pd.DataFrame | None = None, measure: str = "embedding", full=None,
                  runs: dict | None = None, importance: pd.DataFrame | None = None, rank_on: int | None = None,
                  progress: Progress | None = None) -> pd.DataFrame:
    """Prune ``step`` of the heads at a time in ``order`` and measure each pruned model on ``sentences``.

    ``order``: "importance" (recomputed on the pruned model before each step: ablation importance
    against the full model's embeddings; for ``measure="loss"``, gradient importance, one backward
    pass where ablation would take one pass per head), "random" (a permutation drawn with ``seed``)
    or "proxy" (``proxy_order`` of ``proxies``, computed from the sentences when not given). With
    ``ablation="mean"`` a pruned head's mean output over the sentences is folded into its layer's
    output bias. Returns one row per step: ``order``, ``seed``, ``n_pruned``, ``fraction``, the
    measures (``fidelity`` and neighbour ``agreement``; for ``measure="loss"``, ``loss`` and top-1
    ``agreement``), ``forward_s`` (seconds to run the sentences) and ``heads`` (the pruned heads,
    ``(layer, head)`` pairs).

    ``full``: the full model's run of the sentences and its seconds, ``full_run(model, sentences, measure)``,
    for several curves over the same sentences to share; computed here when not given. ``runs``: a dict that
    several curves with the same ablation share, each pruned model's run kept under its set of heads, so that
    a set two curves reach (every head, at the end) is run once. ``importance``: the full model's, as the first
    step by importance would measure it (``head_importance`` with this ablation and measure), when already taken.
    ``rank_on``: the number of sentences, evenly spread (``ranking_rows``), that the steps by importance after
    the first re-measure the remaining heads on (every sentence when None); each pruned model is still measured
    on every sentence. On all-MiniLM-L6-v2, re-ranking on 32 of 100 gives curves whose fidelity is within 0.021 of
    re-ranking on all 100, 0.002 lower on average, in 0.4 of the time (``bench.bench_pruning --rank``).
    """
    model = editable(model, "Pruning switches heads off")
    check_measure(model, measure)
    if order not in ORDERS:
        raise HeadLensError(f"Unknown pruning order '{order}': choose one of {', '.join(ORDERS)}.")
    sentences = list(sentences)
    if len(sentences) < 2:
        raise HeadLensError("A pruning curve needs at least two sentences (neighbour agreement compares them).")
    if getattr(model, "pruned_heads", np.zeros(1)).any():
        raise HeadLensError("Start a pruning curve from a model without pruned heads.")
    means = ablation_means(model, sentences, ablation, head_means)
    total_heads = model.n_layers * model.n_heads
    counts = prune_counts(total_heads, step)
    rows_ranked = ranking_rows(len(sentences), rank_on)
    ranked_on = [sentences[i] for i in rows_ranked]
    work = curve_work(model, len(sentences), counts, order, measure, shared_full=full is not None,
                      n_ranked=len(rows_ranked))
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(min(done, work), work)

    if order == "random":
        rng = np.random.default_rng(seed)
        fixed = [(int(i) // model.n_heads, int(i) % model.n_heads) for i in rng.permutation(total_heads)]
    elif order == "proxy":
        fixed = proxy_order(proxies if proxies is not None else attention_proxies(model.attend(sentences)))
    if full is None:
        full = full_run(model, sentences, measure)
        tick(2 * len(sentences))  # it runs them twice, the second timed
    full, full_s = full
    if len(ranked_on) == len(sentences):
        reference = full
    else:  # the full model's embeddings of those rows; a loss's gradient importance needs no reference
        reference = None if measure == "loss" else full[rows_ranked]
    pruned: list[tuple[int, int]] = []
    current = model
    rows = []
    for count in counts:
        if count > len(pruned):
            need = count - len(pruned)
            if order == "importance" and count < total_heads:
                if not pruned and importance is not None:  # the full model's, measured already
                    imp = importance
                    tick(len(sentences) * (1 if measure == "loss" else total_heads))  # the measurement it stands for
                else:  # the first step on every sentence (the importance the page shows), the later on the rows
                    release_memory()
                    before = done
                    imp = head_importance(current, ranked_on if pruned else sentences,
                                          method="gradient" if measure == "loss" else "ablation",
                                          ablation="mean" if means is not None else "zero", head_means=means,
                                          reference=reference if pruned else full, measure=measure,
                                          progress=lambda d, t: tick(before + d - done))
                ranked = imp[~imp["pruned"]].sort_values("importance", kind="stable")
                chosen = [(int(r.layer), int(r.head)) for r in ranked.head(need).itertuples()]
            elif order == "importance":
                chosen = [(int(l), int(h)) for l, h in zip(*np.nonzero(current.pruned_heads == 0))]
            else:
                chosen = fixed[len(pruned):count]
            pruned += chosen
            current = None  # the last pruned copy goes before the next is made
            current = model.pruned(pruned, head_means=means)
        if count == 0:
            out, seconds = full, full_s
        elif runs is not None and frozenset(pruned) in runs:  # run by an earlier curve
            out, seconds = runs[frozenset(pruned)]
            tick(len(sentences))
        else:
            release_memory()  # what the last run and importance freed, scattered through the heap, goes back first
            start = time.perf_counter()
            out = _run(current, sentences, measure)
            seconds = time.perf_counter() - start
            tick(len(sentences))
            if runs is not None:
                runs[frozenset(pruned)] = (out, seconds)
        measured = ({"loss": out[0], "agreement": float(np.mean(out[1] == full[1]))} if measure == "loss" else
                    {"fidelity": float(cosines(full, out).mean()), "agreement": neighbour_agreement(full, out)})
        rows.append({"order": order, "seed": seed if order == "random" else None, "n_pruned": count,
                     "fraction": count / total_heads, **measured, "forward_s": seconds, "heads": sorted(pruned)})
    return pd.DataFrame(rows)


def ranking_rows(n_sentences: int, rank_on: int | None = None) -> list[int]:
    """The rows of ``n_sentences`` that a curve re-ranks heads on: ``rank_on`` of them evenly spread, first and
    last included (all when ``rank_on`` is None or at least ``n_sentences``)."""
    if rank_on is None or rank_on >= n_sentences:
        return list(range(n_sentences))
    if rank_on < 2:
        raise HeadLensError("Re-ranking the heads needs at least two sentences.")
    return sorted({int(i) for i in np.linspace(0, n_sentences - 1, rank_on).round()})


def _run(model: AttentionModel, sentences: list[str], measure: str):
    return model.predictions(sentences) if measure == "loss" else model.embed(sentences)


def full_run(model: AttentionModel, sentences: Sequence[str], measure: str = "embedding") -> tuple:
    """The full model's run of ``sentences`` (its embeddings, or its loss and predictions) and the seconds it
    took, timed on a second run as every pruned model is timed after the first has run."""
    model, sentences = editable(model, "Pruning switches heads off"), list(sentences)
    out = _run(model, sentences, measure)
    start = time.perf_counter()
    _run(model, sentences, measure)
    return out, time.perf_counter() - start


def curve_work(model: AttentionModel, n_sentences: int, counts: list[int], order: str,
               measure: str = "embedding", shared_full: bool = False, n_ranked: int | None = None) -> int:
    """Units of work of ``pruning_curve`` (sentences run, once per variant), for a progress bar; with
    ``shared_full``, the full model's two runs are given; ``n_ranked``: the sentences heads are re-ranked on
    (``ranking_rows``), all when None."""
    evals = (len(counts) - 1 if shared_full else len(counts) + 1) * n_sentences  # the full model runs twice
    if order != "importance":
        return evals
    ranked = n_sentences if n_ranked is None else n_ranked  # the first step runs every sentence, the later ones these
    if measure == "loss":  # gradient importance: one pass over the sentences per step
        return evals + n_sentences + (len(counts) - 3) * ranked
    total = model.n_layers * model.n_heads
    return evals + total * n_sentences + sum(total - c for c in counts[1:-2]) * ranked  # the last takes what is left


def curve_summary(curves: pd.DataFrame) -> pd.DataFrame:
    """``pruning_curve`` rows as one row per order and step, random order averaged over its seeds (``runs``)."""
    measures = {c: (c, "mean") for c in ("fidelity", "loss", "agreement") if c in curves}
    return (curves.groupby(["order", "n_pruned"], sort=False)
            .agg(fraction=("fraction", "first"), **measures, forward_s=("forward_s", "mean"),
                 runs=("fraction", "size"))
            .reset_index())


def point_comparison(summary: pd.DataFrame, n_pruned: int) -> pd.DataFrame:
    """``curve_summary`` at ``n_pruned`` heads, one row per order: ``order``, the measures (``fidelity`` or
    ``loss``, ``agreement``), ``forward_s`` and ``speed`` (forward time over that order's unpruned forward time)."""
    here = summary[summary["n_pruned"] == n_pruned].set_index("order")
    full = summary[summary["n_pruned"] == 0].set_index("order")["forward_s"].reindex(here.index)
    columns = [c for c in ("fidelity", "loss", "agreement") if c in here] + ["forward_s"]
    return here[columns].assign(speed=here["forward_s"] / full).reset_index()
