"""A sequence classifier's readout: two of its classes, named by its labels."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from models import HeadLensError
from models.run import device_of

from ...defaults import ENCODER_PAIRS
from ..inputs import two
from ..metrics import ClassLogits
from .base import Asks, Readout


class ClassLabel(Readout):
    """A sequence classifier's two classes, named by its ``id2label``: ``logit(answer) − logit(distractor)``."""

    name, metric, title, gives = "class_label", "class_logit_diff", "class logit difference", "label"
    needs = "reads a sequence classifier's class logits"
    metrics = {"class_logit_diff": "class logit difference: logit(answer class) − logit(distractor class)"}
    output = "classes"
    first_task = None  # a built-in task is the founding sentence's foci, not this classifier's own labels
    tasks_help = ("The four foci of “Which do you like better, coffee or tea?”, each changed in templates over "
                  "foods: an object, the relation, the sentence type, the sentiment. The metric: the logit of the "
                  "classifier's last class against its first. Or a CSV of your own pairs, answer and distractor "
                  "two of its labels.")
    pairs_help = ("“Which do you like better, coffee or tea?” with one of its foci changed: an object, the "
                  "relation, the sentence type, the sentiment. The figures measure the logit of the classifier's "
                  "last class against its first.")
    csv_note = "the answer and the distractor are two of the classifier's labels."
    asks = Asks("Answer class", "Distractor class",
                "The class the clean prompt should get: the page explains logit(answer class) − logit(distractor "
                "class).", "The class the corrupted prompt favours.", key="label")

    @property
    def csv_example(self):
        last, first = (label.replace('"', '""') for label in (self.labels[-1], self.labels[0]))
        return ("clean,corrupted,answer,distractor\n"
                f"\"Which do you like better, coffee or tea?\",\"Which do you like worse, coffee or tea?\","
                f"\"{last}\",\"{first}\"\n")

    def builtin_pairs(self):
        """The founding sentence with each focus changed, its last class against its first."""
        return {name: replace(p, answer=self.labels[-1], distractor=self.labels[0]) for name, p in
                ENCODER_PAIRS.items()}

    def adapt(self, task):
        """A focus task's pairs read as the classifier's last class against its first."""
        last = len(self.labels) - 1
        return replace(task, pairs=tuple(replace(p, answer=last, distractor=0, probes=()) for p in task.pairs),
                       metric=self.metric)

    def options(self, clean, corrupted, predicted=None):
        return {label: "" for label in self.labels}

    def first_option(self, options):
        """Its last class, answer to its first as in its built-in pairs."""
        return self.labels[-1]

    @property
    def not_linear(self):
        head = self.stack.prediction_head
        return None if head.linear_rows() is not None else head.why_not_linear

    @property
    def labels(self) -> tuple[str, ...]:
        return self.stack.prediction_head.labels

    def label(self, value, role: str) -> int:
        """A class's index from its label (or its index); a sentence naming the labels for anything else."""
        labels = self.labels
        if isinstance(value, str) and value.strip() in labels:
            return labels.index(value.strip())
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= int(value) < len(labels):
            return int(value)
        raise HeadLensError(f"The {role} {value!r} is not one of this classifier's labels: "
                            f"{', '.join(repr(label) for label in labels)}.")

    def read(self, ids, answer, distractor):
        a, d = self.label(answer, "answer"), self.label(distractor, "distractor")
        two(a, d, "label")
        return a, d

    def words(self, ids, answer, distractor):
        return tuple(self.labels[k] for k in self.read(ids, answer, distractor))

    def compared(self, answer, distractor):
        return f"logit(“{answer}”) − logit(“{distractor}”) of the classes"

    def pair(self, ids, answer, distractor):
        a, d = self.read(ids, answer, distractor)
        weights = torch.zeros(1, len(self.labels))
        weights[0, a], weights[0, d] = 1.0, -1.0
        return self._metric(weights), self.labels[a], self.labels[d]

    def _metric(self, weights: torch.Tensor) -> ClassLogits:
        head = self.stack.prediction_head
        return ClassLogits(weights.to(device_of(self.stack)), head.why_not_linear, head.linear_rows())

    def row(self, row, one_token, ids, bad):
        try:
            a = self.label(row.get("answer"), "answer")
            d = self.label(row.get("distractor"), "distractor")
        except HeadLensError as err:
            return "its" + str(err).rstrip(".")[len("The"):]  # "its answer 'glad' is not one of ..."
        if a == d:
            return "its answer and distractor are the same label; give two different ones"
        return a, d, (), ()

    def task_metric(self, task, metric):
        if any(p.answer < 0 or p.distractor < 0 for p in task.pairs):
            raise HeadLensError("A classifier's task compares two of its classes in each pair: upload a CSV whose "
                                "answer and distractor are its labels ("
                                + ", ".join(repr(label) for label in self.labels) + ").")
        weights = torch.zeros(len(task.pairs), len(self.labels))
        for k, p in enumerate(task.pairs):
            weights[k, p.answer], weights[k, p.distractor] = 1.0, -1.0
        return self._metric(weights)
