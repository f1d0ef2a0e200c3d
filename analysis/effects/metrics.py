"""What a run's final residual stream is read as, for a batch of pairs: one ``Metric`` per kind of prediction
(``readouts`` makes them). A metric holds the pairs' figures (``tokens``, ``weights``) and reads a run's final
residuals ``x`` ``(N, n, E)``, run ``i`` belonging to pair ``rows[i]`` (a language model's runs may hold only the
tokens after a prefix every run shares: it reads the last); where it is linear in what the heads write, it gives
each head's direct part (``heads``, ``parts``), else the sentence saying why it has none (``not_linear``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from models import HeadLensError

from . import parts as P

MASKED_NOT_LINEAR = ("A masked token's logits pass the masked-LM head's dense layer, activation and norm, which are "
                     "not linear: they do not split into each writer's direct part. Patching and attribution "
                     "patching read them.")


class Metric:
    """A metric of each pair of a batch, read from a run's final residual stream (``__call__``), and each head's
    direct part of it (``heads``, ``parts``) where it is linear in what the heads write."""

    not_linear: str | None = None  # why it has no direct parts; None: it has

    def __call__(self, stack, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def direction(self, stack, p: int) -> torch.Tensor:
        """``(E,)``: what pair ``p``'s final hidden state at its last token is read along (its direct attribution)."""
        raise HeadLensError(self.not_linear)

    def heads(self, stack, clean: P.Trace, idx: np.ndarray) -> np.ndarray:
        """``(b, layers, heads)``: each head's direct part of the metric of each clean prompt of a batch's trace,
        pairs ``idx``; NaN where the metric is not linear."""
        if self.not_linear:
            return np.full((len(idx), stack.n_layers, stack.n_heads), np.nan)
        results = P.head_results(stack, clean)                                        # (b, L, H, E)
        out = np.zeros(results.shape[:3])
        for k, p in enumerate(idx):
            frozen, _ = stack.frozen_finish(clean.resid[-1][k, -1])
            out[k] = (frozen(results[k]) @ self.direction(stack, int(p)).to(results.dtype)).double().cpu().numpy()
        return out

    def parts(self, stack, t: P.Trace) -> dict:
        """One prompt's metric (pair 0's) split into what wrote it: ``heads`` ``(layers, heads)``, ``embeddings``,
        ``attention_bias`` and ``mlp`` per layer, the norm's bias ``final_norm``, and ``value``, the metric they add
        up to; read at the last token through the final norm, its scale frozen at the prompt's own value."""
        if self.not_linear:
            raise HeadLensError(self.not_linear)
        toward = self.direction(stack, 0)
        frozen, constant = stack.frozen_finish(t.resid[-1][-1])
        heads = P.head_results(stack, t)                                       # (L, H, E)
        biases = P.attention_biases(stack, t.resid[0][-1])                     # (L, E)
        attn = heads.sum(1) + biases
        mlp = torch.stack([t.resid[i + 1][-1] - t.resid[i][-1] - attn[i] for i in range(stack.n_layers)])
        share = lambda part: (frozen(part) @ toward).double().cpu().numpy()  # noqa: E731
        return {"heads": share(heads), "embeddings": float(share(t.resid[0][-1])),
                "attention_bias": share(biases).tolist(), "mlp": share(mlp).tolist(),
                "final_norm": float(constant @ toward), "value": float(stack.finish(t.resid[-1][-1]) @ toward)}


@dataclass(frozen=True)
class Toward(Metric):
    """One pair's final hidden state at the last token, its dot product with ``vector`` ``(E,)``: the logit
    difference along ``unembedding[answer] - unembedding[distractor]``; every run its own copy of the pair."""

    vector: torch.Tensor

    def __call__(self, stack, x, rows):
        return stack.finish(x[:, -1]) @ self.vector

    def direction(self, stack, p):
        return self.vector


@dataclass(frozen=True)
class TokenLogits(Metric):
    """``sum_k weights[p, k] * logit(tokens[p, k])`` at the last token, the logits read through the unembedding's
    rows alone (a task's logit difference)."""

    tokens: torch.Tensor    # (pairs, K) long
    weights: torch.Tensor   # (pairs, K)

    def __call__(self, stack, x, rows):
        h = stack.finish(x[:, -1])
        tokens, weights = self.tokens[rows], self.weights[rows].to(h.dtype)      # (N, K)
        u = stack.unembedding_rows(tokens.reshape(-1)).view(*tokens.shape, -1).to(h.dtype)   # (N, K, E)
        return torch.einsum("ne,nke,nk->n", h, u, weights)

    def direction(self, stack, p):
        w = self._weights(p)
        u = stack.unembedding_rows(self.tokens[p])
        return (w.to(u.dtype).unsqueeze(-1) * u).sum(0)

    def _weights(self, p: int) -> torch.Tensor:
        return self.weights[p].double()


