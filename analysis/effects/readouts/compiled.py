"""A compiled program's readout (``models.compiled``): its output at the last position, two output values' logit
difference for a categorical output, the value itself for a numerical one."""
from __future__ import annotations

import random

import torch

from models import HeadLensError
from models.run import device_of

from ...defaults import Pair
from .. import parts as P
from ..metrics import TokenLogits, Toward
from .base import Asks, Readout

PAIRS = 4  # built-in pairs: a random input and the same with one token changed, where the output changes
TASK, TASK_TITLE = "one_token", "One token changed: random inputs, the output at the last position changed"


class CompiledOutput(Readout):
    """A compiled program's output at the last position: ``logit(answer) − logit(distractor)`` of two output values
    (categorical), or the value itself (numerical: the answer and the distractor are not read)."""

    name, metric, title, gives = "compiled", "output_diff", "output logit difference", "value"
    needs = "reads a compiled program's output"
    metrics = {"output_diff": "output difference: logit(answer value) − logit(distractor value) of a compiled "
                              "program's output at the last position, or its numerical output"}
    units, output, on_text = "output logits", "output", "output"
    norm_bias = "nothing (a compiled program has no norm)"
    first_task = (TASK, TASK_TITLE)
    tasks = "compiled"
    tasks_help = ("One token changed: random inputs of the program's tokens, each with one token changed where "
                  "that changes the output at the last position. Or a CSV of inputs of its tokens.")
    pairs_help = ("An input of the program's tokens and the same input with one token changed: the figures "
                  "measure its output at the last position.")
    csv_note = "the answer and the distractor are two of the program's output values."
    roles_note = ""
    asks = Asks("Answer value", "Distractor value",
                "The output value the clean input should give at its last position: the page explains "
                "logit(answer) − logit(distractor) of the output.",
                "The output value the corrupted input gives there instead.", key="value")

    @property
    def config(self):
        return self.stack.config

    @property
    def numerical(self) -> bool:
        return self.config.numerical

    @property
    def values(self) -> tuple:
        return self.config.outputs

    @property
    def csv_example(self):
        clean, corrupted, a, d = self._first()
        return f"clean,corrupted,answer,distractor\n{clean},{corrupted},{a},{d}\n"

    def _first(self) -> tuple:
        pair = next(iter(self.builtin_pairs().values()), None)
        if pair is None:
            raise HeadLensError("No input of this program's tokens changes its output at the last position.")
        return pair.clean, pair.corrupted, pair.answer, pair.distractor

    def changed(self, n: int, seed: int = 0) -> list[tuple[str, str, object, object, int]]:
        """Up to ``n`` random inputs of the longest length, each with one token changed where that changes the
        output at the last position (``last``, given on both): ``(clean, corrupted, clean's output, corrupted's
        output, position changed)``, seeded (the same every time); for a numerical output, where it changes the
        value, the input giving the larger value the clean one (the metric is the value itself, and a pair whose
        change went down would cancel one whose change went up in a mean over pairs)."""
        tokens = [str(v) for v in self.config.tokens]
        length, rng, found = self.config.max_positions - 1, random.Random(seed), {}
        for _ in range(50 * n):
            clean = [rng.choice(tokens) for _ in range(length)]
            at = rng.randrange(length)
            corrupted = clean[:at] + [rng.choice([v for v in tokens if v != clean[at]])] + clean[at + 1:]
            a, d = (self.last(" ".join(x)) for x in (clean, corrupted))
            if a is not None and d is not None and self.numerical and a < d:  # the clean input's the larger value,
                clean, corrupted, a, d = corrupted, clean, d, a  # as a logit difference is: no pair cancels another
            if a is not None and d is not None and a != d:
                found.setdefault((" ".join(clean), " ".join(corrupted)), (a, d, at))
            if len(found) == n:
                break
        return [(c, x, a, d, at) for (c, x), (a, d, at) in found.items()]

    def last(self, text: str):
        """The output at ``text``'s last position, or None where the program gives none there (a sort's position
        past its distinct tokens: every output logit 0, no value ahead of another by half a logit)."""
        out = self.model.outputs(text)[-1]
        if self.numerical:
            return round(float(out[0]), 6)
        top = sorted(out)[-2:]
        return self.values[int(out.argmax())] if top[-1] - top[0] >= 0.5 else None

    def builtin_pairs(self) -> dict[str, Pair]:
        """``PAIRS`` of ``changed``'s pairs, each comparing the two outputs."""
        pairs = [Pair(f"Token {at + 1} changed: {c} → {x}", "compiled", c, x, str(a), str(d))
                 for c, x, a, d, at in self.changed(PAIRS)]
        return {p.name: p for p in pairs}

    def task(self, n: int = 100, seed: int = 0):
        """The built-in task: ``n`` of ``changed``'s pairs."""
        from ...tasks.pairs import Task, TaskPair

        pairs = []
        for clean, corrupted, a, d, at in self.changed(n, seed):
            ids = [self.model.tokenize(t)["input_ids"] for t in (clean, corrupted)]
            answer, distractor = (0, 0) if self.numerical else (self.value(a, "answer"), self.value(d, "distractor"))
            pairs.append(TaskPair(clean, corrupted, tuple(ids[0]), tuple(ids[1]), answer, distractor,
                                  (("CHANGED", at + 1), ("END", len(ids[0]) - 1))))
        if not pairs:
            raise HeadLensError("No input of this program's tokens changes its output at the last position.")
        return Task(TASK, TASK_TITLE, tuple(pairs), self.metric)

    def options(self, clean, corrupted, predicted=None):
        if self.numerical:
            return {"value": "the numerical output itself"}
        return {str(v): "" for v in self.values}

    def value(self, given, role: str) -> int:
        """An output value's index from the value (or its text); a sentence naming the values for anything else."""
        if self.numerical:
            return 0
        names = [str(v) for v in self.values]
        if str(given).strip() in names:
            return names.index(str(given).strip())
        raise HeadLensError(f"The {role} {given!r} is not one of this program's output values: "
                            f"{', '.join(names)}.")

    def read(self, ids, answer, distractor):
        a, d = self.value(answer, "answer"), self.value(distractor, "distractor")
        if a == d and not self.numerical:
            raise HeadLensError("The answer and the distractor are the same value; give two different ones.")
        return a, d

    def words(self, ids, answer, distractor):
        if self.numerical:
            return "value", ""
        a, d = self.read(ids, answer, distractor)
        return str(self.values[a]), str(self.values[d])

    def compared(self, answer, distractor):
        if self.numerical:
            return "the program's numerical output at the last position"
        return f"logit(“{answer}”) − logit(“{distractor}”) of the output at the last position"

    def pair(self, ids, answer, distractor):
        a, d = self.read(ids, answer, distractor)
        vector = P.direction(self.stack, a, None if self.numerical else d)
        return Toward(vector), *self.words(ids, answer, distractor)

    def alone(self, ids, answer):
        a = self.value(answer, "answer")
        return Toward(P.direction(self.stack, a, None)), "value" if self.numerical else str(self.values[a])

    def row(self, row, one_token, ids, bad):
        try:
            a, d = self.read(ids, row.get("answer"), row.get("distractor"))
        except HeadLensError as err:
            return "its" + str(err).rstrip(".")[len("The"):]
        return a, d, (), ()

    def task_metric(self, task, metric):
        device = device_of(self.stack)
        tokens = [[p.answer, 0 if self.numerical else p.distractor] for p in task.pairs]
        weights = [[1.0, 0.0 if self.numerical else -1.0]] * len(task.pairs)
        return TokenLogits(torch.tensor(tokens, device=device), torch.tensor(weights, device=device))
