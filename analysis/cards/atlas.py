"""Every head of a model as one row of measures (the atlas), a 2-D map of them, and the heads most alike.

The atlas's columns are the card's figures for every head at once, read from the same ``CardParts``: a
head's point on the Atlas page is its card's numbers and its cell on the Head roles grids.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from models import head_label

from ..roles.foci import FOCI, FOCUS_NAMES
from .card import CardParts

# column -> what a person reads on an axis; each a higher-is-more measure
METRICS = {
    "entropy": "entropy (nats)",
    "entropy_norm": "entropy / its largest",
    "distance": "mean distance (tokens)",
    "cls": "share on the first token",
    "sep": "share on the last token",
    "prev_token": "share on the previous token",
    "self": "share on itself",
    "punct": "share on punctuation",
    "peak": "peak weight (mean over sentences)",
    "explained": "explained: its program's held-out score",
    "induction": "induction (detector)",
    "duplicate_token": "duplicate token (detector)",
    "previous_token": "previous token (detector)",
    "sink": "sink (detector)",
    **{f"{f}_lift": f"{FOCUS_NAMES[f].lower()} lift (seed focus)" for f in FOCI},
    "copying": "OV copying",
    "suppression": "OV suppression",
    "writes": "output norm (mean of each sentence's largest)",
    "importance": "importance",
    "effect": "effect",
}
SHAPE = ("entropy", "distance", "cls", "prev_token", "self", "punct", "peak")  # what every model has
LIKE_K = 5


def atlas_frame(parts: CardParts) -> pd.DataFrame:
    """One row per head: ``layer``, ``head``, ``name``, ``role`` (Head roles' label), ``detector_role`` (a
    decoder's), its explanation (``rule``, ``rule_family``, ``sentence``; ``explained``, the rule's held-out
    score), and every measure of ``METRICS`` that ``parts`` holds, each the card's figure; ``effect``: the
    task's mean effect when there is one, else the first pair's recovered share."""
    frame = parts.profile[["layer", "head", "label", *[c for c in METRICS if c in parts.profile]]].rename(
        columns={"label": "role"}).reset_index(drop=True)
    frame.insert(2, "name", [head_label(int(r.layer), int(r.head)) for r in frame.itertuples()])
    frame["peak"] = np.nanmean(parts.peaks.weight, axis=0).reshape(-1)
    on = ["layer", "head"]
    if parts.explanations is not None:
        frame = frame.merge(parts.explanations[[*on, "score", "rule", "family", "sentence"]].rename(
            columns={"score": "explained", "family": "rule_family"}), on=on, how="left")
    if parts.detector is not None:
        frame = frame.merge(parts.detector[[*on, "induction", "duplicate_token", "previous_token", "sink", "label"]]
                            .rename(columns={"label": "detector_role"}), on=on, how="left")
    if parts.copying is not None:
        frame = frame.merge(parts.copying[[*on, "copying", "suppression"]], on=on, how="left")
    if parts.writes is not None:
        frame["writes"] = parts.writes.norm.mean(axis=0).reshape(-1)
    if parts.importance is not None:
        frame = frame.merge(parts.importance[[*on, "importance"]], on=on, how="left")
    if parts.task is not None:
        frame = frame.merge(parts.task[[*on, "mean"]].rename(columns={"mean": "effect"}), on=on, how="left")
        frame.attrs["effect"] = f"{parts.task_name}: mean recovered"
    elif parts.pairs:
        name, (_, patched) = next(iter(parts.pairs.items()))
        frame = frame.merge(patched[[*on, "recovered"]].rename(columns={"recovered": "effect"}), on=on, how="left")
        frame.attrs["effect"] = f"{name}: recovered"
    return frame


def metrics_of(frame: pd.DataFrame) -> list[str]:
    """The measures ``frame`` has, in ``METRICS``'s order."""
    return [c for c in METRICS if c in frame and frame[c].notna().any()]


def _standard(frames: list[pd.DataFrame], columns: list[str]) -> list[np.ndarray]:
    """Each frame's ``columns`` as z-scores over every frame's heads together (a constant column is zero)."""
    pooled = np.concatenate([f[columns].to_numpy(dtype=np.float64) for f in frames])
    mean, std = np.nanmean(pooled, axis=0), np.nanstd(pooled, axis=0)
    std = np.where(std > 0, std, 1.0)
    return [np.nan_to_num((f[columns].to_numpy(dtype=np.float64) - mean) / std) for f in frames]


def head_map(frame: pd.DataFrame, columns: list[str] | None = None) -> pd.DataFrame:
    """``frame`` with ``x`` and ``y``: its heads' measures (z-scored) projected on their first two principal
    components; ``attrs["explained"]``: the share of the variance each keeps."""
    columns = [c for c in (columns or metrics_of(frame)) if c != "effect"]
    z = _standard([frame], columns)[0]
    z = z - z.mean(axis=0)
    u, s, vt = np.linalg.svd(z, full_matrices=False)
    sign = np.sign(vt[:2].sum(axis=1) + 1e-12)  # a fixed orientation, whatever the solver's signs
    xy = u[:, :2] * s[:2] * sign
    out = frame.assign(x=xy[:, 0], y=xy[:, 1] if xy.shape[1] > 1 else 0.0)
    total = float((s ** 2).sum()) or 1.0
    out.attrs.update(frame.attrs, explained=[float(v) / total for v in (s[:2] ** 2)], columns=columns)
    return out


def heads_like(frame: pd.DataFrame, layer: int, head: int, others: dict[str, pd.DataFrame] | None = None,
               k: int = LIKE_K, model: str = "") -> pd.DataFrame:
    """The ``k`` heads nearest ``(layer, head)`` of ``frame`` by their measures (z-scored over the heads compared,
    Euclidean), in its own model and in each of ``others`` (a name -> its atlas frame); on the columns all share.
    One row each: ``model``, ``layer``, ``head``, ``name``, ``role``, ``distance``."""
    others = others or {}
    columns = [c for c in metrics_of(frame) if c not in ("effect", "importance")
               and all(c in o and o[c].notna().any() for o in others.values())]
    frames = [frame, *others.values()]
    z = _standard(frames, columns)
    me = z[0][int(np.flatnonzero((frame["layer"] == layer).to_numpy() & (frame["head"] == head).to_numpy())[0])]
    rows = []
    for name, f, values in zip([model, *others], frames, z):
        distance = np.sqrt(((values - me) ** 2).sum(axis=1))
        if f is frame:
            distance[(f["layer"] == layer).to_numpy() & (f["head"] == head).to_numpy()] = np.inf
        for i in [i for i in np.argsort(distance, kind="stable") if np.isfinite(distance[i])][:k]:
            r = f.iloc[int(i)]
            rows.append({"model": name, "layer": int(r["layer"]), "head": int(r["head"]), "name": r["name"],
                         "role": r.get("detector_role", r["role"]) if "detector_role" in f else r["role"],
                         "distance": float(distance[i])})
    out = pd.DataFrame(rows, columns=["model", "layer", "head", "name", "role", "distance"])
    out.attrs["columns"] = columns
    return out
