"""Effects over a task: every head's direct attribution, head patching (exact or attribution patching) and the
residual stream patched by layer at each role's position, for every pair of a task, the pairs run as batches.

Per pair a patch's effect is the metric of the corrupted prompt patched less the corrupted prompt's own; its
recovered share is that over the clean prompt's metric less the corrupted one's. ``table`` averages over the
pairs, either normalised per pair (the mean of the pairs' recovered shares, which ``analysis.effects``
gives one at a time) or over the set (the mean effect over the mean span, robust where one pair's span is
near zero), with a bootstrap interval, a sign-flip p-value and its Benjamini-Hochberg correction across
heads (``analysis.stats``). The per-pair values are kept.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from models import AttentionModel, HeadLensError
from models.run import patching_stack

from ..effects import METHODS
from ..effects import batched as B
from ..effects import parts as P
from ..effects.metrics import Metric
from ..effects.readouts import TASK_METRICS, readout_reading
from ..stats import summarise
from .pairs import Task

METRICS = TASK_METRICS
NORMALISE = {"set": "over the set: mean effect / mean (clean − corrupted)",
             "pair": "per pair: mean of each pair's effect / its (clean − corrupted)"}
BATCH_PAIRS = 16   # pairs traced together

Progress = Callable[[int, int], None]


def measure_for(model: AttentionModel, task: Task, metric: str) -> Metric:
    """The task's ``metric`` over its pairs, as the model's readout of it reads them (``effects.readouts``); a
    sentence naming the model's metrics for one it does not read."""
    return readout_reading(model, metric).task_metric(task, metric)


def batches(task: Task, size: int = BATCH_PAIRS) -> list[np.ndarray]:
    """The pairs' indices in batches of one token length each, at most ``size`` pairs a batch."""
    lengths = np.array([len(p) for p in task.pairs])
    out = []
    for n in np.unique(lengths):
        same = np.flatnonzero(lengths == n)
        out += [same[i:i + size] for i in range(0, len(same), size)]
    return out


@dataclass(frozen=True)
class TaskEffects:
    """Every pair's figures (float64 unless noted), the pairs in the task's order:

    - ``clean``, ``corrupted`` ``(pairs,)``: the metric of each prompt;
    - ``attribution`` ``(pairs, layers, heads)``: each head's direct attribution on the clean prompt, along the
      metric's tokens (a probability metric's: their logits, each sign's weights summing to 1);
    - ``heads`` ``(pairs, layers, heads)``: the effect of patching each head's clean output in (every position);
    - ``residual`` ``(pairs, layers, roles)``: of patching the clean residual entering a layer at a role's token;
    - ``role_attention`` ``(pairs, layers, heads, roles)`` float32: the clean prompt's attention from its last
      token to each role's token (an encoder's: from every token, the mean).
    """

    task: Task
    metric: str
    method: str
    roles: tuple[str, ...]
    clean: np.ndarray
    corrupted: np.ndarray
    attribution: np.ndarray
    heads: np.ndarray
    residual: np.ndarray
    role_attention: np.ndarray

    @property
    def span(self) -> np.ndarray:
        return self.clean - self.corrupted

    @property
    def correct(self) -> np.ndarray:
        """bool ``(pairs,)``: the clean prompt's metric above zero (the answer over the distractor; greater-than:
        more probability after YY than up to it)."""
        return self.clean > 0

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())

    def only(self, keep: np.ndarray) -> "TaskEffects":
        """The same figures for the pairs ``keep`` (a bool mask or indices) alone."""
        idx = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep)
        if not len(idx):
            raise HeadLensError("No pair is left to average over.")
        return TaskEffects(self.task.subset(idx), self.metric, self.method, self.roles,
                           *(getattr(self, f)[idx] for f in ("clean", "corrupted", "attribution", "heads", "residual",
                                                             "role_attention")))

    def recovered(self, what: str = "heads") -> np.ndarray:
        """Each pair's recovered share of ``heads`` or ``residual``: effect / (clean − corrupted)."""
        values = getattr(self, what)
        return values / self.span.reshape(-1, *[1] * (values.ndim - 1))


def run_task(model: AttentionModel, task: Task, metric: str | None = None, method: str = "exact", *,
             residual: bool = True, batch_pairs: int = BATCH_PAIRS, progress: Progress | None = None) -> TaskEffects:
    """Every pair of ``task`` traced clean and corrupted in batches, its heads attributed and patched (``method``)
    and (``residual``) its residual stream patched at each role's token (zeros otherwise)."""
    if method not in METHODS:
        raise HeadLensError(f"Unknown patching method '{method}': choose {' or '.join(map(repr, METHODS))}.")
    stack, metric = patching_stack(model), metric or task.metric
    if not len(task):
        raise HeadLensError("The task has no pairs.")
    measure = measure_for(model, task, metric)
    roles = tuple(task.roles)
    N, L, H, R = len(task), stack.n_layers, stack.n_heads, len(roles)
    out = {"clean": np.zeros(N), "corrupted": np.zeros(N), "attribution": np.zeros((N, L, H)),
           "heads": np.zeros((N, L, H)), "residual": np.zeros((N, L, R)),
           "role_attention": np.zeros((N, L, H, R), dtype=np.float32)}
    groups = batches(task, batch_pairs)
    done = 0
    for idx in groups:
        def part(d: int, t: int, _done=done, _size=len(idx)) -> None:
            if progress is not None:
                progress(int(1000 * (_done + _size * d / max(t, 1))), 1000 * N)

        _run_batch(model, stack, task, measure, idx, roles, method, residual, out, part)
        done += len(idx)
        if progress is not None:
            progress(1000 * done, 1000 * N)
    return TaskEffects(task, metric, method, roles, **out)


