"""The defaults HeadLens opens with, one table: the first task and its size, the samples importance and the
detector are measured on, the built-in pairs. The app's results (``app_pages.results``) and a head's card from
Python (``analysis.cards.build``) both read them here, so that a card from either is the same card.
"""
from __future__ import annotations

from dataclasses import dataclass

FIRST_TASK = "ioi"           # the task Effects, Circuits and a head's card open with: indirect object,
FIRST_TASK_PAIRS = 50        # 50 pairs, seed 0, its names swapped (s2)
FIRST_TASK_NAME = "Indirect object, 50 pairs"
FIRST_ENCODER_TASK = "objects"  # an encoder's: the seed's objects changed, 50 pairs, seed 0
FIRST_ENCODER_TASK_NAME = "Objects, 50 pairs"
ENCODER_SAMPLE = 100         # sentences of the built-in corpus Pruning measures an encoder on
PRUNING_RANK = 32            # of them, evenly spread, those the curve by importance re-ranks the heads on at each step
DECODER_SAMPLE = 24          # sentences a bundled decoder's importance is measured on, by gradient
DETECTOR_SENTENCES = 100     # natural sentences for the detector's previous-token and sink scores, spread over the corpus
DETECTOR_SEQUENCES, DETECTOR_LENGTH = 32, 30  # repeated random sequences, and the tokens of each copy


@dataclass(frozen=True)
class Pair:
    """A clean prompt, a corrupted one of the same length, and the two tokens whose logits are compared (an encoder's:
    the two texts its embedding is compared with)."""

    name: str
    task: str
    clean: str
    corrupted: str
    answer: str | int      # a string the tokenizer reads as one token, or a token id
    distractor: str | int


def _names(a: str, b: str) -> Pair:
    return Pair(f"Indirect object: {a} and {b}", "indirect object",
                f"When {a} and {b} went to the store, {b} gave a drink to",
                f"When {a} and {b} went to the store, {a} gave a drink to", f" {a}", f" {b}")


PAIRS = {p.name: p for p in [
    _names("Mary", "John"), _names("Alice", "Bob"), _names("Sarah", "Tom"), _names("Anna", "James"),
    Pair("Fact: the Eiffel Tower's city", "factual recall", "The Eiffel Tower is located in the city of",
         "The Colosseum is located in the city of", " Paris", " Rome"),
    Pair("Induction: a repeated sequence", "induction",
         "ocean violin pepper garden rocket silver. ocean violin pepper garden rocket",
         "ocean violin pepper garden rocket marble. ocean violin pepper garden rocket", " silver", " marble"),
]}

# An encoder's pairs: the founding sentence with each of its four foci changed; the answer and the distractor are
# texts its embedding is compared with (cos(e, answer) - cos(e, distractor)).
SEED = "Which do you like better, coffee or tea?"
ENCODER_PAIRS = {p.name: p for p in [
    Pair("Objects: coffee or tea → coffee or juice", "objects", SEED, "Which do you like better, coffee or juice?",
         "tea", "juice"),
    Pair("Relation: like → hate", "relation", SEED, "Which do you hate more, coffee or tea?", "I like it.",
         "I hate it."),
    Pair("Sentence type: a question → a statement", "sentence type", "Is coffee better than tea?",
         "Coffee is better than tea.", "Is it?", "It is."),
    Pair("Sentiment: better → worse", "sentiment", SEED, "Which do you like worse, coffee or tea?", "better",
         "worse"),
]}
