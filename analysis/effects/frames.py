"""Which heads make a prediction: direct logit attribution and activation patching.

Direct logit attribution splits a decoder's logit difference ``logit(answer) - logit(distractor)``
at the last position into what each part of the residual stream writes: the embeddings, each
head, each attention's bias, each MLP, and the final norm's bias, the norm's scale frozen at the
model's own value so that the parts add up to the model's logit difference exactly.

Activation patching (as TransformerLens's ``patching`` names it) runs the corrupted prompt with one
activation taken from the clean run, a head's output ``z`` before the output projection or the
residual stream entering a layer, at every position or at one, and reports the share of the logit
difference it brings back: ``recovered = (LD_patched - LD_corrupted) / (LD_clean - LD_corrupted)``.
Every edit of one layer runs as one batch, and each copy recomputes only the layers above its edit
(``parts``). Attribution patching (Nanda 2023) estimates every patch at once from one
forward and one backward pass of the corrupted prompt.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from models import AttentionModel, HeadLensError
from models.run import patching_stack

from ..defaults import Pair
from .traced import Traced, as_traced
from . import parts as P
from .metrics import Metric
from .readouts import Readout, readout_for
METHODS = {"exact": "exact patching: the corrupted prompt rerun with each activation patched",
           "attribution": "attribution patching: a first-order estimate from one forward and one backward pass"}

Progress = Callable[[int, int], None]


def repeated_pair(model: AttentionModel, tokens: list[str]) -> Pair:
    """An induction pair from a sequence whose second half repeats its first (a trained decoder's held-out
    sequence, written in its own tokens): the clean prompt stops before the last token, which the first half
    shows; the corrupted one has another token there in the first half, its distractor."""
    half = len(tokens) // 2
    if len(tokens) < 4 or tokens[:half] != tokens[half:2 * half]:
        raise HeadLensError("An induction pair needs a sequence whose second half repeats its first.")
    answer = tokens[2 * half - 1]
    vocab = model.tokenizer.get_vocab()
    other = next(t for t in sorted(vocab, key=vocab.get) if t not in tokens and t not in
                 model.tokenizer.all_special_tokens)
    corrupted = [*tokens[:half - 1], other, *tokens[half:2 * half - 1]]
    return Pair("Induction: a held-out sequence", "induction", " ".join(tokens[:2 * half - 1]), " ".join(corrupted),
                vocab[answer], vocab[other])


def top_predictions(model: AttentionModel, text: str, k: int = 8) -> list[tuple[int, float]]:
    """The ``k`` most likely next tokens after ``text``: ``(token id, probability)``, most likely first."""
    t = as_traced(model, text)
    with torch.inference_mode():
        probs = torch.softmax(t.stack.logits(t.stack.finish(t.trace.resid[-1][-1])).float(), dim=-1)
    top = probs.topk(k)
    return [(int(i), float(p)) for i, p in zip(top.indices, top.values)]


def logit_attribution(model: AttentionModel, prompt: str | Traced, answer, distractor=None) -> pd.DataFrame:
    """Direct logit attribution of ``prompt``'s prediction, read as the model's readout reads it
    (``readouts``): one row per ``(layer, head)`` with ``attribution``, the head's direct part of the metric. On a
    language model, the head's output at the last position through the final norm (its scale frozen at the
    model's own value) and the unembedding, on ``logit(answer) - logit(distractor)`` (``logit(answer)`` without
    one); on an encoder, the embedding difference split into what wrote it, each part through the post-LayerNorms
    above it, their scales frozen at the run's values (``parts.embedding_parts``).

    ``frame.attrs`` holds the other parts, which with the heads add up to ``logit_diff``, the model's
    own: ``embeddings``, ``attention_bias`` and ``mlp`` (one value per layer), ``final_norm`` (its
    bias), and ``answer``, ``distractor``, ``tokens``, ``metric``.
    """
    traced_prompt = as_traced(model, prompt)
    stack, t = traced_prompt.stack, traced_prompt.trace
    readout = readout_for(model, traced_prompt.text, stack)
    if distractor is None:
        (metric, a_text), d_text = readout.alone(t.ids.tolist(), answer), None
    else:
        metric, a_text, d_text = readout.pair(t.ids.tolist(), answer, distractor)
    with torch.inference_mode():
        parts = metric.parts(stack, t)
    frame = _frame(parts["heads"], ("layer", "head"), column="attribution")
    frame.attrs.update(embeddings=parts["embeddings"], attention_bias=parts["attention_bias"], mlp=parts["mlp"],
                       final_norm=parts["final_norm"], logit_diff=parts["value"], answer=a_text, distractor=d_text,
                       tokens=traced_prompt.tokens, metric=readout.metric)
    return frame


def parts_total(frame: pd.DataFrame) -> float:
    """What ``logit_attribution``'s parts add up to: every head, the embeddings, biases, MLPs and the norm."""
    a = frame.attrs
    return float(frame["attribution"].sum() + a["embeddings"] + sum(a["attention_bias"]) + sum(a["mlp"])
                 + a["final_norm"])


