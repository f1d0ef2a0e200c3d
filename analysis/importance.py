"""Which heads matter: ablation, head importance, and pruning curves.

A head is ablated by zeroing its output (what a head mask and pruning do) or by putting its mean
output over the sentences in place of it (mean ablation, which leaves later layers an input of
the usual size). A head's importance is the exact effect of removing it alone on the model's
output: one minus the cosine of each sentence's embedding to the reference, averaged over the
sentences. Models with a loss also have Michel et al.'s (2019) gradient importance,
|dL/d(mask of h)|, averaged over the data and L2-normalised per layer.

A language model (SmolLM2) is measured by what it is for, ``measure="loss"``: a head's ablation
importance is the rise of the next-token loss with it alone switched off, its gradient importance
|dL/d(mask of h)| without the per-layer normalisation (on SmolLM2 the normalised ranking prunes
worse than random order: ``bench.bench_smollm2_pruning``), and a pruned model is measured by its
loss and by top-1 agreement (the share of next-token predictions equal to the full model's).

Pruning curves follow Michel et al.: 10% of the heads go per step, the least important first,
importance recomputed on the pruned model after each step; against random order and an order
read from attention alone. At each step the pruned model is measured on the same sentences:
fidelity (mean cosine of each embedding to the full model's), neighbour agreement (overlap of
each sentence's nearest neighbours by embedding with the full model's), and forward time.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from models import Attention, AttentionModel, HeadLensError

from .views import row_entropy, set_aside

ABLATIONS = {"zero": "Zero: the head's output is removed (as pruning does)",
             "mean": "Mean: the head outputs its mean over the sentences"}
ORDERS = {"importance": "by importance, recomputed each step", "random": "at random (mean of 3 seeds)",
          "proxy": "by attention alone (most weight on [CLS]/[SEP] first)"}
NEIGHBOURS = 5  # nearest neighbours compared for neighbour agreement
MEASURES = {"embedding": "the sentence embedding (mean of the last layer)", "loss": "the next-token loss"}
Progress = Callable[[int, int], None]


def _needs_scratch(model: AttentionModel, what: str) -> AttentionModel:
    """``model`` on our engine, which alone switches heads off: itself, or its twin with the same weights."""
    ours = model if hasattr(model, "embed_variants") else model.twin(f"{what} switches heads off")
    if not hasattr(ours, "embed_variants"):
        raise HeadLensError(f"{what} switches heads off, which only the from-scratch engine can do; "
                            "load the model with backend='scratch'.")
    return ours


def head_mask(model: AttentionModel, heads) -> np.ndarray | None:
    """``(layers, heads)`` float32, 0 for each ``(layer, head)`` in ``heads`` and 1 elsewhere; None for no heads."""
    heads = list(heads)
    if not heads:
        return None
    return ~heads_marked(model.n_layers, model.n_heads, heads) * np.float32(1)


def heads_marked(n_layers: int, n_heads: int, heads) -> np.ndarray:
    """bool ``(layers, heads)``, True for each ``(layer, head)`` in ``heads``."""
    marked = np.zeros((n_layers, n_heads), dtype=bool)
    for layer, head in heads:
        marked[layer, head] = True
    return marked


def _present(model: AttentionModel) -> np.ndarray:
    """bool ``(layers, heads)``: the heads the model still has."""
    pruned = getattr(model, "pruned_heads", None)
    return np.ones((model.n_layers, model.n_heads), dtype=bool) if pruned is None else ~pruned


def _means(model: AttentionModel, sentences, ablation: str, head_means):
    if ablation not in ABLATIONS:
        raise HeadLensError(f"Unknown ablation '{ablation}': choose 'zero' or 'mean'.")
    if ablation == "zero":
        return None
    return model.head_means(sentences) if head_means is None else head_means


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two sets of unit-length embeddings, ``(n,)``."""
    return np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))


def neighbour_agreement(reference: np.ndarray, other: np.ndarray, k: int = NEIGHBOURS) -> float:
    """Mean overlap, over sentences, of each one's ``k`` nearest neighbours (by cosine, itself left
    out) under ``other`` with those under ``reference``: 1 when every neighbourhood is kept."""
    n = len(reference)
    if n < 2:
        raise HeadLensError("Neighbour agreement needs at least two sentences.")
    k = min(k, n - 1)

    def nearest(e: np.ndarray) -> np.ndarray:
        sim = e.astype(np.float64) @ e.T.astype(np.float64)
        np.fill_diagonal(sim, -np.inf)
        return np.argsort(-sim, axis=1, kind="stable")[:, :k]

    a, b = nearest(reference), nearest(other)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))


