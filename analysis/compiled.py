"""Every analysis scored against a compiled program's known algorithm (``models.compiled.ground_truth``).

- Circuits: each edge's score over the program's one-token pairs (EAP, EAP-IG, exact edge patching) against the
  true edges: the area under the ROC curve (``edge_auroc``; the ACDC paper's measure, Conmy et al. 2023), over
  every true edge and over those a one-token corruption moves (``moved``), and whether the smallest circuit
  keeping 80% of the difference holds them.
- Effects: each head patched alone, the share of the difference it recovers beside whether the truth puts it on
  the path to the output (``head_recovery``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dataclasses import replace

from models import HeadLensError
from models.compiled_truth import EMBED, block_at, block_name

from .circuits import edge_scores, exact_edges, faithfulness

RECEIVER_KIND = {"q": "q", "k": "k", "v": "v", "mlp": "mlp", "output": "logits"}


def _sender(graph, name: str) -> int:
    """A truth's sender (``embed``, ``L1 H0``, ``L0 MLP``) as the circuit graph's index."""
    if name == EMBED:
        return next(s for s, (kind, _, _) in enumerate(graph.senders) if kind == "input")
    layer, head = block_at(name)
    for s, (kind, at, index) in enumerate(graph.senders):
        if (kind, at) == ("mlp" if head is None else "head", layer) and (head is None or index == head):
            return s
    raise HeadLensError(f"No sender {name} in the circuit graph.")


def _receiver(graph, name: str, part: str) -> int:
    kind = RECEIVER_KIND[part]
    for r, (k, layer, index) in enumerate(graph.receivers):
        if k != kind:
            continue
        if kind == "logits" or (kind == "mlp" and name == block_name(layer)):
            return r
        if kind in ("q", "k", "v") and graph.receiver_node_name(r) == name:
            return r
    raise HeadLensError(f"No receiver {name}.{part} in the circuit graph.")


def true_edges(graph, truth) -> np.ndarray:
    """``(senders, receivers)`` bool: the graph's edges that the truth names (``Truth.edges``)."""
    out = np.zeros((len(graph.senders), len(graph.receivers)), dtype=bool)
    for e in truth.edges.itertuples():
        out[_sender(graph, e.sender), _receiver(graph, e.receiver, e.input)] = True
    return out & graph.mask()


def moved(model, task, graph) -> np.ndarray:
    """``(senders, receivers)`` bool: the edges whose receiver reads something different in a pair's two runs, on
    some pair: the sender's outputs differ where the receiver's input weights look (a head's query, key or value
    projection, a feed-forward's first layer, the unembedding). An edge carrying what both inputs share (the
    positions, the BOS) is one no patching from a corrupted input can move, whatever the method."""
    import torch

    from models.run import stack_of

    from .circuits.graph import run_ids

    stack = stack_of(model, "A circuit's edges are traced")
    clean = torch.tensor([p.clean_ids for p in task.pairs])
    corrupted = torch.tensor([p.corrupted_ids for p in task.pairs])
    rows, measure = torch.arange(len(task)), lambda stack, x, rows: x[:, -1, 0]
    with torch.inference_mode():
        diff = run_ids(stack, graph, clean, measure, rows).outs - run_ids(stack, graph, corrupted, measure, rows).outs
    out = np.zeros((len(graph.senders), len(graph.receivers)), dtype=bool)
    for r, (kind, layer, index) in enumerate(graph.receivers):
        w = stack.unembedding() if kind == "logits" else stack.layers[layer].input_weights(kind, index)  # (d, E)
        seen = torch.einsum("sbne,de->sbnd", diff, w.to(diff.dtype)).abs().amax(dim=(1, 2, 3))
        out[:, r] = (seen > 1e-6).numpy()
    return out & graph.mask()


def auroc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The area under the ROC curve of ``scores`` (larger: more likely an edge) against ``positive``: the chance a
    true edge scores above a false one, ties counting half (Mann-Whitney)."""
    pos, neg = scores[positive], scores[~positive]
    if not len(pos) or not len(neg):
        return float("nan")
    ranks = pd.Series(np.concatenate([pos, neg])).rank().to_numpy()
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def edge_auroc(model, task, truth, methods=("eap", "eap_ig", "exact")) -> pd.DataFrame:
    """Per method: the edge AUROC of its scores' sizes against the true edges, and the smallest circuit keeping
    80% of the difference (by the method's order) with whether it holds every true edge."""
    rows, scored = [], {}
    for method in methods:  # exact patching takes EAP's scores for its graph and pairs, computed once
        gradient = "eap" if method == "exact" else method
        if gradient not in scored:
            scored[gradient] = edge_scores(model, task, gradient)
        scores = scored[gradient]
        graph, mask = scores.graph, scores.graph.mask()
        if not rows:
            positive, moved_edges = true_edges(graph, truth), moved(model, task, graph)
        if method == "exact":
            edges = np.argwhere(mask)
            fall = exact_edges(model, task, edges).mean(0)
            values = np.zeros(mask.shape)
            values[edges[:, 0], edges[:, 1]] = fall
        else:
            values = scores.scores
        strength = np.abs(values[mask])
        order = np.argsort(-np.abs(values), axis=None)
        ranked = [(int(i // mask.shape[1]), int(i % mask.shape[1])) for i in order if mask.flat[i]]
        sizes = np.arange(1, len(ranked) + 1)
        curve = faithfulness(model, replace(scores, scores=values), sizes)
        smallest = curve.smallest()
        kept = set(ranked[:smallest]) if smallest else set()
        held = all((int(s), int(r)) in kept for s, r in np.argwhere(positive)) if smallest else False
        movable = positive & moved_edges
        held_moved = all((int(s), int(r)) in kept for s, r in np.argwhere(movable)) if smallest else False
        negatives = mask & ~positive
        rows.append({"method": method, "auroc": auroc(strength, positive[mask]),
                     "auroc_moved": auroc(np.abs(values[movable | negatives]), movable[movable | negatives]),
                     "true_edges": int(positive.sum()), "moved": int(movable.sum()), "edges": int(mask.sum()),
                     "smallest_80": smallest, "holds_every_true_edge": held, "holds_every_moved": held_moved})
    return pd.DataFrame(rows)


def head_recovery(model, task, truth) -> pd.DataFrame:
    """Each head's share of the difference recovered by patching it alone (the mean over the task's pairs), beside
    whether the truth puts it on the path to the output."""
    from .effects import patch_heads

    frames = [patch_heads(model, p.clean, p.corrupted, *_pair_values(model, p)) for p in task.pairs]
    mean = pd.concat(frames).groupby(["layer", "head"], as_index=False)["recovered"].mean()
    on_path = {(int(b.layer), int(b.head)) for b in truth.blocks.itertuples() if pd.notna(b.head)}
    mean["on_path"] = [(int(r.layer), int(r.head)) in on_path for r in mean.itertuples()]
    return mean


def _pair_values(model, pair):
    from .effects.readouts import own_readout

    readout = own_readout(model)
    if readout.numerical:
        return "value", "value"
    return str(readout.values[pair.answer]), str(readout.values[pair.distractor])
