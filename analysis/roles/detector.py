"""The decoder head detector: previous-token, duplicate-token, induction and sink heads, with intervals.

Olsson et al. (2022) find induction heads on random token sequences repeated twice: a head of the
second copy that looks at the token *after* the earlier occurrence of its own token is completing
the pattern, one that looks at the earlier occurrence itself is a duplicate-token head.
TransformerLens's head detector gives these scores without intervals; here each is a mean over
sequences (or sentences) with a 95% bootstrap interval over them (scipy's percentile bootstrap).

- ``induction``: on each repeated sequence, the mean over the queries of the second copy of the
  weight on the token after the query's earlier occurrence;
- ``duplicate_token``: the same, on the earlier occurrence itself;
- ``previous_token``: on natural sentences, the mean over queries of the weight on the token just
  before (queries whose own token or previous token is set aside, ``views.set_aside``, are left out);
- ``sink``: on natural sentences, the mean over the queries after the first of the weight on the
  first token (a BOS where the model adds one, as Gemma 3 does; else the first word, as in SmolLM2).

A repeated sequence is a lead word ("The", so that no copy starts the text: a byte-level tokenizer
writes a text's first word without its leading space, as another token) and then ``length`` words
drawn at random from the tokenizer's own whole-word tokens, twice; every text is checked to come
back from the tokenizer as exactly those tokens.
"""
from __future__ import annotations

import re
import weakref
from collections.abc import Sequence

import numpy as np
import pandas as pd

from models import AttentionModel, HeadLensError
from models.corpus import CORPUS

from ..defaults import DETECTOR_LENGTH, DETECTOR_SENTENCES, DETECTOR_SEQUENCES
from ..attention.views import set_aside

DETECTORS = ("previous_token", "duplicate_token", "induction", "sink")
LEAD = "The"
LEVEL = 0.95
RESAMPLES = 1000
_WORD = re.compile(r"[a-z]{3,12}")


_WHOLE_WORDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tokenizer -> its whole words


def whole_words(tokenizer) -> list[str]:
    """Lower-case words of 3 to 12 letters that the tokenizer writes, after a space, as one token of its own
    (read once per tokenizer: it tokenizes every such word of the vocabulary, about a second for SmolLM2's)."""
    if tokenizer not in _WHOLE_WORDS:
        words = sorted({w for w in (_word(t) for t in tokenizer.convert_ids_to_tokens(range(len(tokenizer)))) if w})
        ids = tokenizer([" " + w for w in words], add_special_tokens=False)["input_ids"] if words else []
        _WHOLE_WORDS[tokenizer] = tuple(w for w, i in zip(words, ids) if len(i) == 1)
    return list(_WHOLE_WORDS[tokenizer])


def _word(token: str | None) -> str | None:
    if not token or token.startswith("##"):
        return None
    for mark in ("Ġ", "▁"):  # byte-level BPE and SentencePiece write a leading space so
        token = token.removeprefix(mark)
    return token if _WORD.fullmatch(token) else None


def repeated_sequences(tokenizer, n: int, length: int, seed: int = 0) -> list[str]:
    """``n`` texts: ``LEAD``, then ``length`` random whole-word tokens, then the same tokens again."""
    words = whole_words(tokenizer)
    if len(words) < length:
        raise HeadLensError(f"The tokenizer has {len(words)} whole-word tokens; a repeated sequence needs {length}.")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        drawn = " ".join(rng.choice(words, size=length, replace=False))
        out.append(f"{LEAD} {drawn} {drawn}")
    return out


def copy_positions(att, length: int) -> int:
    """The position of the first copy's first token in ``att``; a sentence when the text did not come back
    from the tokenizer as the lead, then the same ``length`` tokens twice."""
    content = np.flatnonzero(~np.asarray(att.special, dtype=bool))
    ids = [att.tokens[i] for i in content]
    lead = len(ids) - 2 * length
    if lead < 1 or ids[lead:lead + length] != ids[lead + length:]:
        raise HeadLensError("A repeated sequence did not tokenize as two equal copies.")
    start = int(content[lead])
    if not np.array_equal(content[lead:], np.arange(start, start + 2 * length)):
        raise HeadLensError("A repeated sequence has special tokens inside it.")
    return start


