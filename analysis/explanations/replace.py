"""A head replaced by its explanation: its attention pattern predicted by its program (``programs.Program``), in
one run with edits (the ``pattern`` point of ``models.run``), and what the model loses, beside the same heads
mean-ablated.

The program's pattern: each query a score reads gets the program's whole row, its rules' parts and the fallback on
the content keys, the head's mean shares on the first token (and an encoder's other special tokens). Rows the score
does not read (a decoder's first token, an encoder's special tokens) keep the head's own weights. The loss: a
decoder's mean next-token cross-entropy on the texts; an encoder's mean cosine of each text's embedding (mean-pooled,
as the sentence model pools) to the unedited model's. By default the texts are the built-in paragraphs' held-out
half, and the means of mean ablation come from the fit half.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from models import HeadLensError
from models.base import mean_pooled
from models.corpus import paragraph_halves
from models.run import Edits, device_of, editable

from ..effects.readouts import own_readout
from ..roles.rules import Reading
from .programs import Program


def _groups(model, texts: list[str]) -> list[tuple[list[int], dict]]:
    """The texts in batches of one token count (no padding): ``(indices, model inputs)``."""
    counts = model.token_counts(texts)
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(counts):
        by_length.setdefault(n, []).append(i)
    out = []
    for _, idx in sorted(by_length.items()):
        enc = model.tokenize([texts[i] for i in idx], truncation=True, max_length=model.max_tokens,
                             return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
        out.append((idx, enc))
    return out


class Replacer:
    """Runs of ``texts`` through ``model`` with heads replaced by their programs (``run(heads)``) or mean-ablated
    (``run(heads, ablate=True)``), each measured as ``measure`` says: "loss" or "cosine"."""

    def __init__(self, model, explanations: pd.DataFrame, texts: Sequence[str], *, means: np.ndarray):
        self.model = editable(model, "Replacing a head by its rule")
        self.stack = self.model.stack
        self.device = device_of(self.stack)
        self.causal = bool(self.model.causal)
        self.measure = own_readout(self.model, self.stack).on_text
        self.programs = {(int(r.layer), int(r.head)): Program.of(r) for r in explanations.itertuples()}
        self.texts = list(texts)
        self.groups = _groups(self.model, self.texts)
        self.readings = [[Reading.read(self.model, self.texts[i]) for i in idx] for idx, _ in self.groups]
        self.means = means
        self._patterns: dict = {}
        self.reference = None
        self.unedited = self.run(())

    def _pattern(self, group: int, head: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A group's pattern of ``head``'s program ``(B, n, n)`` and the rows it replaces ``(B, n)``, made once."""
        key = (group, head)
        if key not in self._patterns:
            made = [self.programs[head].pattern(r) for r in self.readings[group]]
            self._patterns[key] = (torch.as_tensor(np.stack([p for p, _ in made])),
                                   torch.as_tensor(np.stack([w for _, w in made])))
        return self._patterns[key]

    def _edits(self, heads, group: int) -> Edits:
        by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            by_layer.setdefault(layer, []).append(head)
        edits = {}
        for layer, hs in by_layer.items():
            kept = list(self.stack.kept[layer])
            patterns = [(kept.index(h), *self._pattern(group, (layer, h))) for h in hs if h in kept]
            if patterns:
                edits[("pattern", layer)] = self._replacing(patterns)
        return Edits(edits)

    @staticmethod
    def _replacing(patterns) -> Callable:
        """The ``pattern`` edit setting each ``(kept index, pattern, rows)``'s rows to its pattern."""
        at = torch.tensor([i for i, _, _ in patterns], dtype=torch.long)
        pattern = torch.stack([p for _, p, _ in patterns], 1)                   # (B, k, n, n)
        rows = torch.stack([r for _, _, r in patterns], 1)[..., None]           # (B, k, n, 1)

        def replace(weights):                                                   # (B, kept, n, keys)
            weights = weights.clone()
            at_, rows_ = at.to(weights.device), rows.to(weights.device)
            weights[:, at_] = torch.where(rows_, pattern.to(weights.device, weights.dtype), weights[:, at_])
            return weights
        return replace

    @torch.inference_mode()
    def run(self, heads, *, ablate: bool = False) -> float:
        """The measure with ``heads`` (``(layer, head)`` pairs) replaced by their programs, or (``ablate``)
        mean-ablated."""
        heads = [(int(a), int(b)) for a, b in heads]
        missing = [h for h in heads if h not in self.programs]
        if missing:
            raise HeadLensError(f"Layer {missing[0][0]}, head {missing[0][1]} has no explanation to replace it by.")
        total, count, pooled = 0.0, 0, []
        for group, (idx, enc) in enumerate(self.groups):
            ids = enc["input_ids"].to(self.device)
            mask = torch.ones_like(ids)
            options = {}
            if "token_type_ids" in self.stack.input_names and "token_type_ids" in enc:
                options["token_type_ids"] = enc["token_type_ids"].to(self.device)
            if ablate and heads:
                off = torch.ones(self.model.n_layers, self.model.n_heads, device=self.device)
                for layer, head in heads:
                    off[layer, head] = 0
                options.update(head_mask=off, head_fill=torch.as_tensor(self.means, dtype=torch.float32,
                                                                          device=self.device))
            elif heads:
                options["edits"] = self._edits(heads, group)
            h = self.stack(ids, mask, need_weights=False, need_logits=False, **options).last_hidden_state
            if self.measure == "loss":
                s, c, _ = self.model.next_token_sums(h, ids, mask)
                total, count = total + float(s), count + c
            else:
                pooled.append((idx, mean_pooled(h, mask)))
        if self.measure == "loss":
            return total / max(count, 1)
        embeddings = np.zeros((sum(len(i) for i, _ in pooled), pooled[0][1].shape[1]))
        for idx, e in pooled:
            embeddings[idx] = e
        if self.reference is None:
            self.reference = embeddings
        return float((embeddings * self.reference).sum(1).mean())


