"""Circuits over a task: every edge between the model's nodes scored over the task's pairs (EAP or EAP-IG,
``graph``), the top edges run as a circuit with every other edge carrying the corrupted run, its
faithfulness with an interval, the curve over circuit sizes and the smallest circuit reaching ``TARGET``; exact
edge patching of chosen edges, and path patching of one head to chosen receivers (Wang et al. 2022).

Faithfulness is the circuit's metric over the model's, each counted from the corrupted prompts':
``mean(circuit - corrupted) / mean(clean - corrupted)`` over the pairs, 1 for the whole model, 0 for no edge, with
a bootstrap interval over the pairs (``analysis.stats.interval``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from models import AttentionModel, HeadLensError, head_label
from models.run import device_of, patching_stack

from ..stats import interval
from ..tasks.effects import batches, measure_for
from ..tasks.pairs import Task
from . import graph as C

METHODS = {"eap": "EAP: the gradient at the clean input (Syed et al. 2023)",
           "eap_ig": "EAP-IG: gradients along steps from the corrupted input (Hanna et al. 2024)"}
EDGE_KINDS = {"q": "queries", "k": "keys", "v": "values", "mlp": "MLP inputs", "logits": "logits"}
STEPS = 5           # EAP-IG's default
BATCH_PAIRS = 16    # pairs run together: a batch holds every sender's output and every receiver's gradient
TARGET = 0.8        # the faithfulness the smallest circuit is asked to reach
SIZES = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

Progress = Callable[[int, int], None]


def _stack_graph(model: AttentionModel):
    """The stack a circuit's runs go up (a language model's or an encoder's), its device and its graph."""
    stack = patching_stack(model, "A circuit's edges are traced")
    return stack, device_of(stack), C.graph_of(stack)