def repeat_scores(weights: np.ndarray, start: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(induction, duplicate_token)``, each ``(layers, heads)``, of one repeated sequence's weights
    ``(layers, heads, n, n)`` whose first copy starts at ``start``."""
    j = np.arange(length)
    queries = start + length + j            # each token of the second copy
    earlier = start + j                     # its earlier occurrence
    induction = weights[..., queries, earlier + 1].mean(-1)
    duplicate = weights[..., queries, earlier].mean(-1)
    return induction, duplicate


def text_scores(att) -> tuple[np.ndarray, np.ndarray]:
    """``(previous_token, sink)``, each ``(layers, heads)``, of one natural sentence; NaN where it has no such query."""
    w = att.weights
    aside = set_aside(att)
    n = w.shape[-1]
    prev_q = [i for i in range(1, n) if not aside[i] and not aside[i - 1]]
    nan = np.full(w.shape[:2], np.nan)
    previous = w[..., prev_q, [i - 1 for i in prev_q]].mean(-1) if prev_q else nan
    first = 0  # the text's first token, a BOS where the model adds one (Gemma's <bos>) or its first word
    later = np.arange(first + 1, n)
    later = later[~np.asarray(att.special, dtype=bool)[later]]
    sink = w[..., later, first].mean(-1) if later.size else nan
    return previous, sink


def interval(values: np.ndarray, level: float = LEVEL, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over the first axis of ``values`` ``(items, ...)`` with its percentile bootstrap interval over
    the items; items that are NaN for a head are left out of that head."""
    from scipy.stats import bootstrap
    flat = values.reshape(len(values), -1)
    shape = values.shape[1:]
    if len(flat) >= 2 and not np.isnan(flat).any() and (np.ptp(flat, axis=0) > 0).all():  # every head at once
        ci = bootstrap((flat,), np.mean, confidence_level=level, n_resamples=RESAMPLES, method="percentile",
                       axis=0, batch=100, rng=np.random.default_rng(seed)).confidence_interval
        return flat.mean(0).reshape(shape), ci.low.reshape(shape), ci.high.reshape(shape)
    mean, lo, hi = (np.full(flat.shape[1], np.nan) for _ in range(3))
    for k in range(flat.shape[1]):
        x = flat[:, k][~np.isnan(flat[:, k])]
        if x.size == 0:
            continue
        mean[k] = x.mean()
        if x.size < 2 or np.ptp(x) == 0:
            lo[k] = hi[k] = mean[k]
            continue
        ci = bootstrap((x,), np.mean, confidence_level=level, n_resamples=RESAMPLES, method="percentile",
                       rng=np.random.default_rng(seed)).confidence_interval
        lo[k], hi[k] = ci.low, ci.high
    return mean.reshape(shape), lo.reshape(shape), hi.reshape(shape)


SENTENCES = DETECTOR_SENTENCES  # the defaults table's (``analysis.defaults``)
SEQUENCES, LENGTH = DETECTOR_SEQUENCES, DETECTOR_LENGTH


BATCH = 8  # texts run at once: a progress point at least every second on two cores (SmolLM2)


def head_detector(model: AttentionModel, *, seed: int = 0, sentences: Sequence[str] | None = None,
                  n_sequences: int = 32, length: int = 30, progress=None) -> pd.DataFrame:
    """Every head's previous-token, duplicate-token, induction and sink score with 95% intervals.

    Args:
        model: any ``AttentionModel`` (a decoder is what these scores are for).
        seed: draws the random sequences.
        sentences: natural text for ``previous_token`` and ``sink`` (default: the built-in corpus).
        n_sequences, length: how many repeated sequences, of how many tokens each copy.

    Returns one row per ``(layer, head)``: ``layer``, ``head``, and for each score ``s`` of
    ``DETECTORS`` the columns ``s``, ``s_lo`` and ``s_hi``.
    """
    sentences = list(CORPUS if sentences is None else sentences)
    if not sentences or n_sequences < 1 or length < 2:
        raise HeadLensError("The head detector needs sentences, at least one repeated sequence and a length of 2 or more.")
    texts = repeated_sequences(model.tokenizer, n_sequences, length, seed)
    total = len(texts) + len(sentences)

    def told(offset: int):  # progress over both runs, a point every batch of ``BATCH`` texts
        return None if progress is None else lambda done, _: progress(offset + done, total)

    repeated = model.attend(texts, batch_size=BATCH, progress=told(0))
    natural = model.attend(sentences, batch_size=BATCH, progress=told(len(texts)))
    scores = {"induction": [], "duplicate_token": [], "previous_token": [], "sink": []}
    for att in repeated:
        induction, duplicate = repeat_scores(att.weights, copy_positions(att, length), length)
        scores["induction"].append(induction)
        scores["duplicate_token"].append(duplicate)
    for att in natural:
        previous, sink = text_scores(att)
        scores["previous_token"].append(previous)
        scores["sink"].append(sink)
    L, H = model.n_layers, model.n_heads
    layer, head = np.divmod(np.arange(L * H), H)
    columns = {"layer": layer, "head": head}
    for name in DETECTORS:
        mean, lo, hi = interval(np.asarray(scores[name], dtype=np.float64), seed=seed)
        columns.update({name: mean.ravel(), f"{name}_lo": lo.ravel(), f"{name}_hi": hi.ravel()})
    return pd.DataFrame(columns)


# A head takes the first of these whose 95% interval lies wholly above its bar (the lower end clears it).
DETECTOR_LABELS = {"induction": ("induction", 0.4), "duplicate_token": ("duplicate token", 0.4),
                   "previous_token": ("previous token", 0.4), "sink": ("sink", 0.5)}


def detector_labels(df: pd.DataFrame) -> list[str]:
    """A label for each row of ``head_detector``: induction, duplicate token, previous token, sink, or other."""
    out = []
    for r in df.itertuples():
        out.append(next((label for name, (label, bar) in DETECTOR_LABELS.items() if getattr(r, f"{name}_lo") >= bar),
                        "other"))
    return out