def _means(model, texts: Sequence[str]) -> np.ndarray:
    return editable(model, "Mean ablation").head_means(list(texts))


def replace_heads(model, explanations: pd.DataFrame, heads, texts: Sequence[str] | None = None, *,
                  means_of: Sequence[str] | None = None) -> dict:
    """``heads`` (``(layer, head)`` pairs) replaced by their programs from ``explanations`` (``explain_heads``'s
    frame) on ``texts`` (default: the built-in paragraphs' held-out half): ``{"measure", "unedited", "replaced",
    "mean_ablated"}``, a decoder's loss or an encoder's cosine to the unedited embedding. Mean ablation puts each
    head's mean output over ``means_of`` (default: the fit half) in its place."""
    fit, held = paragraph_halves()
    r = Replacer(model, explanations, list(held if texts is None else texts),
                 means=_means(model, fit if means_of is None else means_of))
    heads = list(heads)
    return {"measure": r.measure, "heads": len(heads), "unedited": r.unedited, "replaced": r.run(heads),
            "mean_ablated": r.run(heads, ablate=True)}


def replacement_counts(n: int) -> list[int]:
    """The numbers of best-explained heads a curve replaces: 1, 2, 4, a tenth, a quarter, a half, all."""
    return sorted({k for k in (1, 2, 4, round(n / 10), round(n / 4), round(n / 2), n) if 1 <= k <= n})


def replacement_curve(model, explanations: pd.DataFrame, texts: Sequence[str] | None = None, *,
                      counts: Sequence[int] | None = None, means_of: Sequence[str] | None = None,
                      progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """The ``k`` best-explained heads (by the held-out IoU of their whole rows) replaced by their programs, and
    mean-ablated, for each ``k`` of ``counts`` (``replacement_counts``): one row per ``k`` (``k, measure, unedited,
    replaced, mean_ablated``)."""
    fit, held = paragraph_halves()
    order = explanations.sort_values(["iou_full", "layer", "head"], ascending=[False, True, True])
    heads = list(zip(order["layer"].astype(int), order["head"].astype(int)))
    counts = replacement_counts(len(heads)) if counts is None else sorted(set(int(k) for k in counts))
    runs = 2 + 2 * len(counts)  # the means, the unedited run, then each count replaced and mean-ablated

    def ran(i: int) -> None:
        if progress is not None:
            progress(i, runs)

    means = _means(model, fit if means_of is None else means_of)
    ran(1)
    r = Replacer(model, explanations, list(held if texts is None else texts), means=means)
    ran(2)
    rows = []
    for i, k in enumerate(counts):
        replaced = r.run(heads[:k])
        ran(3 + 2 * i)
        rows.append({"k": k, "measure": r.measure, "unedited": r.unedited, "replaced": replaced,
                     "mean_ablated": r.run(heads[:k], ablate=True)})
        ran(4 + 2 * i)
    out = pd.DataFrame(rows)
    out.attrs["texts"] = len(r.texts)
    return out