@dataclass
class Ablation:
    """What switching ``heads`` off does, per sentence and per later head."""

    heads: list[tuple[int, int]]
    ablation: str
    cosine: np.ndarray            # (sentences,): each embedding's cosine to the full model's
    attention_change: np.ndarray  # (layers, heads): mean total-variation distance of each head's rows; NaN for an ablated head
    loss: float | None = None     # the model's loss with the heads off, where it has one
    full_loss: float | None = None
    sentence_losses: np.ndarray | None = None  # (sentences, 2): each one's next-token loss, full and heads off


def attention_change(full: Sequence[Attention], ablated: Sequence[Attention]) -> np.ndarray:
    """``(layers, heads)``: half the L1 distance between each query row's weights in ``full`` and in
    ``ablated`` (0 unchanged, 1 disjoint), averaged over rows and then over sentences."""
    total = None
    for a, b in zip(full, ablated):
        tv = 0.5 * np.abs(a.weights.astype(np.float64) - b.weights).sum(axis=-1).mean(axis=-1)
        total = tv if total is None else total + tv
    return total / len(full)


def ablate(model: AttentionModel, sentences: Sequence[str], heads, *, ablation: str = "zero",
           head_means=None) -> Ablation:
    """Switch ``heads`` (``(layer, head)`` pairs) off together and measure the effect on the
    embeddings, on every head's attention (later layers change, earlier ones cannot) and, where
    the model has one, on its loss. ``head_means`` defaults to the means over ``sentences``."""
    model = _needs_scratch(model, "Ablation")
    pairs = model.heads(heads)
    if not pairs:
        raise HeadLensError("Pick at least one head to switch off.")
    means = _means(model, sentences, ablation, head_means)
    mask = head_mask(model, pairs)
    full_emb, off_emb = model.embed(sentences), model.embed(sentences, head_mask=mask, head_means=means)
    change = attention_change(model.attend(list(sentences)),
                              model.attend(list(sentences), head_mask=mask, head_means=means))
    for layer, head in pairs:
        change[layer, head] = np.nan
    loss = full_loss = per_sentence = None
    if getattr(model, "loss", None) is not None:
        with torch.inference_mode():
            full_loss = float(model.loss(list(sentences)))
            loss = float(model.loss(list(sentences), head_mask=torch.as_tensor(mask, device=model.device),
                                    head_means=means))
    if hasattr(model, "loss_variants"):  # a language model: each sentence's next-token loss, full and heads off
        full_mask = np.ones_like(mask)
        per_sentence = np.array([model.loss_variants([s], [full_mask, mask], head_means=means) for s in sentences])
    return Ablation(pairs, ablation, cosines(full_emb, off_emb), change, loss, full_loss, per_sentence)


def head_importance(model: AttentionModel, sentences: Sequence[str], *, method: str = "ablation",
                    ablation: str = "zero", head_means=None, reference=None, measure: str = "embedding",
                    batch_size: int = 32, progress: Progress | None = None) -> pd.DataFrame:
    """How much each head matters, one row per ``(layer, head)``: ``layer``, ``head``, ``importance``,
    ``pruned`` (a head the model no longer has; its importance is NaN).

    ``method="ablation"``: one minus the cosine of each sentence's embedding with that head alone
    switched off to ``reference`` (default: the model's own embeddings), averaged over sentences;
    with ``measure="loss"``, the next-token loss with that head alone off minus ``reference``
    (default: the full model's loss). ``method="gradient"`` (a model with a loss): |dL/d(mask of h)| per batch of
    sentences,
    averaged over the batches and L2-normalised within each layer, as Michel et al. (2019) do; with
    ``measure="loss"``, not normalised (nats per unit of the head's gate).
    """
    model = _needs_scratch(model, "Head importance")
    _check_measure(model, measure)
    sentences = list(sentences)
    if not sentences:
        raise HeadLensError("Head importance needs sentences to measure the heads on.")
    present = _present(model)
    heads = [(int(l), int(h)) for l, h in zip(*np.nonzero(present))]
    values = np.full((model.n_layers, model.n_heads), np.nan)
    if method == "ablation":
        means = _means(model, sentences, ablation, head_means)
        masks = [head_mask(model, [pair]) for pair in heads]
        if heads and measure == "loss":
            full = model.predictions(sentences, batch_size=batch_size)[0] if reference is None else reference
            losses = model.loss_variants(sentences, masks, head_means=means, batch_size=batch_size, progress=progress)
            for (layer, head), loss in zip(heads, losses):
                values[layer, head] = float(loss - full)
        elif heads:
            ref = model.embed(sentences, batch_size=batch_size) if reference is None else reference
            variants = model.embed_variants(sentences, masks, head_means=means, batch_size=batch_size,
                                            progress=progress)
            for (layer, head), emb in zip(heads, variants):
                values[layer, head] = float(np.mean(1.0 - cosines(emb, ref)))
    elif method == "gradient":
        values[present] = _gradient_importance(model, sentences, batch_size, progress,
                                               per_layer=measure != "loss")[present]
    else:
        raise HeadLensError(f"Unknown importance method '{method}': choose 'ablation' or 'gradient'.")
    layer, head = np.divmod(np.arange(model.n_layers * model.n_heads), model.n_heads)
    return pd.DataFrame({"layer": layer, "head": head, "importance": values.reshape(-1),
                         "pruned": ~present.reshape(-1)})


