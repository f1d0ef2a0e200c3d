"""Every analysis scored against a compiled program's known algorithm (``models.compiled.ground_truth``).

- Circuits: each edge's score over the program's one-token pairs (EAP, EAP-IG, exact edge patching) against the
  true edges: the area under the ROC curve (``edge_auroc``; the ACDC paper's measure, Conmy et al. 2023), over
  every true edge and over those a one-token corruption moves (``moved``), and whether the smallest circuit
  keeping 80% of the difference holds them.
- Effects: each head patched alone, the share of the difference it recovers beside whether the truth puts it on
  the task's path to the output (``head_recovery``, ``on_path``), and heads patched together
  (``patched_together``): every head, and the on-path heads.
- Explanations: each compiled head's program, fitted and held out on the program's own random inputs, against its
  Select: the comparison named, the held-out score, and the IoU of the program's keys with the Select's pattern as
  Tracr's own RASP evaluator computes it (``explanation_scores``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dataclasses import replace

from models import HeadLensError
from models.compiled_truth import EMBED, block_at, block_name, selections

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
    some pair: the sender's outputs differ where the receiver's input weights look (a head's value projection, a
    feed-forward's first layer, the unembedding), and for a head's query or key, where the difference changes its
    scores against the clean run's keys or queries. An edge carrying what both inputs share (the positions, the
    BOS), or a difference the head's scores do not see (a Select with TRUE gives every token the same score,
    whatever its value), is one no patching from a corrupted input can move, whatever the method. (One query head
    per key head, as a compiled program has.)"""
    import torch

    from models.run import stack_of

    from .circuits.graph import run_ids

    stack = stack_of(model, "A circuit's edges are traced")
    clean = torch.tensor([p.clean_ids for p in task.pairs])
    corrupted = torch.tensor([p.corrupted_ids for p in task.pairs])
    rows, measure = torch.arange(len(task)), lambda stack, x, rows: x[:, -1, 0]
    with torch.inference_mode():
        outs = run_ids(stack, graph, clean, measure, rows).outs
        diff = outs - run_ids(stack, graph, corrupted, measure, rows).outs
    reach = torch.from_numpy(graph.mask())
    streams: dict[int, torch.Tensor] = {}  # the clean run's stream a layer's heads read: summed once a layer
    out = np.zeros((len(graph.senders), len(graph.receivers)), dtype=bool)
    for r, (kind, layer, index) in enumerate(graph.receivers):
        w = stack.unembedding() if kind == "logits" else stack.layers[layer].input_weights(kind, index)  # (d, E)
        seen = torch.einsum("sbne,de->sbnd", diff, w.to(diff.dtype))
        if kind in ("q", "k"):  # the scores it changes: against the clean run's keys (for a query) or queries
            other = stack.layers[layer].input_weights("k" if kind == "q" else "q", index).to(diff.dtype)
            if layer not in streams:
                streams[layer] = outs[reach[:, r]].sum(0)
            fixed = torch.einsum("bne,de->bnd", streams[layer], other)
            seen = torch.einsum("sbnd,bmd->sbnm", seen, fixed)
        out[:, r] = (seen.abs().amax(dim=tuple(range(1, seen.ndim))) > (1e-3 if kind in ("q", "k") else 1e-6)).numpy()
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
    whether the truth puts it on the task's path to the output (``on_path``)."""
    from .effects import patch_heads

    frames = [patch_heads(model, p.clean, p.corrupted, *_pair_values(model, p)) for p in task.pairs]
    mean = pd.concat(frames).groupby(["layer", "head"], as_index=False)["recovered"].mean()
    path = set(on_path(model, task, truth))
    mean["on_path"] = [(int(r.layer), int(r.head)) in path for r in mean.itertuples()]
    return mean


def _pair_values(model, pair):
    from .effects.readouts import own_readout

    readout = own_readout(model)
    if readout.numerical:
        return "value", "value"
    return str(readout.values[pair.answer]), str(readout.values[pair.distractor])


BASE_VALUES = {"tokens", "indices"}  # what the explanations' comparisons read


def explanation_scores(model, truth, program=None, *, n: int = 200) -> pd.DataFrame:
    """Each compiled head's explanation (``explain_heads`` on ``n`` of the program's random inputs, half fitted on,
    half held out) against the truth: one row per head the compiler placed a Select in: ``block``, ``select`` (the
    truth's), ``named`` (the program's rules), ``right`` (the Select's comparison is the one its first rule, which gives most,
    names),
    ``score`` and ``iou`` (held out: the head's attention on the rules' keys, and its rows against the program's),
    ``iou_select`` (the program's keys against the Select's pattern as Tracr's evaluator computes it, over the
    held-out inputs' queries) and ``computed`` (the Select compares a value the program computes, not the tokens or
    the positions the rules read). ``program``: the RASP program compiled (a built-in's by default)."""
    from models.compiled import BUILT_IN

    from .explanations import explain_heads
    from .explanations.heads import own_halves
    from .roles.rules import KNOWN, UNION, Reading

    if program is None:
        name = model.program["name"]
        if name not in BUILT_IN:
            raise HeadLensError(f"Give the RASP program {name!r} was compiled from: it is not a built-in one.")
        program = BUILT_IN[name].make()
    fit, held_out = own_halves(model.random_inputs(n))
    frame = explain_heads(model, fit, held_out, replicates=200).set_index(["layer", "head"])
    values = {str(v): v for v in model.config.tokens}
    patterns = selections(program, [[values[w] for w in text.split()] for text in held_out])
    readings = [Reading.of(a) for a in model.attend(held_out)]
    rows = []
    for b in truth.blocks[truth.blocks["head"].notna()].itertuples():
        found = frame.loc[(int(b.layer), int(b.head))]
        rules = [KNOWN[name] for name in found["rule"].split(UNION)]
        both = either = 0
        for reading, selected in zip(readings, patterns[b.label]):
            named = np.zeros((len(reading), len(reading)), dtype=bool)
            for rule in rules:
                for q, keys in enumerate(rule.keys_of(reading)):
                    named[q, keys] = True
            true = np.zeros_like(named)
            true[1:, 1:] = selected  # the BOS first
            both, either = both + (named & true)[1:, 1:].sum(), either + (named | true)[1:, 1:].sum()
        rows.append({"block": b.block, "select": b.select, "named": found["rule"],
                     "right": set(b.comparisons) <= rules[0].comparisons,  # the rule that gives most
                     "score": float(found["score"]), "iou": float(found["iou"]),
                     "iou_select": both / either if either else 1.0,
                     "computed": not set(b.keys) | set(b.queries) <= BASE_VALUES})
    return pd.DataFrame(rows)


