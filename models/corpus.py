"""The texts HeadLens ships, and the one rule for what counts as a sentence.

The sentence corpus (335 short sentences) feeds the foci, profiles and cards; the paragraphs (130 of ordinary prose,
82-127 words each: narrative, instructions, dialogue, exposition, lists, letters, with names that recur as they do in
real text) are the texts explanations are fitted and scored on, since a head's habit on an 8-word sentence says
little about it on the paragraphs a model reads.

The app's text box, uploads, the command line (``python -m analysis.profiles.run``), the benchmarks and
training all read sentences through ``clean_lines``: a line is a sentence when it holds a
character to read, and it is used stripped.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ASSETS = Path(__file__).resolve().parents[1] / "assets"
CORPUS_FILE = ASSETS / "corpus.txt"
PARAGRAPHS_FILE = ASSETS / "paragraphs.txt"
EXAMPLES_FILE = ASSETS / "examples.json"


def readable(line: str) -> bool:
    """Whether a line has a character to read: not only spaces, control or invisible characters."""
    return any(ch.isprintable() and not ch.isspace() for ch in line)


def clean_lines(lines) -> list[str]:
    """The sentences among raw lines: stripped, without those that hold nothing to read."""
    return [line.strip() for line in lines if readable(line)]


def sentences_of(text: str) -> list[str]:
    """The sentences of a text written one per line."""
    return clean_lines(text.splitlines())


def corpus_text() -> str:
    """The built-in corpus, one sentence per line (``assets/corpus.txt``)."""
    return CORPUS_FILE.read_text(encoding="utf-8")


CORPUS: tuple[str, ...] = tuple(sentences_of(corpus_text()))  # the built-in corpus's 335 sentences, in order
PARAGRAPHS: tuple[str, ...] = tuple(sentences_of(PARAGRAPHS_FILE.read_text(encoding="utf-8")))  # one per line
EXAMPLES: dict[str, str] = json.loads(EXAMPLES_FILE.read_text(encoding="utf-8"))  # name -> text
DEFAULT_TEXT = next(iter(EXAMPLES.values()))  # "Which do you like better, coffee or tea?"


def corpus_sample(n: int) -> list[str]:
    """``n`` sentences spread evenly over the built-in corpus, the same every time."""
    return [CORPUS[i] for i in np.linspace(0, len(CORPUS) - 1, n).round().astype(int)]


def paragraph_halves() -> tuple[list[str], list[str]]:
    """The built-in paragraphs in two disjoint halves, alternate ones in each so that each spans every kind of prose:
    the default fit and held-out texts of explanations."""
    return list(PARAGRAPHS[0::2]), list(PARAGRAPHS[1::2])
