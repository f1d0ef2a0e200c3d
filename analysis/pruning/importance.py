"""Which heads matter: each head's importance, and how it compares with what attention alone shows.

A head's importance is the exact effect of removing it alone on the model's output: one minus the cosine
of each sentence's embedding to the reference, averaged over the sentences. Models with a loss also have
Michel et al.'s (2019) gradient importance, |dL/d(mask of h)|, averaged over the data and L2-normalised per
layer.

A language model (SmolLM2) is measured by what it is for, ``measure="loss"``: a head's ablation importance
is the rise of the next-token loss with it alone switched off, its gradient importance |dL/d(mask of h)|
without the per-layer normalisation (on SmolLM2 the normalised ranking prunes worse than random order:
``bench.bench_smollm2_pruning``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from models import Attention, AttentionModel, HeadLensError
from models.run import editable

from .ablation import ablation_means, cosines, head_mask, present_heads
from ..attention.views import row_entropy, set_aside

MEASURES = {"embedding": "the sentence embedding (mean of the last layer)", "loss": "the next-token loss"}
Progress = Callable[[int, int], None]


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
    model = editable(model, "Head importance switches heads off")
    check_measure(model, measure)
    sentences = list(sentences)
    if not sentences:
        raise HeadLensError("Head importance needs sentences to measure the heads on.")
    present = present_heads(model)
    heads = [(int(l), int(h)) for l, h in zip(*np.nonzero(present))]
    values = np.full((model.n_layers, model.n_heads), np.nan)
    if method == "ablation":
        means = ablation_means(model, sentences, ablation, head_means)
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


def check_measure(model: AttentionModel, measure: str) -> None:
    if measure not in MEASURES:
        raise HeadLensError(f"Unknown measure '{measure}': choose 'embedding' or 'loss'.")
    if measure == "loss" and not hasattr(model, "loss_variants"):
        raise HeadLensError(f"{model.name} is not a language model: it has no next-token loss; "
                            "use measure='embedding'.")


def _gradient_importance(model, sentences, batch_size, progress, per_layer: bool = True) -> np.ndarray:
    if getattr(model, "loss", None) is None:
        raise HeadLensError(f"{model.name} has no loss to differentiate (it was not trained in HeadLens); "
                            "use method='ablation'.")
    mask = torch.tensor(present_heads(model).astype(np.float32), device=model.device, requires_grad=True)
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