@dataclass(frozen=True)
class TokenProbs(TokenLogits):
    """The same sum of the tokens' probabilities (a probability difference, greater-than's mass); its direction
    weighs the tokens' logits, each sign's weights scaled to sum to 1 in size."""

    def __call__(self, stack, x, rows):
        h = stack.finish(x[:, -1])
        tokens, weights = self.tokens[rows], self.weights[rows].to(h.dtype)
        logits = stack.logits(h)
        probs = torch.softmax(logits if logits.dtype == torch.float64 else logits.float(), -1).to(h.dtype)  # (N, V)
        return (probs.gather(1, tokens.to(probs.device)) * weights).sum(-1)

    def _weights(self, p):
        w = self.weights[p].double()
        pos, neg = w.clamp_min(0), (-w).clamp_min(0)
        return pos / max(float(pos.sum()), 1e-12) - neg / max(float(neg.sum()), 1e-12)


@dataclass(frozen=True)
class EmbeddingCosine(Metric):
    """The sentence embedding ``e``, the mean of the final hidden states over every token (sentence-transformers'
    pooling), its cosine with ``weights[p]`` ``(pairs, E)``, the answer's unit embedding less the distractor's:
    ``cos(e, answer) - cos(e, distractor)``."""

    weights: torch.Tensor

    def __call__(self, stack, x, rows):
        e = stack.finish(x).mean(1)                                                  # (N, E)
        return (e * self.weights[rows].to(e.dtype)).sum(-1) / e.norm(dim=-1)

    def direction(self, stack, p):
        return self.weights[min(p, len(self.weights) - 1)]

    def heads(self, stack, clean, idx):
        """Every token's part, through the norms above where it was written, frozen (``parts.embedding_parts``)."""
        return P.embedding_parts(stack, clean, self.weights[torch.as_tensor(idx)])["heads"].double().cpu().numpy()

    def parts(self, stack, t):
        found = P.embedding_parts(stack, P.as_batch(t), self.weights[:1])
        value = lambda key: found[key][0].double().cpu().numpy()  # noqa: E731
        return {"heads": value("heads"), "embeddings": float(value("embeddings")),
                "attention_bias": value("attention_bias").tolist(), "mlp": value("mlp").tolist(),
                "final_norm": float(value("norms")),
                "value": float(self(stack, t.resid[-1].unsqueeze(0), torch.zeros(1, dtype=torch.long)))}


@dataclass(frozen=True)
class MaskedLogits(Metric):
    """The masked-LM head's ``sum_k weights[p, k] * logit(tokens[p, k])`` at pair ``p``'s ``[MASK]``,
    ``positions[p]``."""

    tokens: torch.Tensor
    weights: torch.Tensor
    positions: torch.Tensor
    not_linear: ClassVar[str] = MASKED_NOT_LINEAR

    def __call__(self, stack, x, rows):
        rows = rows.to(self.positions.device)
        h = x[torch.arange(len(x), device=x.device), self.positions[rows].to(x.device)]   # (N, E)
        logits = stack.masked_logits(h, self.tokens[rows])                          # (N, K)
        return (logits * self.weights[rows].to(logits.dtype)).sum(-1)


@dataclass(frozen=True)
class ClassLogits(Metric):
    """A sequence classifier's ``logit(answer) - logit(distractor)`` of two classes, ``weights[p]`` ``(pairs,
    classes)`` +1 and -1 at them, from its head on the final hidden states (``stack.prediction_head``); linear where the
    head is (``rows``: a decoder's score on its last token), else ``why`` says why not."""

    weights: torch.Tensor
    why: str | None = None
    rows: torch.Tensor | None = None   # (classes, E): the head's linear rows, when it has them

    @property
    def not_linear(self) -> str | None:
        return None if self.rows is not None else self.why

    def __call__(self, stack, x, rows):
        logits = stack.prediction_head.logits(stack.finish(x))                             # (N, C)
        return (logits * self.weights[rows].to(logits.dtype)).sum(-1)

    def direction(self, stack, p):
        if self.rows is None:
            raise HeadLensError(self.why)
        w = self.weights[min(p, len(self.weights) - 1)]
        return w.to(self.rows.dtype) @ self.rows
