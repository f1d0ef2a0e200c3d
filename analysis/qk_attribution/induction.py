"""What makes an induction head's key: over random tokens repeated twice, the key-side writer with the largest part
of each induction head's score from a second-copy token to the token after its first copy, and how often that
writer is a previous-token head (Olsson et al. 2022's mechanism: a previous-token head writes "the token before
me" into each key, which the induction head's query matches against the current token).

    detector = head_detector(model)
    found = induction_key_writers(model, detector)
    found.share_previous_token()       # the share of prompts, with a 95% interval
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from models import AttentionModel, HeadLensError, head_label
from models.run import device_of

from ..roles.detector import detector_labels, repeated_sequences
from ..stats import LEVEL
from . import split as Q
from .frames import head_graph

PROMPTS, LENGTH, BATCH = 50, 20, 8

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class KeyWriters:
    """One row per (prompt, induction head): the head, its top key-side writer (summed over the second copy's
    queries, each at its induction key) with that writer's part and share and its detector label."""

    frame: pd.DataFrame

    def share_previous_token(self) -> tuple[float, float, float]:
        """The share of (prompt, induction head) rows whose top key-side writer is a previous-token head, with its
        95% Wilson interval."""
        return _wilson(int(self.frame.previous_token.sum()), len(self.frame))

    def by_head(self) -> pd.DataFrame:
        """Each induction head's top key-side writers: in how many prompts each is the top one, its share of them
        with a 95% Wilson interval, its label and previous-token score, and its mean share of the scores."""
        rows = []
        for (head, writer), g in self.frame.groupby(["head", "writer"], sort=False):
            share, low, high = _wilson(len(g), int((self.frame["head"] == head).sum()))
            rows.append({"head": head, "writer": writer, "label": g.label.iloc[0],
                         "previous_token_score": g.previous_token_score.iloc[0], "prompts": len(g), "of_prompts": share,
                         "of_prompts_lo": low, "of_prompts_hi": high, "share_of_score": g.share.mean()})
        return pd.DataFrame(rows).sort_values(["head", "prompts"], ascending=[True, False], kind="stable")


def _wilson(k: int, n: int) -> tuple[float, float, float]:
    from scipy import stats  # a second to import: read when a figure needs it

    ci = stats.binomtest(k, n).proportion_ci(LEVEL, method="wilson")
    return k / n, float(ci.low), float(ci.high)


def induction_key_writers(model: AttentionModel, detector: pd.DataFrame, *, prompts: int = PROMPTS,
                          length: int = LENGTH, seed: int = 0, heads: list[tuple[int, int]] | None = None,
                          progress: Progress | None = None) -> KeyWriters:
    """Over ``prompts`` repeated sequences of ``length`` whole-word tokens, each induction head's (the detector's
    label in ``detector``, ``head_detector``'s frame, or ``heads``) top key-side writer."""
    labels = {(int(r.layer), int(r.head)): label for r, label in zip(detector.itertuples(), detector_labels(detector))}
    prev = {(int(r.layer), int(r.head)): float(r.previous_token) for r in detector.itertuples()}
    heads = [h for h, label in labels.items() if label == "induction"] if heads is None else heads
    if not heads:
        raise HeadLensError(f"The detector names no induction head in {model.name}.")
    stack, graph = head_graph(model, *heads[0])
    texts = repeated_sequences(model.tokenizer, prompts, length, seed)
    rows = [model.tokenize(t, verbose=False)["input_ids"] for t in texts]
    if len({len(r) for r in rows}) != 1:
        raise HeadLensError("The repeated sequences did not come back from the tokenizer at one length.")
    n = len(rows[0])
    start = n - 2 * length                                    # the first copy's first token
    queries = range(start + length, n - 1)                    # the second copy but its last token
    out = []
    for b in range(0, prompts, BATCH):
        ids = torch.tensor(rows[b:b + BATCH], device=device_of(stack))
        run = Q.writers_run(stack, graph, ids)
        for layer, head in heads:
            names, nodes = Q.writer_names(graph, layer), Q.writer_nodes(graph, layer)
            with torch.inference_mode():
                sides = Q.head_sides(stack, graph, run, layer, head)
                B = len(ids)
                split = sum(sides.at(torch.full((B,), i), torch.full((B,), i - length + 1)) for i in queries)
                keys = split.sum(1).double().cpu().numpy()                      # (B, writers): key side
                whole = split.sum((1, 2)).double().cpu().numpy()
            for j in range(B):
                w = int(np.argmax(keys[j]))
                kind, wl, wh = nodes[w]
                label = labels.get((wl, wh), "other") if kind == "head" else kind
                out.append({"prompt": b + j, "head": head_label(layer, head), "writer": names[w], "label": label,
                            "previous_token_score": prev.get((wl, wh), np.nan) if kind == "head" else np.nan,
                            "part": keys[j, w], "share": keys[j, w] / whole[j], "previous_token":
                            label == "previous token"})
        if progress is not None:
            progress(min(b + BATCH, prompts), prompts)
    return KeyWriters(pd.DataFrame(out))
