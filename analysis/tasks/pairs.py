"""What every task is made of: a pair of prompts built for one model's tokenizer (``TaskPair``), a named set of them
(``Task``), and the pieces each generator builds its pairs with: a reader of the tokenizer (``Reader``), a template
filled in (``fill``), a pair checked (``pair_of``) and pairs drawn from a seed (``draw``). The generators are in
``analysis.tasks.build`` (a language model's, and a user's CSV) and ``analysis.tasks.focus`` (an encoder's)."""
from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from models import AttentionModel, HeadLensError

MAX_PAIRS = 10_000   # pairs in one task


@dataclass(frozen=True)
class TaskPair:
    """Two prompts of the same token length, ``clean_ids`` and ``corrupted_ids`` as the model reads them, and the
    tokens compared: ``answer`` against ``distractor`` (``above`` against ``below``, the greater-than metric's); an
    encoder's pair compares texts instead, its ``probes`` (answer, distractor), and its tokens are -1."""

    clean: str
    corrupted: str
    clean_ids: tuple[int, ...]
    corrupted_ids: tuple[int, ...]
    answer: int
    distractor: int
    roles: tuple[tuple[str, int], ...]
    template: str = ""
    above: tuple[int, ...] = ()
    below: tuple[int, ...] = ()
    probes: tuple[str, str] | tuple = ()

    def __len__(self) -> int:
        return len(self.clean_ids)

    def role(self, name: str) -> int:
        return dict(self.roles)[name]


@dataclass(frozen=True)
class Task:
    """A named set of pairs; ``problems``: a sentence for each row of a user's file that was left out."""

    name: str
    title: str
    pairs: tuple[TaskPair, ...]
    metric: str = "logit_diff"
    problems: tuple[str, ...] = field(default=(), compare=False)

    def __len__(self) -> int:
        return len(self.pairs)

    @property
    def roles(self) -> list[str]:
        """The roles every pair names, in the first pair's order."""
        common = set.intersection(*(set(dict(p.roles)) for p in self.pairs)) if self.pairs else set()
        return [r for r, _ in self.pairs[0].roles if r in common] if self.pairs else []

    def subset(self, keep) -> "Task":
        """The task with only the pairs at the indices ``keep`` (the ones a model gets right, say)."""
        return Task(self.name, self.title, tuple(self.pairs[int(i)] for i in keep), self.metric, self.problems)


class Reader:
    """Tokenizes as the model's traces do (with its special tokens) and finds the token holding a character."""

    def __init__(self, model: AttentionModel):
        self.model = model
        self.tok = model.tokenizer
        self._one: dict[str, int | None] = {}

    def ids(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.model.tokenize(text, return_offsets_mapping=True, verbose=False)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def one(self, piece: str) -> int | None:
        """The id of ``piece`` when the tokenizer reads it as exactly one token."""
        if piece not in self._one:
            ids = self.tok(piece, add_special_tokens=False)["input_ids"]
            self._one[piece] = int(ids[0]) if len(ids) == 1 else None
        return self._one[piece]

    def singles(self, words: Iterable[str]) -> list[str]:
        return [w for w in words if self.one(" " + w) is not None]


def token_at(offsets: list[tuple[int, int]], char: int) -> int | None:
    for i, (a, b) in enumerate(offsets):
        if a <= char < b and b > a:
            return i
    return None


def fill(template: str, **values: str) -> tuple[str, dict[str, int]]:
    """The template filled in, and the character where each value starts (the first time it is filled)."""
    out, starts, i = [], {}, 0
    while i < len(template):
        if template[i] == "{":
            j = template.index("}", i)
            key = template[i + 1:j]
            starts.setdefault(key, sum(map(len, out)))
            out.append(values[key])
            i = j + 1
        else:
            out.append(template[i])
            i += 1
    return "".join(out), starts


def pair_of(reader: Reader, clean: str, corrupted: str, answer: int, distractor: int, chars: dict[str, int],
            template: str, **more) -> TaskPair | None:
    """A pair when both prompts have the same length, the two compared differ (an encoder's ``probes`` in ``more``,
    its tokens -1) and each role's character lies in a token; else None."""
    ids, offsets = reader.ids(clean)
    bad_ids, _ = reader.ids(corrupted)
    probes = more.get("probes")
    if len(ids) != len(bad_ids) or (probes[0] == probes[1] if probes else answer == distractor):
        return None
    roles = [("START", 0)] if "START" in chars else []
    for role, char in chars.items():
        if role == "START":
            continue
        at = token_at(offsets, char)
        if at is None:
            return None
        roles.append((role, at))
    roles.append(("END", len(ids) - 1))
    return TaskPair(clean, corrupted, tuple(ids), tuple(bad_ids), answer, distractor, tuple(roles), template, **more)


def draw(n: int, seed: int, make) -> list[TaskPair]:
    """``n`` pairs from ``make(rng)`` (None: drawn again), reproducible from ``seed``."""
    if not 1 <= n <= MAX_PAIRS:
        raise HeadLensError(f"A task has 1 to {MAX_PAIRS:,} pairs; {n:,} were asked for.")
    rng, out, tries = random.Random(seed), [], 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise HeadLensError(f"Only {len(out)} of {n} pairs could be built for this tokenizer: too few of the "
                                "task's words are single tokens to it.")
        pair = make(rng)
        if pair is not None:
            out.append(pair)
    return out
