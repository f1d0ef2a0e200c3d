"""What the heads of an indirect-object circuit are, set against Wang et al. (2022)'s circuit in GPT-2 small.

Each head the circuit's edges touch is read three ways: the head detector's label (induction, duplicate token,
previous token, sink), its OV copying and suppression scores, and its attention between the task's role positions
over the clean prompts (END → IO, END → S2, S2 → S1+1, S2 → S1, S1+1 → S1). A head takes the class of Wang et
al. whose pattern it attends along most, when that attention reaches ``BAR``: END → IO makes a name mover, or a
negative name mover when the head suppresses more than it copies; END → S2 an S-inhibition head; S2 → S1+1 an
induction head; S2 → S1 a duplicate-token head; S1+1 → S1 a previous-token head.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from models import AttentionModel, HeadLensError, head_label
from models.run import language_stack, trace_batch, trace_weights

from ..tasks.effects import batches
from ..tasks.pairs import Task
from .scores import EdgeScores

PATTERNS = {  # class: (from role, to role)
    "name mover": ("END", "IO"), "S-inhibition": ("END", "S2"), "induction": ("S2", "S1+1"),
    "duplicate token": ("S2", "S1"), "previous token": ("S1+1", "S1"),
}
BAR = 0.3           # the attention along a pattern that gives a head its class
SAMPLE = 32         # clean prompts the role attention is averaged over
# Wang et al. 2022, figure 2: GPT-2 small's heads by class (layer.head)
WANG = {"name mover": "9.9, 9.6, 10.0", "negative name mover": "10.7, 11.10",
        "backup name mover": "10.10, 10.6, 10.2, 10.1, 11.2, 9.7, 9.0, 11.9", "S-inhibition": "7.3, 7.9, 8.6, 8.10",
        "induction": "5.5, 6.9", "duplicate token": "0.1, 3.0", "previous token": "2.2, 4.11"}


def role_attention(model: AttentionModel, task: Task, sample: int = SAMPLE) -> dict[str, np.ndarray]:
    """Per class of ``PATTERNS``, ``(layers, heads)``: the mean attention from its first role's token to its
    second's over the first ``sample`` clean prompts (zero for a pruned head)."""
    missing = sorted({r for pattern in PATTERNS.values() for r in pattern} - set(task.roles))
    if missing:
        raise HeadLensError(f"The heads' classes are read between the indirect-object task's roles; this task lacks "
                            f"{', '.join(missing)}.")
    stack = language_stack(model, "The heads' attention between roles is read")
    part = task.subset(range(min(sample, len(task))))
    total = {name: np.zeros((stack.n_layers, stack.n_heads)) for name in PATTERNS}
    for idx in batches(part, 16):
        pairs = [part.pairs[i] for i in idx]
        with torch.inference_mode():
            weights = trace_weights(stack, trace_batch(model, torch.tensor([p.clean_ids for p in pairs])))
        weights = weights.double().cpu().numpy()                                    # (b, L, H, n, n)
        for name, (a, b) in PATTERNS.items():
            q = np.array([p.role(a) for p in pairs])
            k = np.array([p.role(b) for p in pairs])
            total[name] += weights[np.arange(len(pairs)), :, :, q, k].sum(0)
    return {name: t / len(part) for name, t in total.items()}


def circuit_heads(scores: EdgeScores, n: int, attention: dict[str, np.ndarray], copying: pd.DataFrame | None = None,
                  detector: pd.DataFrame | None = None, kinds=None) -> pd.DataFrame:
    """One row per head the top ``n`` edges touch (as a sender, or by its query; a key/value input shared by a group
    counts for the heads of the group that are in): its edges' summed |score| in and out, each pattern's attention
    (``role_attention``), its copying and suppression (``analysis.effects.vocabulary.copying_scores``) and detector label
    (``analysis.roles.detector``) when given, and its class."""
    from ..roles.detector import detector_labels

    g = scores.graph
    frame = scores.frame(n, kinds)
    heads: dict[tuple[int, int], dict] = {}

    def add(node: tuple, side: str, value: float) -> None:
        kind, layer, index = node
        if kind == "kv":  # a key/value input: counted for the query heads reading it that are in the circuit
            for head in g.reads[layer][index]:
                shared.setdefault((layer, head), 0.0)
                shared[(layer, head)] += abs(value)
            return
        if kind == "head":
            row = heads.setdefault((layer, index), {"in": 0.0, "out": 0.0})
            row[side] += abs(value)

    shared: dict[tuple[int, int], float] = {}
    for s, r, v in zip(frame.sender_index, frame.receiver_index, frame.score):
        add(g.senders[s], "out", v)
        add(g.receiver_node(r), "in", v)
    for key, value in shared.items():
        if key in heads:
            heads[key]["in"] += value
    labels = {}
    if detector is not None:
        labels = dict(zip(zip(detector.layer, detector["head"]), detector_labels(detector)))
    copy = {} if copying is None else {(r.layer, r.head): (r.copying, r.suppression) for r in copying.itertuples()}
    rows = []
    for (layer, head), row in sorted(heads.items()):
        pattern = {name: float(attention[name][layer, head]) for name in PATTERNS}
        c, s = copy.get((layer, head), (np.nan, np.nan))
        rows.append({"head": head_label(layer, head), "layer": layer, "index": head, "edges_in": row["in"],
                     "edges_out": row["out"], **{f"attn {PATTERNS[k][0]}→{PATTERNS[k][1]}": v for k, v in pattern.items()},
                     "copying": c, "suppression": s, "detector": labels.get((layer, head), ""),
                     "class": classify(pattern, c, s)})
    return pd.DataFrame(rows)


def classify(pattern: dict[str, float], copying: float = np.nan, suppression: float = np.nan) -> str:
    """Wang et al.'s class of a head from its attention along each pattern and its OV scores (``BAR``)."""
    name, value = max(pattern.items(), key=lambda kv: kv[1])
    if value < BAR:
        return "other"
    if name == "name mover" and np.isfinite(copying) and np.isfinite(suppression) and suppression > copying:
        return "negative name mover"
    return name
