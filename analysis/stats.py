"""How sure a figure is: over a task's pairs, a bootstrap interval, a sign-flip permutation p-value, and the
Benjamini-Hochberg correction across heads (scipy.stats: ``bootstrap``, ``permutation_test``,
``false_discovery_control``); over a corpus's sentences, a Poisson bootstrap of a ratio of sums kept as running
sums, one per head, seeded by each sentence's text (``LiftBootstrap``), which Head roles and the explanations read.

Each function takes per-pair values ``(pairs, cells)``, a column per head (or per layer and position), and
returns one figure per column. A mean normalised over the set, ``mean(effect) / mean(span)``, is bootstrapped
with the pairs resampled together (``paired``); its p-value flips the signs of the effects themselves (under
"no effect" a pair's effect is as likely negative as positive).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from models import HeadLensError

LEVEL = 0.95
RESAMPLES = 1000       # bootstrap resamples
PERMUTATIONS = 2000    # sign flips
REPLICATES = 1000      # a corpus's Poisson bootstrap replicates
ALPHA = 0.05           # the false discovery rate marked


@dataclass(frozen=True)
class Summary:
    """Per column: ``mean``, the interval ``low``..``high``, the p-value and its BH-corrected ``q``."""

    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    p: np.ndarray
    q: np.ndarray

    @property
    def significant(self) -> np.ndarray:
        return self.q < ALPHA


def _check(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError("values are (pairs, cells)")
    if len(values) < 2:
        raise HeadLensError("An interval and a p-value need at least two pairs.")
    return values


def interval(values: np.ndarray, span: np.ndarray | None = None, *, resamples: int = RESAMPLES,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The percentile bootstrap interval at ``LEVEL`` of each column's mean (``span`` given: of
    ``mean(values) / mean(span)``, the pairs resampled together), ``(low, high)``."""
    from scipy import stats
    values = _check(values)
    rng = np.random.default_rng(seed)
    constant = np.ptp(values, axis=0) == 0  # scipy warns on a column that never varies: its interval is its value
    low, high = values.mean(0).copy(), values.mean(0).copy()
    if span is not None:
        s = np.asarray(span, dtype=np.float64)
        low = high = values.mean(0) / s.mean()
        low, high = low.copy(), high.copy()
        constant &= np.ptp(s) == 0
    cols = np.flatnonzero(~constant)
    if not len(cols):
        return low, high
    batch = max(1, 2**24 // (len(values) * len(cols)))  # resamples held at once: about 128 MB
    if span is None:
        res = stats.bootstrap((values[:, cols],), np.mean, axis=0, vectorized=True, n_resamples=resamples,
                              confidence_level=LEVEL, method="percentile", rng=rng, batch=batch)
    else:
        spans = np.broadcast_to(np.asarray(span, dtype=np.float64)[:, None], (len(values), len(cols)))

        def ratio(e, s, axis=-1):
            return e.mean(axis) / s.mean(axis)

        res = stats.bootstrap((values[:, cols], spans), ratio, paired=True, axis=0, vectorized=True,
                              n_resamples=resamples, confidence_level=LEVEL, method="percentile", rng=rng,
                              batch=batch)
    low[cols], high[cols] = res.confidence_interval.low, res.confidence_interval.high
    return low, high


def sign_flip_p(values: np.ndarray, *, permutations: int = PERMUTATIONS, seed: int = 0) -> np.ndarray:
    """Each column's two-sided p-value that its mean is zero, by flipping the signs of the pairs' values at
    random (exact when ``2 ** pairs`` is at most ``permutations``); 1 for a column of zeros."""
    from scipy import stats
    values = _check(values)
    p = np.ones(values.shape[1])
    cols = np.flatnonzero(np.any(values != 0, axis=0))
    if len(cols):
        batch = max(1, 2**24 // (len(values) * len(cols)))
        res = stats.permutation_test((values[:, cols],), np.mean, permutation_type="samples", vectorized=True,
                                     n_resamples=permutations, alternative="two-sided", axis=0,
                                     rng=np.random.default_rng(seed), batch=batch)
        p[cols] = res.pvalue
    return p


def corrected(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg's adjusted p-values (q) across all the columns."""
    from scipy import stats
    return stats.false_discovery_control(np.asarray(p, dtype=np.float64), method="bh")


def summarise(values: np.ndarray, span: np.ndarray | None = None, *, seed: int = 0) -> Summary:
    """Mean, interval, p and q of each column; with ``span``, the mean normalised over the set."""
    values = _check(values)
    mean = values.mean(0) if span is None else values.mean(0) / np.mean(span)
    low, high = interval(values, span, seed=seed)
    p = sign_flip_p(values, seed=seed)
    return Summary(mean, low, high, p, corrected(p))


def text_key(text: str) -> int:
    """A 64-bit number from a sentence's text that seeds its bootstrap counts."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def poisson_counts(key: int, replicates: int = REPLICATES) -> np.ndarray:
    """How many times one sentence appears in each bootstrap resample."""
    return np.random.default_rng([key, replicates]).poisson(1.0, replicates).astype(np.float64)


class LiftBootstrap:
    """Running sums of a Poisson bootstrap of ``sum(share) / sum(base)``, one per head.

    ``add`` one sentence at a time; ``merge`` another's sums (another shard of the corpus);
    ``interval`` gives the percentile interval. Memory is ``replicates x heads`` floats whatever
    the number of sentences.
    """

    FLUSH = 256  # sentences buffered before one matrix product

    def __init__(self, shape: tuple[int, ...], replicates: int = REPLICATES):
        self.shape, self.replicates = tuple(shape), replicates
        self.shares = np.zeros((replicates, int(np.prod(shape))))
        self.bases = np.zeros(replicates)
        self._pending: list[tuple[np.ndarray, np.ndarray, float]] = []

    def add(self, key: int, share: np.ndarray, base: float) -> None:
        self._pending.append((poisson_counts(key, self.replicates), np.asarray(share, np.float64).ravel(), base))
        if len(self._pending) >= self.FLUSH:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        counts = np.stack([c for c, _, _ in self._pending])  # (sentences, replicates)
        self.shares += counts.T @ np.stack([s for _, s, _ in self._pending])
        self.bases += counts.T @ np.array([b for _, _, b in self._pending])
        self._pending.clear()

    def __getstate__(self) -> dict:
        self._flush()  # sent as sums, whatever was buffered
        return self.__dict__

    def merge(self, other: "LiftBootstrap") -> None:
        self._flush()
        other._flush()
        self.shares += other.shares
        self.bases += other.bases

    def interval(self, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)``, each shaped like the heads; NaN when no sentence was added."""
        self._flush()
        used = self.bases > 0  # a resample that drew no sentence has no lift
        if not used.any():
            nan = np.full(self.shape, np.nan)
            return nan, nan.copy()
        lifts = self.shares[used] / self.bases[used, None]
        tail = (1 - level) / 2 * 100
        low, high = np.percentile(lifts, [tail, 100 - tail], axis=0)
        return low.reshape(self.shape), high.reshape(self.shape)
