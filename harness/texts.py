"""Texts the app is driven with: a long prompt of about a given number of tokens."""
from __future__ import annotations

import random

from models.corpus import CORPUS


def prompt(tokenizer, n_tokens: int, seed: int) -> str:
    """The built-in corpus shuffled by ``seed``, cut to the words that make about ``n_tokens`` tokens."""
    rng = random.Random(seed)
    sentences = []
    while len(tokenizer(" ".join(sentences))["input_ids"]) < n_tokens:
        batch = list(CORPUS)
        rng.shuffle(batch)
        sentences += batch
    words = " ".join(sentences).split()
    low, high = 1, len(words)
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if len(tokenizer(" ".join(words[:mid]))["input_ids"]) < n_tokens else (low, mid)
    return " ".join(words[:low])