@dataclass(frozen=True)
class _Setup:
    model: AttentionModel
    stack: object
    clean: P.Trace
    corrupted: P.Trace
    readout: Readout
    measure: Metric
    ld_clean: float
    ld_corrupted: float
    tokens: list[str]
    answer: str
    distractor: str

    @property
    def span(self) -> float:
        return self.ld_clean - self.ld_corrupted

    def attrs(self, method: str) -> dict:
        return {"ld_clean": self.ld_clean, "ld_corrupted": self.ld_corrupted, "method": method,
                "tokens": self.tokens, "metric": self.readout.metric, "answer": self.answer,
                "distractor": self.distractor}


def _setup(model, clean: str | Traced, corrupted: str | Traced, answer, distractor) -> _Setup:
    stack = patching_stack(model)
    clean, corrupted = (as_traced(model, prompt, noun, stack) for prompt, noun in ((clean, "clean prompt"),
                                                                                   (corrupted, "corrupted prompt")))
    readout = readout_for(model, clean.text, stack)
    measure, a, d = readout.pair(clean.ids.tolist(), answer, distractor)
    ids_clean, ids_corrupted = clean.ids, corrupted.ids
    if len(ids_clean) != len(ids_corrupted):
        raise HeadLensError(f"Patching puts each clean activation at the same position of the corrupted prompt, so "
                            f"both need as many tokens: the clean prompt has {len(ids_clean)}, the corrupted one "
                            f"{len(ids_corrupted)}.")
    t_clean, t_corrupted = clean.trace, corrupted.trace
    ld_clean, ld_corrupted = _measured(stack, t_clean, measure), _measured(stack, t_corrupted, measure)
    if abs(ld_clean - ld_corrupted) < 1e-6:
        raise HeadLensError(f"The clean and corrupted prompts give the same {readout.title} ({ld_clean:.3f}), so "
                            "there is nothing for a patch to recover; corrupt the prompt where it decides the answer.")
    return _Setup(model, stack, t_clean, t_corrupted, readout, measure, ld_clean, ld_corrupted, corrupted.tokens,
                  a, d)


def _measured(stack, t: P.Trace, measure: Metric) -> float:
    with torch.inference_mode():
        return float(measure(stack, t.resid[-1].unsqueeze(0), torch.zeros(1, dtype=torch.long)))


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise HeadLensError(f"Unknown patching method '{method}': choose {' or '.join(repr(m) for m in METHODS)}.")


def patch_heads(model: AttentionModel, clean: str | Traced, corrupted: str | Traced, answer, distractor, *, per_position: bool = False,
                method: str = "exact", progress: Progress | None = None) -> pd.DataFrame:
    """Each head's output ``z`` in the corrupted run replaced by the clean run's, at every position or
    (``per_position``) at one: rows ``layer``, ``head`` (and ``position``, ``token``) with ``recovered``. Either
    prompt may be given ``traced`` already (as every function here takes a prompt), to run it once for them all.

    ``method="attribution"`` estimates every patch from one forward and one backward pass instead.
    ``frame.attrs``: ``ld_clean``, ``ld_corrupted``, ``method``, ``tokens`` (the corrupted prompt's).
    """
    _check_method(method)
    s = _setup(model, clean, corrupted, answer, distractor)
    L, H, n = s.stack.n_layers, s.stack.n_heads, len(s.tokens)
    if method == "attribution":
        estimate = P.attribution_estimates(s.model, s.clean, s.corrupted, s.measure, s.stack)[0] / s.span   # (L, H, n)
        values = estimate if per_position else estimate.sum(-1)
    else:
        values = _exact_heads(s, L, H, n, per_position, progress)
    frame = _frame(values, ("layer", "head", "position") if per_position else ("layer", "head"), s.tokens)
    frame.attrs.update(s.attrs(method))
    return frame


