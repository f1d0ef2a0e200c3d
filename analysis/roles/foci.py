"""The seed's four foci: sentence type, objects, relation and sentiment, measured on content attention.

**Content attention** drops the special tokens ([CLS], [SEP], <s>...) from a head's keys and
queries and scales each row back to 1. Clark et al. (2019) show that attention to [CLS] and [SEP]
works as a no-op: most heads of a BERT park most of their weight there, and what a head does
lies in the rest. A model without special tokens (GPT-2) keeps every token.

Word classes come from spaCy's parse, each token taking the class of the word that holds its first
character (``roles.align_to_words``):

- ``object``: NOUN, PROPN and PRON words;
- ``relation``: VERB words;
- ``sentiment``: words in VADER's sentiment lexicon (Hutto and Gilbert 2014; 7,500 words rated by
  ten people each, "like" 1.5, "better" 1.9, from the ``vaderSentiment`` package);
- ``sentence_type``: what marks a sentence's type: its final "?", "!" or "." (closing quotes and
  brackets may follow, and a quoted sentence's own mark counts), interrogative words (tags WDT, WP, WP$, WRB), a sentence-initial auxiliary
  ("Did the children…") and, in a question, an auxiliary before its subject ("Which do you…").

For a head and a focus f, within one sentence: ``share`` is the content attention that lands on
f's tokens, the mean over content queries; ``base`` is what uniform attention would give, f's
tokens over the content tokens. Over sentences (those with an f token only): ``f`` and ``f_base``
are their means and ``f_lift = f / f_base``.

The 95% interval of the lift is a Poisson bootstrap over sentences (Hanley and MacGibbon 2006;
Chamandy et al. 2012): each sentence appears in each of ``stats.REPLICATES`` resamples a Poisson(1)
number of times, and a resample's lift is its weighted share over its weighted base. The counts of
a sentence are drawn from a generator seeded by its text, so the sums can be kept while sentences
stream past, in any order and on any number of workers, and merge exactly by addition. Identical
sentences draw identical counts, which treats repeats as one sentence seen several times (``stats.LiftBootstrap``).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

FOCI = ("sentence_type", "object", "relation", "sentiment")
FOCUS_NAMES = {"sentence_type": "sentence type", "object": "object", "relation": "relation",
               "sentiment": "sentiment"}
OBJECT_POS = ("NOUN", "PROPN", "PRON")
RELATION_POS = ("VERB",)
QUESTION_TAGS = ("WDT", "WP", "WP$", "WRB")
FINAL_MARKS = ("?", "!", ".")
CLOSING = ('"', "'", "”", "’", ")", "]", "»")


@functools.lru_cache(maxsize=1)
def sentiment_lexicon() -> dict[str, float]:
    """VADER's lexicon: word (lower case) -> mean rating from -4 to 4."""
    import vaderSentiment

    path = Path(vaderSentiment.__file__).with_name("vader_lexicon.txt")
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            out[parts[0]] = float(parts[1])
    return out


def _inverted(aux) -> bool:
    """Whether an auxiliary comes before its subject: a subject of it or of its verb follows it, or
    (where the parse names no subject) a noun or pronoun stands between it and its verb."""
    subjects = [c.i for c in (*aux.children, *aux.head.children) if c.dep_ in ("nsubj", "nsubjpass")]
    if subjects:
        return any(i > aux.i for i in subjects)
    between = aux.doc[aux.i + 1:aux.head.i] if aux.head.i > aux.i else []
    return any(w.pos_ in OBJECT_POS for w in between)


def _sentence_type_words(doc) -> set[int]:
    marked: set[int] = set()
    for sent in doc.sents:
        words = [w for w in sent if not w.is_space]
        if not words:
            continue
        final = len(words) - 1
        while final > 0 and words[final].text in CLOSING:
            final -= 1
        question = words[final].text == "?"
        if words[final].text in FINAL_MARKS:
            marked.add(words[final].i)
        first = next((w for w in words if not w.is_punct), None)
        if first is not None and first.pos_ == "AUX":
            marked.add(first.i)
        for k, w in enumerate(words):
            if w.text in FINAL_MARKS and k + 1 < len(words) and words[k + 1].text in CLOSING:
                marked.add(w.i)  # the end of a quoted sentence: "Can you come?" she asked.
            if w.tag_ in QUESTION_TAGS:
                marked.add(w.i)
            elif question and w.pos_ == "AUX" and _inverted(w):
                marked.add(w.i)
    return marked


def word_classes(doc) -> dict[str, np.ndarray]:
    """For each focus, which of ``doc``'s words belong to it (bool, one per word)."""
    lexicon = sentiment_lexicon()
    typed = _sentence_type_words(doc)
    return {
        "sentence_type": np.array([w.i in typed for w in doc], dtype=bool),
        "object": np.array([w.pos_ in OBJECT_POS for w in doc], dtype=bool),
        "relation": np.array([w.pos_ in RELATION_POS for w in doc], dtype=bool),
        "sentiment": np.array([w.lower_ in lexicon for w in doc], dtype=bool),
    }


def token_classes(token_words: list[int | None], classes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Word classes carried to tokens: a token takes its word's classes; special tokens take none."""
    return {f: np.array([w is not None and bool(member[w]) for w in token_words], dtype=bool)
            for f, member in classes.items()}


def content_attention(weights: np.ndarray, special: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(content weights (..., c, c), content token indices)``: special rows and columns dropped,
    rows renormalised. A row whose weight lay only on special tokens stays zero."""
    from ..attention.views import renormalise_rows

    keep = np.flatnonzero(~np.asarray(special, dtype=bool))
    w = weights[..., keep, :][..., keep].astype(np.float64)
    return renormalise_rows(w), keep


def focus_shares(weights: np.ndarray, special: np.ndarray,
                 members: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, float]]:
    """Per focus with at least one token here: ``(share (layers, heads), base)`` of one sentence.

    ``weights`` is ``(layers, heads, n, n)``; ``members`` gives each focus's tokens (bool, n).
    A sentence with no content token gives nothing.
    """
    content, keep = content_attention(weights, special)
    if keep.size == 0:
        return {}
    out = {}
    for f, member in members.items():
        mask = member[keep]
        if mask.any():
            out[f] = (content[..., mask].sum(-1).mean(-1), float(mask.mean()))
    return out


def received(weights: np.ndarray, special: np.ndarray) -> np.ndarray:
    """``(n,)``: the content attention each token of one head's ``(n, n)`` weights receives, the
    mean over content queries; 0 at special tokens. A focus's share is its tokens' sum."""
    content, keep = content_attention(weights, special)
    out = np.zeros(weights.shape[-1])
    if keep.size:
        out[keep] = content.mean(axis=-2)
    return out