def _batch(task: Task, idx: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    pairs = [task.pairs[i] for i in idx]
    return (torch.tensor([p.clean_ids for p in pairs], device=device),
            torch.tensor([p.corrupted_ids for p in pairs], device=device), torch.as_tensor(idx, device=device))


def _check(task: Task) -> None:
    if not len(task):
        raise HeadLensError("The task has no pairs.")


@dataclass(frozen=True)
class EdgeScores:
    """Every edge's score averaged over a task's pairs: the estimated fall of the metric when the edge carries the
    corrupted run's output (``scores`` ``(senders, receivers)`` float64, zero where a pair is not an edge), and each
    pair's ``clean`` and ``corrupted`` metric."""

    task: Task
    metric: str
    method: str
    steps: int
    graph: C.Graph
    scores: np.ndarray
    clean: np.ndarray
    corrupted: np.ndarray

    def ranked(self, kinds=None) -> tuple[np.ndarray, np.ndarray]:
        """The edges (sender and receiver indices) of the receiver ``kinds`` (default every kind), largest |score|
        first."""
        mask = self.graph.mask()
        if kinds is not None:
            wanted = np.array([k in kinds for k, _, _ in self.graph.receivers])
            mask &= wanted[None, :]
        s, r = np.nonzero(mask)
        order = np.argsort(-np.abs(self.scores[s, r]), kind="stable")
        return s[order], r[order]

    def top(self, n: int, kinds=None) -> np.ndarray:
        """``(senders, receivers)`` float32: 1 on the ``n`` edges of largest |score|."""
        s, r = self.ranked(kinds)
        keep = np.zeros(self.scores.shape, dtype=np.float32)
        keep[s[:n], r[:n]] = 1
        return keep

    def frame(self, n: int | None = None, kinds=None) -> pd.DataFrame:
        """One row per edge, largest |score| first (the first ``n``): sender, receiver, kind, layers, score and the
        score as a share of the mean clean − corrupted span."""
        s, r = self.ranked(kinds)
        if n is not None:
            s, r = s[:n], r[:n]
        g = self.graph
        span = float(np.mean(self.clean - self.corrupted))
        return pd.DataFrame({
            "rank": np.arange(1, len(s) + 1), "sender": [g.sender_name(i) for i in s],
            "receiver": [g.receiver_name(i) for i in r], "kind": [g.receivers[i][0] for i in r],
            "sender_layer": [g.senders[i][1] for i in s], "receiver_layer": [g.receivers[i][1] for i in r],
            "score": self.scores[s, r], "share": self.scores[s, r] / span if span else np.nan,
            "sender_index": s, "receiver_index": r})


def edge_scores(model: AttentionModel, task: Task, method: str = "eap_ig", steps: int = STEPS,
                metric: str | None = None, *, batch_pairs: int = BATCH_PAIRS,
                progress: Progress | None = None) -> EdgeScores:
    """Every edge of ``model``'s graph scored over ``task`` by ``method`` (``METHODS``; EAP-IG with ``steps``)."""
    if method not in METHODS:
        raise HeadLensError(f"Unknown method '{method}': choose {' or '.join(map(repr, METHODS))}.")
    if method == "eap_ig" and not 1 <= int(steps) <= 100:
        raise HeadLensError(f"EAP-IG takes 1 to 100 steps; {steps} were asked for.")
    _check(task)
    stack, device, graph = _stack_graph(model)
    metric = metric or task.metric
    measure = measure_for(model, task, metric)
    k = int(steps) if method == "eap_ig" else 1
    total = torch.zeros(len(graph.senders), len(graph.receivers), dtype=torch.float64)
    clean, corrupted, done = np.zeros(len(task)), np.zeros(len(task)), 0
    for idx in batches(task, batch_pairs):
        good, bad, rows = _batch(task, idx, device)
        each_step = None if progress is None else (  # a progress point after each run of the batch
            lambda j, done=done, size=len(idx): progress(done + size * j / (k + 1), len(task)))
        scores, c, b = C.edge_attribution(stack, graph, good, bad, measure, rows, steps=k, each_step=each_step)
        total += scores.double().cpu()
        clean[idx], corrupted[idx] = c.value.double().cpu().numpy(), b.value.double().cpu().numpy()
        done += len(idx)
        if progress is not None:
            progress(done, len(task))
    return EdgeScores(task, metric, method, k, graph, (total / len(task)).numpy(), clean, corrupted)


@dataclass(frozen=True)
class Curve:
    """Circuits of the top ``sizes`` edges run over a task: ``values`` ``(pairs, sizes)`` each pair's metric with
    only the circuit's edges clean; ``faithfulness``, ``low``, ``high`` ``(sizes,)``."""

    sizes: np.ndarray
    values: np.ndarray
    clean: np.ndarray
    corrupted: np.ndarray
    faithfulness: np.ndarray
    low: np.ndarray
    high: np.ndarray

    def smallest(self, target: float = TARGET) -> int | None:
        """The fewest edges whose circuit's faithfulness reaches ``target`` (None: no size tried does)."""
        reached = np.flatnonzero(self.faithfulness >= target)
        return int(self.sizes[reached[0]]) if len(reached) else None

    def at(self, size: int) -> "Curve":
        """The curve at one of its sizes alone."""
        i = [int(np.flatnonzero(self.sizes == size)[0])]
        return Curve(self.sizes[i], self.values[:, i], self.clean, self.corrupted, self.faithfulness[i], self.low[i],
                     self.high[i])

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"edges": self.sizes, "faithfulness": self.faithfulness, "low": self.low,
                             "high": self.high})


def default_sizes(n_edges: int) -> np.ndarray:
    """``SIZES`` up to the graph's edges, the whole graph last."""
    return np.array(sorted({s for s in SIZES if s < n_edges} | {n_edges}))