def _run_batch(model, stack, task: Task, measure: Metric, idx: np.ndarray, roles, method: str, residual: bool,
               out: dict, progress) -> None:
    L, H = stack.n_layers, stack.n_heads
    pairs = [task.pairs[i] for i in idx]
    b, rows = len(pairs), torch.as_tensor(idx)
    clean = P.trace_batch(model, torch.tensor([p.clean_ids for p in pairs]))
    out["clean"][idx] = B.final_measures(stack, clean, measure, rows)
    with torch.inference_mode():
        out["attribution"][idx] = measure.heads(stack, clean, idx)
    positions = np.array([[p.role(r) for r in roles] for p in pairs])                  # (b, R)
    out["role_attention"][idx] = _role_attention(stack, clean, positions)
    bad_ids = torch.tensor([p.corrupted_ids for p in pairs])
    if method == "attribution":  # the corrupted prompts' one forward pass is the estimate's own
        heads, resid, _, out["corrupted"][idx] = B.attribution_batch(model, clean, bad_ids, measure, rows)
        out["heads"][idx] = heads.sum(-1)
        if residual:
            out["residual"][idx] = np.take_along_axis(resid, positions[:, None, :].repeat(L, 1), axis=2)
        progress(1, 1)
        return
    corrupted = P.trace_batch(model, bad_ids)
    base = out["corrupted"][idx] = B.final_measures(stack, corrupted, measure, rows)
    kept = [(layer, h) for layer in range(L) for h in stack.kept[layer]]
    k_layers, k_heads = np.array([k[0] for k in kept]), np.array([k[1] for k in kept])
    R = len(roles) if residual else 0
    pair = np.concatenate([np.repeat(np.arange(b), len(kept)), np.repeat(np.arange(b), L * R)])
    layers = np.concatenate([np.tile(k_layers, b), np.tile(np.repeat(np.arange(L), R), b)])
    heads = np.concatenate([np.tile(k_heads, b), np.full(b * L * R, -1)])
    where = np.concatenate([np.full(b * len(kept), -1), np.tile(positions[:, None, :R], (1, L, 1)).reshape(-1)])
    values = B.patched_measures(model, clean, corrupted, measure, rows, pair, layers, heads, where, progress=progress)
    effect = np.zeros((b, L, H))
    effect[pair[:b * len(kept)], np.tile(k_layers, b), np.tile(k_heads, b)] = \
        values[:b * len(kept)] - base[pair[:b * len(kept)]]
    out["heads"][idx] = effect
    if residual:
        out["residual"][idx] = values[b * len(kept):].reshape(b, L, R) - base[:, None, None]


@torch.inference_mode()
def _role_attention(stack, clean, positions: np.ndarray) -> np.ndarray:
    """``(b, layers, heads, roles)``: each head's weight from the last token to each role's token (an encoder's:
    the mean over every token, as its embedding pools them)."""
    weights = P.trace_weights(stack, clean)
    last = weights[..., -1, :] if stack.causal else weights.mean(-2)                 # (b, L, H, n)
    at = torch.as_tensor(positions, device=last.device)[:, None, None, :].expand(*last.shape[:3], -1)
    return last.gather(3, at).float().cpu().numpy()


def table(effects: TaskEffects, what: str = "heads", normalise: str = "set", *, seed: int = 0) -> pd.DataFrame:
    """One row per head (``attribution``, ``heads``) or per layer and role (``residual``): ``mean``, ``low`` and
    ``high`` (the 95% bootstrap interval), ``p`` (sign flips) and ``q`` (Benjamini-Hochberg across the rows),
    ``significant`` (q below 0.05). Patching's means are recovered shares, normalised per ``normalise``;
    attribution's are in the metric's units."""
    if normalise not in NORMALISE:
        raise HeadLensError(f"Unknown normalisation '{normalise}': choose 'set' or 'pair'.")
    values = getattr(effects, what)
    N = len(values)
    flat = values.reshape(N, -1)
    if what == "attribution":
        s = summarise(flat, seed=seed)
    elif normalise == "pair":
        s = summarise(flat / effects.span[:, None], seed=seed)
    else:
        s = summarise(flat, effects.span, seed=seed)
    axes = ("layer", "head") if what != "residual" else ("layer", "role")
    index = np.indices(values.shape[1:]).reshape(2, -1)
    frame = pd.DataFrame({axes[0]: index[0], axes[1]: index[1]})
    if what == "residual":
        frame[axes[1]] = [effects.roles[r] for r in frame[axes[1]]]
    for name in ("mean", "low", "high", "p", "q"):
        frame[name] = getattr(s, name)
    frame["significant"] = s.significant
    frame.attrs.update(pairs=N, metric=effects.metric, method=effects.method, normalise=normalise,
                       accuracy=effects.accuracy, clean=float(effects.clean.mean()),
                       corrupted=float(effects.corrupted.mean()))
    return frame


def per_pair(effects: TaskEffects, layer: int, head: int) -> pd.DataFrame:
    """One head's figures on each pair: its attribution, its patch's effect and recovered share, and the pair."""
    t = effects.task
    return pd.DataFrame({"pair": np.arange(len(t)), "template": [p.template for p in t.pairs],
                         "clean": [p.clean for p in t.pairs], "attribution": effects.attribution[:, layer, head],
                         "effect": effects.heads[:, layer, head],
                         "recovered": effects.recovered("heads")[:, layer, head],
                         "clean_metric": effects.clean, "corrupted_metric": effects.corrupted})