def _check_measure(model: AttentionModel, measure: str) -> None:
    if measure not in MEASURES:
        raise HeadLensError(f"Unknown measure '{measure}': choose 'embedding' or 'loss'.")
    if measure == "loss" and not hasattr(model, "loss_variants"):
        raise HeadLensError(f"{model.name} is not a language model: it has no next-token loss; "
                            "use measure='embedding'.")


def _gradient_importance(model, sentences, batch_size, progress, per_layer: bool = True) -> np.ndarray:
    if getattr(model, "loss", None) is None:
        raise HeadLensError(f"{model.name} has no loss to differentiate (it was not trained in HeadLens); "
                            "use method='ablation'.")
    mask = torch.tensor(_present(model).astype(np.float32), device=model.device, requires_grad=True)
    total = torch.zeros_like(mask)
    starts = range(0, len(sentences), max(1, batch_size))
    for n, start in enumerate(starts, 1):
        loss = model.loss(sentences[start:start + batch_size], head_mask=mask)
        (grad,) = torch.autograd.grad(loss, mask)
        total += grad.abs()
        if progress is not None:
            progress(min(start + batch_size, len(sentences)), len(sentences))
    importance = (total / len(starts)).detach().cpu().numpy().astype(np.float64)
    if not per_layer:
        return importance
    norms = np.linalg.norm(importance, axis=1, keepdims=True)
    return np.divide(importance, norms, out=np.zeros_like(importance), where=norms > 0)


def attention_proxies(attentions: Sequence[Attention]) -> pd.DataFrame:
    """What attention alone says of each head, one row per ``(layer, head)``: ``entropy_norm``
    (mean row entropy over its maximum, 1 for uniform) and ``special`` (mean weight on special
    tokens, and on a decoder's sink, which works as a no-op, Clark et al. 2019). They never query."""
    entropy = special = 0.0
    for att in attentions:
        aside = set_aside(att)
        w = att.weights[:, :, ~aside] if (~aside).any() else att.weights
        n_keys = w.shape[-1]
        entropy = entropy + row_entropy(w).mean(axis=-1) / max(np.log(n_keys), 1e-9)
        special = special + w[..., aside].sum(axis=-1).mean(axis=-1)
    L, H = attentions[0].n_layers, attentions[0].n_heads
    layer, head = np.divmod(np.arange(L * H), H)
    return pd.DataFrame({"layer": layer, "head": head,
                         "entropy_norm": (entropy / len(attentions)).reshape(-1),
                         "special": (special / len(attentions)).reshape(-1)})


def proxy_correlations(importance: pd.DataFrame, proxies: pd.DataFrame) -> pd.DataFrame:
    """Spearman's rank correlation of importance with each attention-only proxy, and with the heads'
    roles when ``proxies`` has a ``label`` column (``role_scores``: how well a role alone predicts
    a head's importance)."""
    from scipy.stats import spearmanr

    merged = importance.merge(proxies, on=["layer", "head"])
    merged = merged[~merged["pruned"] & merged["importance"].notna()]
    rows = []
    names = {"entropy_norm": "entropy (normalised)", "special": "weight on [CLS]/[SEP]"}
    for column, name in names.items():
        if column in merged:
            rho, p = spearmanr(merged["importance"], merged[column])
            rows.append({"proxy": name, "spearman": float(rho), "p_value": float(p), "heads": len(merged)})
    if "label" in merged:
        rho, p = spearmanr(merged["importance"], role_scores(merged["importance"], merged["label"]))
        rows.append({"proxy": "role (other heads of the role)", "spearman": float(rho), "p_value": float(p),
                     "heads": len(merged)})
    return pd.DataFrame(rows)


def role_scores(importance: pd.Series, labels: pd.Series) -> np.ndarray:
    """Each head scored by the mean importance of the other heads with its role (leave one out, so a
    head's own importance never predicts itself); a head alone in its role gets the other heads' mean."""
    values, labels = importance.to_numpy(dtype=np.float64), labels.to_numpy()
    out = np.empty(len(values))
    for i in range(len(values)):
        others = (labels == labels[i]) & (np.arange(len(values)) != i)
        if not others.any():
            others = np.arange(len(values)) != i
        out[i] = values[others].mean()
    return out


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


