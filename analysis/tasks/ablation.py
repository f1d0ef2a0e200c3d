"""How few heads keep a task's behaviour: keep the ``k`` heads first in an order (the task's largest mean
effects in size, or the Pruning page's importance), mean-ablate every other head over the task's clean prompts (each
outputs its mean ``z`` over their tokens), and measure the task's metric on the clean prompts, for several ``k``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from models import AttentionModel, HeadLensError
from models.run import device_of, patching_stack, trace_batch

from .effects import TaskEffects, batches, measure_for, table
from .pairs import Task

Progress = Callable[[int, int], None]
CURVE_PAIRS = 50  # pairs a curve is measured on (the task's first)


WHAT = "Mean ablation replaces a head's output"


def kept_counts(n_heads: int) -> list[int]:
    """The numbers of heads kept along a curve: 0, 1, 2, 5, 10, 20, 50, ... up to every head."""
    out, step = [0], 1
    while step < n_heads:
        out += [k for k in (step, 2 * step, 5 * step) if k < n_heads]
        step *= 10
    return sorted(set(out)) + [n_heads]


@torch.inference_mode()
def head_means(model: AttentionModel, task: Task) -> torch.Tensor:
    """``(layers, heads, Dh)``: each head's mean ``z`` over every token of the task's clean prompts."""
    stack = patching_stack(model, WHAT)
    L, H, Dh = stack.n_layers, stack.n_heads, stack.head_dim
    total, count = torch.zeros(L, H, Dh, dtype=torch.float64), 0
    for idx in batches(task):
        t = trace_batch(model, torch.tensor([task.pairs[i].clean_ids for i in idx]))
        for layer in range(L):
            total[layer, stack.kept[layer]] += t.z[layer].double().sum((0, 2)).cpu()
        count += t.ids.numel()
    return total / count


@torch.inference_mode()
def metric_with_heads(model: AttentionModel, task: Task, metric: str, keep: np.ndarray,
                      means: torch.Tensor) -> np.ndarray:
    """``(pairs,)``: the metric of each clean prompt with only the heads ``keep`` ``(layers, heads)`` bool working,
    every other one giving its mean output."""
    stack = patching_stack(model, WHAT)
    device = device_of(stack)
    measure = measure_for(model, task, metric)
    mask = torch.as_tensor(keep, dtype=torch.float32, device=device)
    fill = means.to(device, stack.embed(torch.zeros(1, 1, dtype=torch.long, device=device)).dtype)
    out = np.zeros(len(task))
    for idx in batches(task):
        ids = torch.tensor([task.pairs[i].clean_ids for i in idx], device=device)
        x, _ = stack.run_layers(stack.embed(ids), need_weights=False,
                                edits=stack.switched_off(mask.to(fill.dtype), fill))
        out[idx] = measure(stack, x, torch.as_tensor(idx)).double().cpu().numpy()
    return out


def order_by_effect(effects: TaskEffects, normalise: str = "set") -> list[tuple[int, int]]:
    """Heads from the largest mean patching effect in size down (a head that works against the answer matters
    too: a circuit's negative name movers)."""
    frame = table(effects, "heads", normalise).sort_values("mean", key=abs, ascending=False, kind="stable")
    return [(int(r.layer), int(r.head)) for r in frame.itertuples()]


def kept_curve(model: AttentionModel, task: Task, orders: dict[str, Sequence[tuple[int, int]]], *,
               metric: str | None = None, counts: list[int] | None = None, max_pairs: int = CURVE_PAIRS,
               progress: Progress | None = None) -> pd.DataFrame:
    """For each order and each count ``k``: the mean metric over the task's first ``max_pairs`` clean prompts
    with the first ``k`` heads of the order kept and the rest mean-ablated. Rows ``order``, ``kept``, ``metric``
    and ``share`` (of the whole model's mean metric); ``frame.attrs["full"]``: the whole model's."""
    task = task.subset(range(min(len(task), max_pairs)))
    metric = metric or task.metric
    L, H = model.n_layers, model.n_heads
    counts = counts or kept_counts(L * H)
    for name, order in orders.items():
        if len(order) != L * H or len(set(map(tuple, order))) != L * H:
            raise HeadLensError(f"The order '{name}' does not name each of the {L * H} heads once.")
    means = head_means(model, task)
    full = float(metric_with_heads(model, task, metric, np.ones((L, H), dtype=bool), means).mean())
    rows, done, total = [], 0, len(orders) * len(counts)
    for name, order in orders.items():
        for k in counts:
            keep = np.zeros((L, H), dtype=bool)
            for layer, head in list(order)[:k]:
                keep[layer, head] = True
            value = float(metric_with_heads(model, task, metric, keep, means).mean())
            rows.append((name, k, value, value / full if full else np.nan))
            done += 1
            if progress is not None:
                progress(done, total)
    frame = pd.DataFrame(rows, columns=["order", "kept", "metric", "share"])
    frame.attrs.update(full=full, metric=metric, pairs=len(task))
    return frame