def faithfulness(model: AttentionModel, scores: EdgeScores, sizes=None, kinds=None, *, seed: int = 0,
                 batch_pairs: int = BATCH_PAIRS, progress: Progress | None = None) -> Curve:
    """The circuit of the top ``n`` edges (of the receiver ``kinds``) for each ``n`` of ``sizes`` (default
    ``default_sizes``) run over the pairs ``scores`` were taken on, every other edge carrying the corrupted run's
    output."""
    sizes = default_sizes(scores.graph.n_edges) if sizes is None else np.asarray(sorted({int(s) for s in sizes}))
    values, clean, corrupted = circuit_values(model, scores, sizes, kinds, batch_pairs=batch_pairs,
                                              progress=progress)
    return curve_of(sizes, values, clean, corrupted, seed=seed)


def circuit_values(model: AttentionModel, scores: EdgeScores, sizes, kinds=None, *, batch_pairs: int = BATCH_PAIRS,
                   progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, clean, corrupted)``: each pair's metric ``(pairs, sizes)`` with only the top ``sizes`` edges clean,
    and its clean and corrupted metric."""
    task = scores.task
    stack, device, graph = _stack_graph(model)
    if graph.senders != scores.graph.senders or graph.receivers != scores.graph.receivers:
        raise HeadLensError("These edge scores were taken on another model's graph.")
    sizes = np.asarray(sizes)
    if not len(sizes) or sizes.min() < 0:
        raise HeadLensError("Give circuit sizes of 0 edges or more.")
    measure = measure_for(model, task, scores.metric)
    keeps = [torch.as_tensor(scores.top(int(n), kinds), device=device) for n in sizes]
    whole = [int(keep.sum()) == graph.n_edges for keep in keeps]  # every edge in: the clean run itself
    values, clean, corrupted = np.zeros((len(task), len(sizes))), np.zeros(len(task)), np.zeros(len(task))
    done = 0
    for idx in batches(task, batch_pairs):
        good, bad_ids, rows = _batch(task, idx, device)
        with torch.inference_mode():
            bad = C.run_ids(stack, graph, bad_ids, measure, rows)
            clean[idx] = scores.clean[idx]  # the clean run's metric, taken with the scores
            corrupted[idx] = bad.value.double().cpu().numpy()
            for j, keep in enumerate(keeps):
                values[idx, j] = clean[idx] if whole[j] else \
                    C.circuit_values(stack, graph, good, bad, keep, measure, rows).double().cpu()
                if progress is not None:
                    progress(done * len(sizes) + (j + 1) * len(idx), len(task) * len(sizes))
        done += len(idx)
    return values, clean, corrupted


def curve_of(sizes, values: np.ndarray, clean: np.ndarray, corrupted: np.ndarray, seed: int = 0) -> Curve:
    """The faithfulness at each size, ``mean(circuit - corrupted) / mean(clean - corrupted)``, with its interval."""
    span = clean - corrupted
    if abs(float(span.mean())) < 1e-12:
        raise HeadLensError("The clean and corrupted prompts score the same on average: there is nothing for a "
                            "circuit to recover.")
    faith = (values - corrupted[:, None]).mean(0) / span.mean()
    low, high = interval(values - corrupted[:, None], span, seed=seed)
    return Curve(np.asarray(sizes), values, clean, corrupted, faith, low, high)


def exact_edges(model: AttentionModel, task: Task, edges, metric: str | None = None, *,
                batch_pairs: int = BATCH_PAIRS, progress: Progress | None = None) -> np.ndarray:
    """``(pairs, edges)``: exact edge patching, the fall of each pair's metric when the edge (a ``(sender,
    receiver)`` index pair of the graph) alone carries the corrupted run's output, every other edge clean."""
    _check(task)
    stack, device, graph = _stack_graph(model)
    edges = [(int(s), int(r)) for s, r in edges]
    mask = graph.mask()
    if any(not (0 <= s < mask.shape[0] and 0 <= r < mask.shape[1] and mask[s, r]) for s, r in edges):
        raise HeadLensError("Each edge runs from a sender to a later receiver of this model's graph.")
    measure = measure_for(model, task, metric or task.metric)
    out, done = np.zeros((len(task), len(edges))), 0
    for idx in batches(task, batch_pairs):
        good, bad_ids, rows = _batch(task, idx, device)
        with torch.inference_mode():
            bad = C.run_ids(stack, graph, bad_ids, measure, rows)
            clean = C.run_ids(stack, graph, good, measure, rows)
            for j, edge in enumerate(edges):
                patched = C.patched_values(stack, graph, clean, bad, [edge], measure, rows)
                out[idx, j] = (clean.value - patched).double().cpu().numpy()
                if progress is not None:
                    progress(done * len(edges) + (j + 1) * len(idx), len(task) * len(edges))
        done += len(idx)
    return out