def _exact_heads(s: _Setup, L: int, H: int, n: int, per_position: bool, progress) -> np.ndarray:
    stack = s.stack
    if not per_position:
        layers, heads = np.divmod(np.arange(L * H), H)
        patched = P.patched_differences(s.model, s.clean, s.corrupted, layers, heads, np.full(L * H, -1), s.measure,
                                        progress=progress, stack=s.stack)
        return ((patched - s.ld_corrupted) / s.span).reshape(L, H)
    values = np.zeros((L, H, n))  # a patch that changes nothing recovers nothing: only differing z's are run
    edits = [(layer, h, p) for layer in range(L) for k, h in enumerate(stack.kept[layer]) for p in range(n)
             if not torch.equal(s.clean.z[layer][k, p], s.corrupted.z[layer][k, p])]
    if edits:
        layers, heads, positions = (np.array(c) for c in zip(*edits))
        patched = P.patched_differences(s.model, s.clean, s.corrupted, layers, heads, positions, s.measure,
                                        progress=progress, stack=s.stack)
        values[layers, heads, positions] = (patched - s.ld_corrupted) / s.span
    elif progress is not None:
        progress(1, 1)
    return values


def patch_residual(model: AttentionModel, clean: str | Traced, corrupted: str | Traced, answer, distractor, *, method: str = "exact",
                   progress: Progress | None = None) -> pd.DataFrame:
    """The residual stream entering each layer (``resid_pre``) at one position, from the clean run into the
    corrupted one: rows ``layer``, ``position``, ``token`` with ``recovered`` (TransformerLens's first picture:
    where the information that decides the answer sits, layer by layer)."""
    _check_method(method)
    s = _setup(model, clean, corrupted, answer, distractor)
    L, n = s.stack.n_layers, len(s.tokens)
    if method == "attribution":
        values = P.attribution_estimates(s.model, s.clean, s.corrupted, s.measure, s.stack)[1] / s.span
    else:
        values = np.zeros((L, n))
        # some position differs at some layer: prompts whose every stream is the same give the same measure, which
        # ``_setup`` refuses
        edits = [(layer, p) for layer in range(L) for p in range(n)
                 if not torch.equal(s.clean.resid[layer][p], s.corrupted.resid[layer][p])]
        layers, positions = (np.array(c) for c in zip(*edits))
        patched = P.patched_differences(s.model, s.clean, s.corrupted, layers, np.full(len(edits), -1), positions,
                                        s.measure, progress=progress, stack=s.stack)
        values[layers, positions] = (patched - s.ld_corrupted) / s.span
    frame = _frame(values, ("layer", "position"), s.tokens)
    frame.attrs.update(s.attrs(method))
    return frame


def _frame(values: np.ndarray, axes: tuple[str, ...], tokens: list[str] | None = None,
           column: str = "recovered") -> pd.DataFrame:
    """One row per cell of ``values``, an index column per axis (and ``token`` beside ``position``)."""
    index = np.indices(values.shape).reshape(len(axes), -1)
    frame = pd.DataFrame({name: index[i] for i, name in enumerate(axes)})
    if "position" in axes:
        frame["token"] = [tokens[p] for p in frame["position"]]
    frame[column] = values.reshape(-1)
    return frame


def grid(frame: pd.DataFrame, column: str, n_layers: int, n_heads: int) -> np.ndarray:
    """``(layers, heads)`` of a per-head frame's ``column`` (summed over positions where it has them)."""
    out = np.zeros((n_layers, n_heads))
    summed = frame.groupby(["layer", "head"])[column].sum()
    out[summed.index.get_level_values(0), summed.index.get_level_values(1)] = summed.to_numpy()
    return out