@dataclass
class CurvePoint:
    n_pruned: int
    fraction: float
    fidelity: float
    agreement: float
    forward_s: float
    heads: list[tuple[int, int]]


def pruning_curve(model: AttentionModel, sentences: Sequence[str], *, order: str = "importance",
                  step: float = 0.1, seed: int = 0, ablation: str = "zero", head_means=None,
                  proxies: pd.DataFrame | None = None, measure: str = "embedding",
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
    """
    model = _needs_scratch(model, "Pruning")
    _check_measure(model, measure)
    if order not in ORDERS:
        raise HeadLensError(f"Unknown pruning order '{order}': choose one of {', '.join(ORDERS)}.")
    sentences = list(sentences)
    if len(sentences) < 2:
        raise HeadLensError("A pruning curve needs at least two sentences (neighbour agreement compares them).")
    if getattr(model, "pruned_heads", np.zeros(1)).any():
        raise HeadLensError("Start a pruning curve from a model without pruned heads.")
    means = _means(model, sentences, ablation, head_means)
    total_heads = model.n_layers * model.n_heads
    counts = prune_counts(total_heads, step)
    work = curve_work(model, len(sentences), counts, order, measure)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(min(done, work), work)

    def run(m: AttentionModel):
        return m.predictions(sentences) if measure == "loss" else m.embed(sentences)

    if order == "random":
        rng = np.random.default_rng(seed)
        fixed = [(int(i) // model.n_heads, int(i) % model.n_heads) for i in rng.permutation(total_heads)]
    elif order == "proxy":
        fixed = proxy_order(proxies if proxies is not None else attention_proxies(model.attend(sentences)))
    full = run(model)
    start = time.perf_counter()  # timed on a second run, as every pruned model is timed after the first has run
    run(model)
    full_s = time.perf_counter() - start
    tick(len(sentences))
    pruned: list[tuple[int, int]] = []
    current = model
    rows = []
    for count in counts:
        if count > len(pruned):
            need = count - len(pruned)
            if order == "importance" and count < total_heads:
                before = done
                imp = head_importance(current, sentences, method="gradient" if measure == "loss" else "ablation",
                                      ablation="mean" if means is not None else "zero", head_means=means,
                                      reference=full, measure=measure, progress=lambda d, t: tick(before + d - done))
                ranked = imp[~imp["pruned"]].sort_values("importance", kind="stable")
                chosen = [(int(r.layer), int(r.head)) for r in ranked.head(need).itertuples()]
            elif order == "importance":
                chosen = [(int(l), int(h)) for l, h in zip(*np.nonzero(current.pruned_heads == 0))]
            else:
                chosen = fixed[len(pruned):count]
            pruned += chosen
            current = model.pruned(pruned, head_means=means)
        if count == 0:
            out, seconds = full, full_s
        else:
            start = time.perf_counter()
            out = run(current)
            seconds = time.perf_counter() - start
            tick(len(sentences))
        measured = ({"loss": out[0], "agreement": float(np.mean(out[1] == full[1]))} if measure == "loss" else
                    {"fidelity": float(cosines(full, out).mean()), "agreement": neighbour_agreement(full, out)})
        rows.append({"order": order, "seed": seed if order == "random" else None, "n_pruned": count,
                     "fraction": count / total_heads, **measured, "forward_s": seconds, "heads": sorted(pruned)})
    return pd.DataFrame(rows)


def curve_work(model: AttentionModel, n_sentences: int, counts: list[int], order: str,
               measure: str = "embedding") -> int:
    """Units of work of ``pruning_curve`` (sentences run, once per variant), for a progress bar."""
    evals = (len(counts) + 1) * n_sentences  # the full model runs twice, once to be timed
    if order != "importance":
        return evals
    if measure == "loss":  # gradient importance: one pass over the sentences per step
        return evals + (len(counts) - 2) * n_sentences
    total = model.n_layers * model.n_heads
    return evals + sum(total - c for c in counts[:-2]) * n_sentences  # the last step takes what is left


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


def importance_by_role(importance: pd.DataFrame, labels) -> pd.DataFrame:
    """Mean and largest importance of the heads of each role, most important first: ``role``, ``mean``,
    ``max``, ``heads``."""
    return (importance.assign(role=np.asarray(labels)).groupby("role")["importance"]
            .agg(["mean", "max", "size"]).rename(columns={"size": "heads"}).sort_values("mean", ascending=False)
            .reset_index())


def most_important_with_a_later_layer(importance: pd.DataFrame) -> tuple[int, int]:
    """The most important head that has a layer after it (so that switching it off can change a later
    layer); in a one-layer model, the most important head."""
    last = int(importance["layer"].max())
    earlier = importance[importance["layer"] < last] if last > 0 else importance
    top = earlier.sort_values("importance", ascending=False).iloc[0]
    return int(top["layer"]), int(top["head"])