def receiver_index(graph: C.Graph, layer: int, head: int, kind: str) -> int:
    """The receiver of head ``(layer, head)``'s ``kind`` input ("q", "k" or "v": its key/value head's)."""
    if kind not in ("q", "k", "v"):
        raise HeadLensError(f"A head's inputs are its queries, keys and values (q, k, v), not '{kind}'.")
    if kind != "q":
        groups = [g for g, heads in enumerate(graph.reads[layer]) if head in heads] if 0 <= layer < graph.n_layers \
            else []
        head = groups[0] if groups else -1
    for r, node in enumerate(graph.receivers):
        if node == (kind, layer, head):
            return r
    raise HeadLensError(f"{head_label(layer, head)} is not a head of this model's graph.")


def sender_index(graph: C.Graph, layer: int, head: int) -> int:
    try:
        return graph.senders.index(("head", layer, head))
    except ValueError:
        raise HeadLensError(f"{head_label(layer, head)} is not a head of this model (or it was pruned).") from None


@dataclass(frozen=True)
class PathPatch:
    """A sender head's direct paths to receivers patched (Wang et al. 2022): ``effects`` ``(pairs,)`` the fall of
    each pair's metric when those edges alone carry the sender's corrupted output; ``share`` its mean over the
    mean clean − corrupted span, with ``low``, ``high``."""

    sender: str
    receivers: tuple[str, ...]
    effects: np.ndarray
    span: np.ndarray
    share: float
    low: float
    high: float


def path_patching(model: AttentionModel, task: Task, sender: tuple[int, int], receivers, kinds=("q",),
                  metric: str | None = None, *, batch_pairs: int = BATCH_PAIRS, seed: int = 0) -> PathPatch:
    """Head ``sender`` ``(layer, head)``'s output, as the corrupted prompts form it, sent to the ``kinds`` inputs
    ("q", "k", "v") of the ``receivers`` ``[(layer, head), ...]`` (heads above it) and nowhere else: the fall of the
    metric per pair."""
    stack, device, graph = _stack_graph(model)
    s = sender_index(graph, *sender)
    edges = sorted({(s, receiver_index(graph, layer, head, kind)) for layer, head in receivers for kind in kinds})
    if not edges:
        raise HeadLensError("Choose at least one receiving head and input.")
    if any(graph.reach[r] <= s for _, r in edges):
        raise HeadLensError(f"{graph.sender_name(s)} writes only to heads in later layers; choose receivers above it.")
    measure = measure_for(model, task, metric or task.metric)
    effects, span = np.zeros(len(task)), np.zeros(len(task))
    for idx in batches(task, batch_pairs):
        good, bad_ids, rows = _batch(task, idx, device)
        with torch.inference_mode():
            bad = C.run_ids(stack, graph, bad_ids, measure, rows)
            clean = C.run_ids(stack, graph, good, measure, rows)
            patched = C.patched_values(stack, graph, clean, bad, edges, measure, rows)
        effects[idx] = (clean.value - patched).double().cpu().numpy()
        span[idx] = (clean.value - bad.value).double().cpu().numpy()
    low, high = interval(effects[:, None], span, seed=seed)
    names = tuple(graph.receiver_name(r) for _, r in edges)
    return PathPatch(graph.sender_name(s), names, effects, span, float(effects.mean() / span.mean()),
                     float(low[0]), float(high[0]))