def edges_beside(scores, truth, n: int, kinds=None) -> tuple[pd.DataFrame, float]:
    """The true edges beside a circuit's scores (``EdgeScores``, its top ``n`` of the receiver ``kinds``): one row per
    true edge, ``sender``, ``receiver`` (as the circuit names them), its ``score``, ``rank`` (1 = the largest
    |score|) and whether the circuit of ``n`` edges holds it (``in_circuit``); and the scores' edge AUROC against the
    true edges (NaN where every edge is true or none is)."""
    graph = scores.graph
    positive = true_edges(graph, truth)
    s, r = scores.ranked(kinds)
    rank = {(int(a), int(b)): i + 1 for i, (a, b) in enumerate(zip(s, r))}
    rows = [{"sender": graph.sender_name(a), "receiver": graph.receiver_name(b), "score": float(scores.scores[a, b]),
             "rank": rank.get((int(a), int(b))), "in_circuit": rank.get((int(a), int(b)), n + 1) <= n}
            for a, b in np.argwhere(positive)]
    mask = graph.mask()
    frame = pd.DataFrame(rows, columns=["sender", "receiver", "score", "rank", "in_circuit"])
    return frame.sort_values("rank", na_position="last").reset_index(drop=True), \
        auroc(np.abs(scores.scores[mask]), positive[mask])


def head_beside(truth, explanations: pd.DataFrame, layer: int, head: int) -> dict:
    """What the compiler put in head ``(layer, head)`` beside what its explanation found (a row of
    ``explain_heads``' frame on the program's own inputs): ``compiled`` (the truth's expression in words, or None for
    a head left empty), ``found`` (the program's rules), ``sentence``, ``score``, ``iou`` (held out) and ``agrees``
    (the comparison the rule that gives most names is the compiled Select's; None for an empty head)."""
    from .roles.rules import KNOWN, UNION

    row = explanations[(explanations["layer"] == layer) & (explanations["head"] == head)].iloc[0]
    placed = truth.head(layer, head)
    first = KNOWN[row["rule"].split(UNION)[0]]
    return {"compiled": None if placed is None else placed["says"], "found": row["rule"],
            "sentence": row["sentence"], "score": float(row["score"]), "iou": float(row["iou"]),
            "agrees": None if placed is None else set(placed["comparisons"]) <= first.comparisons}


def patched_together(model, task, heads) -> np.ndarray:
    """``(pairs,)``: the share of each pair's difference recovered when ``heads`` (``(layer, head)``\\ s) are patched
    together: each one's output (``z``) from the clean run put in the corrupted run, every other part run on."""
    import torch

    from models.run import Edits, patching_stack, trace_batch

    from .effects.readouts import own_readout

    stack = patching_stack(model)
    measure, rows = own_readout(model).task_metric(task, task.metric), torch.arange(len(task))
    clean_ids = torch.tensor([p.clean_ids for p in task.pairs])
    corrupted_ids = torch.tensor([p.corrupted_ids for p in task.pairs])
    clean = trace_batch(model, clean_ids, stack)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(int(layer), []).append(int(head))

    def put(layer: int):
        def edit(z):
            z = z.clone()
            z[:, by_layer[layer]] = clean.z[layer][:, by_layer[layer]]
            return z
        return edit

    def run(ids, edits=None) -> np.ndarray:
        with torch.inference_mode():
            x, _ = stack.run_layers(stack.embed(ids), need_weights=False, edits=edits)
            return measure(stack, x, rows).double().cpu().numpy()

    base, top = run(corrupted_ids), run(clean_ids)
    return (run(corrupted_ids, Edits.every_layer("z", put, by_layer)) - base) / (top - base)


def on_path(model, task, truth) -> list[tuple[int, int]]:
    """The heads the truth puts on the task's path: those a true edge the corruption moves (``moved``) enters."""
    from .circuits import graph_of
    from models.run import stack_of

    graph = graph_of(stack_of(model, "A circuit"))
    entered = true_edges(graph, truth) & moved(model, task, graph)
    found = {(layer, index) for (kind, layer, index), into in zip(graph.receivers, entered.any(0))
             if into and kind in ("q", "k", "v")}
    return sorted(found)
