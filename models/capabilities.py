"""What a model offers beyond attention (``Stack.offers``), which decides the card's and the pages' sections:
``detector``, a causal mask, so the head detector's roles (previous token, induction, duplicate token, sink) are
defined; ``vocabulary``, next-token logits, so what a head writes into the vocabulary, its copying, the routes of a
prediction, a next-token loss and generation; ``embedding``, a sentence embedding its heads are measured against."""
from __future__ import annotations

DETECTOR, VOCABULARY, EMBEDDING = "detector", "vocabulary", "embedding"
_OF_READOUT = {"next_token": VOCABULARY, "embedding": EMBEDDING}  # a readout's, where it brings one


def offered(causal: bool, readouts) -> frozenset[str]:
    """What a stack of that mask and those readouts (``Stack.readouts``) offers."""
    return frozenset(({DETECTOR} if causal else set()) | {_OF_READOUT[r] for r in readouts if r in _OF_READOUT})
