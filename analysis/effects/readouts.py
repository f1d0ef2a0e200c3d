"""What a prediction is, one readout per kind of model: everything that differs by kind lives here, and effects,
tasks, circuits, the QK split over a task and the card take a readout without asking what model they hold.

A stack names the readouts it offers (``Stack.readouts``): a language model's next token; an encoder's sentence
embedding against two probe texts; a masked-LM encoder's two tokens at its ``[MASK]`` (before its embedding, for
a prompt that has one); a sequence classifier's two class labels. A readout says what the user gives (tokens,
texts, labels), checks a pair's inputs (a sentence for a bad one), reads a run's final residual stream as a
``Metric`` of each pair, gives the metric's linear direction for direct attribution or the sentence saying why it
has none, and the words the pages use.

What a run is read as, for a batch of pairs, is a ``metrics.Metric``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import numpy as np
import torch

from models import HeadLensError
from models.run import device_of, stack_of

from ..defaults import (ENCODER_PAIRS, FIRST_ENCODER_TASK, FIRST_ENCODER_TASK_NAME, FIRST_TASK, FIRST_TASK_NAME,
                        PAIRS, Pair)
from . import parts as P
from .inputs import answer_token, probe_text, token_text, two, unit_embeddings
from .metrics import (MASKED_NOT_LINEAR, ClassLogits, EmbeddingCosine, MaskedLogits, Metric, TokenLogits, TokenProbs,
                      Toward)

# --- the readouts ----------------------------------------------------------------------------------------------

class Readout:
    """What a prediction is on one kind of model (a subclass per kind, named as ``Stack.readouts`` names it)."""

    name: ClassVar[str]
    metric: ClassVar[str]           # what a pair's figures measure, as frames and tasks name it
    title: ClassVar[str]            # in words: "logit difference"
    gives: ClassVar[str]            # what the answer and the distractor are: "token", "text" or "label"
    metrics: ClassVar[dict[str, str]]  # the metrics a task may read with it, and what each is
    needs: ClassVar[str]            # what its metrics read, for the sentence a model without it gets
    units: ClassVar[str] = "logits"   # a direct attribution's units
    output: ClassVar[str] = "logits"  # what a circuit's last node is called
    on_text: ClassVar[str] = "cosine"  # what a run over plain text is measured by: its embedding's cosine, or "loss"
    compared_note: ClassVar[str] = ""  # what ``compared``'s symbols are, where they need saying
    norm_bias: ClassVar[str] = "final norm's bias"   # the constant part of a direct attribution
    parts_note: ClassVar[str] = ""    # how a direct attribution's parts add up, where it needs saying
    # the task Effects and a head's card open with (its generator, its title), None where no built-in task fits
    first_task: ClassVar[tuple[str, str] | None] = (FIRST_ENCODER_TASK, FIRST_ENCODER_TASK_NAME)

    def __init__(self, model, stack=None):
        self.model = model
        self.stack = stack if stack is not None else stack_of(model, "Patching replaces a head's output")

    @property
    def not_linear(self) -> str | None:
        """Why its metric has no direct parts (a sentence), or None: it has."""
        return None

    def reads(self, clean: str) -> bool:
        """Whether a pair whose clean prompt is ``clean`` is read by this readout (the first that does, of those the
        stack offers, reads it)."""
        return True

    def builtin_pairs(self) -> dict[str, Pair]:
        """The pairs Effects and a head's card show first: the founding sentence with each of its foci changed."""
        return dict(ENCODER_PAIRS)

    def clean_help(self, compared: str) -> str:
        """What the clean prompt's figure is, in words."""
        return f"The {self.title} {compared} after the clean prompt."

    def read(self, ids: list[int], answer, distractor) -> tuple:
        """A pair's answer and distractor checked, a sentence for a bad one, as this readout holds them (token ids,
        texts, class indices); ``ids``: the clean prompt's tokens."""
        a, d = answer_token(self.model, answer), answer_token(self.model, distractor, "distractor")
        two(a, d, "token")
        return a, d

    def words(self, ids: list[int], answer, distractor) -> tuple[str, str]:
        """How the answer and the distractor read, checked (``read``)."""
        return tuple(token_text(self.model, t) for t in self.read(ids, answer, distractor))

    def pair(self, ids: list[int], answer, distractor) -> tuple[Metric, str, str]:
        """One pair's metric, its answer and distractor checked (a sentence for a bad one), and how they read."""
        raise NotImplementedError

    def alone(self, ids: list[int], answer) -> tuple[Metric, str]:
        """The metric of an answer with no distractor, and how it reads; a sentence where one is needed."""
        raise HeadLensError(f"The attribution compares two: give a distractor {self.gives} beside the answer.")

    def compared(self, answer: str, distractor: str) -> str:
        """What a pair's figures measure, in words."""
        return f"logit(“{answer}”) − logit(“{distractor}”)"

    def row(self, row: dict, one_token, ids: list[int], bad: list[int]) -> tuple[int, int, tuple, tuple] | str:
        """A CSV row's answer and distractor, its prompts read as ``ids`` and ``bad``: ``(answer, distractor, probes,
        roles)`` (the roles this readout names, beside ``DIFF`` and ``END``), or what is wrong with them;
        ``one_token(value, what)`` reads a token as ``(id, None)`` or ``(None, why not)``."""
        answer, why = one_token(row.get("answer"), "answer")
        if why:
            return why
        distractor, why = one_token(row.get("distractor"), "distractor")
        if why:
            return why
        if answer == distractor:
            return "its answer and distractor are the same token; give two different ones"
        return answer, distractor, (), ()

    def task_metric(self, task, metric: str) -> Metric:
        """``metric`` over every pair of ``task``."""
        raise NotImplementedError


class NextToken(Readout):
    """A language model's next token: the logit difference of two tokens at the last position (a task's also the
    probability difference, or greater-than's mass)."""

    name, metric, title, gives = "next_token", "logit_diff", "logit difference", "token"
    needs = "is read from a language model's next-token logits"
    metrics = {"logit_diff": "logit difference: logit(answer) − logit(distractor)",
               "prob_diff": "probability difference: p(answer) − p(distractor)",
               "greater_than": "greater-than mass: p(years after YY) − p(years up to YY)"}
    on_text = "loss"
    first_task = (FIRST_TASK, FIRST_TASK_NAME)

    def builtin_pairs(self):
        """Indirect objects, a fact and a repeated sequence, each a next token against another."""
        return dict(PAIRS)

    def pair(self, ids, answer, distractor):
        a, d = self.read(ids, answer, distractor)
        return (Toward(P.direction(self.stack, a, d)), token_text(self.model, a),
                token_text(self.model, d))

    def alone(self, ids, answer):
        """``logit(answer)`` itself."""
        a = answer_token(self.model, answer)
        return Toward(P.direction(self.stack, a, None)), token_text(self.model, a)

    def task_metric(self, task, metric):
        device = device_of(self.stack)
        if metric == "greater_than":
            if not all(p.above and p.below for p in task.pairs):
                raise HeadLensError("The greater-than metric reads the years after and up to a pair's YY: choose "
                                    "the greater_than task, or the logit or probability difference.")
            width = max(len(p.above) + len(p.below) for p in task.pairs)
            tokens = [list(p.above + p.below) + [0] * (width - len(p.above) - len(p.below)) for p in task.pairs]
            weights = [[1.0] * len(p.above) + [-1.0] * len(p.below)
                       + [0.0] * (width - len(p.above) - len(p.below)) for p in task.pairs]
        else:
            tokens = [[p.answer, p.distractor] for p in task.pairs]
            weights = [[1.0, -1.0]] * len(task.pairs)
        kind = TokenLogits if metric == "logit_diff" else TokenProbs
        return kind(torch.tensor(tokens, device=device), torch.tensor(weights, device=device))


class SentenceEmbedding(Readout):
    """An encoder's sentence embedding (the mean over its tokens) against two probe texts:
    ``cos(e, answer) − cos(e, distractor)``, each part through the norms above where it was written, frozen."""

    name, metric, title, gives = "embedding", "embedding", "embedding difference", "text"
    needs = "is an encoder's metric: its sentence embedding against two probe texts"
    metrics = {"embedding": "embedding difference: cos(e, answer) − cos(e, distractor)"}
    units, output = "attribution", "embedding"
    compared_note = ", e the sentence's embedding (the mean over its tokens)"
    norm_bias = "the norms' biases"
    parts_note = (" Each part passes the LayerNorms above it, their scales frozen at the prompt's own values, so "
                  "that the parts add up.")

    def clean_help(self, compared):
        return f"{compared}, e the clean prompt's sentence embedding (the mean over its tokens)."

    def read(self, ids, answer, distractor):
        a, d = probe_text(answer, "answer"), probe_text(distractor, "distractor")
        two(a, d, "text")
        return a, d

    def words(self, ids, answer, distractor):
        return self.read(ids, answer, distractor)

    def pair(self, ids, answer, distractor):
        a, d = self.read(ids, answer, distractor)
        return self.probes([(a, d)]), a, d

    def probes(self, pairs) -> EmbeddingCosine:
        """The metric of pairs whose ``(answer, distractor)`` texts are ``pairs``, each text embedded once."""
        texts = sorted({t for pair in pairs for t in pair})
        at = {t: i for i, t in enumerate(texts)}
        units = unit_embeddings(self.model, texts)
        return EmbeddingCosine(torch.stack([units[at[a]] - units[at[d]] for a, d in pairs]))

    def compared(self, answer, distractor):
        return f"cos(e, “{answer}”) − cos(e, “{distractor}”)"

    def row(self, row, one_token, ids, bad):
        probes = tuple(row.get(what).strip() if isinstance(row.get(what), str) else "" for what in
                       ("answer", "distractor"))
        if not all(probes):
            return ("its answer or distractor is empty; on an encoder each is a text (a word or a sentence) the "
                    "sentence's embedding is compared with")
        if probes[0] == probes[1]:
            return "its answer and distractor are the same text; give two different ones"
        return -1, -1, probes, ()

    def task_metric(self, task, metric):
        if not all(p.probes for p in task.pairs):
            raise HeadLensError("The embedding difference compares each sentence with its pair's probe texts; "
                                "this task's pairs have none: choose an encoder's task or upload pairs with them"
                                + (" (pairs with a [MASK] take the masked logit difference)." if
                                   all("MASK" in dict(p.roles) for p in task.pairs) else "."))
        return self.probes([p.probes for p in task.pairs])


class MaskedToken(Readout):
    """A masked-LM encoder's two tokens at the clean prompt's one ``[MASK]``: their logit difference there."""

    name, metric, title, gives = "masked_token", "masked_logit_diff", "masked logit difference", "token"
    needs = "reads a masked-LM encoder's logits at each pair's [MASK], on a model opened with its masked-LM head"
    metrics = {"masked_logit_diff": "masked logit difference: logit(answer) − logit(distractor) at the [MASK]"}
    not_linear = MASKED_NOT_LINEAR

    @property
    def mask(self) -> str:
        return self.model.tokenizer.mask_token

    def reads(self, clean):
        return bool(self.mask) and self.mask in clean

    def read(self, ids, answer, distractor):
        mask = self.model.tokenizer.mask_token_id
        if list(ids).count(mask) != 1:
            raise HeadLensError(f"The clean prompt has {list(ids).count(mask)} {self.mask} tokens; the masked-LM "
                                "metric reads the logits at one.")
        return super().read(ids, answer, distractor)

    def pair(self, ids, answer, distractor):
        mask = self.model.tokenizer.mask_token_id
        a, d = self.read(ids, answer, distractor)
        metric = MaskedLogits(torch.tensor([[a, d]]), torch.tensor([[1.0, -1.0]]), torch.tensor([list(ids).index(mask)]))
        return metric, token_text(self.model, a), token_text(self.model, d)

    def compared(self, answer, distractor):
        return super().compared(answer, distractor) + f" at {self.mask}"

    def row(self, row, one_token, ids, bad):
        mask = self.model.tokenizer.mask_token_id
        if ids.count(mask) != 1:
            return (f"its clean prompt has {ids.count(mask)} {self.mask} tokens; the masked-LM metric reads the "
                    "logits at one")
        at = ids.index(mask)
        if len(ids) != len(bad) or bad[at] != mask:
            return (f"the corrupted prompt needs as many tokens as the clean one ({len(ids)}) and its {self.mask} "
                    "at the same position")
        read = super().row(row, one_token, ids, bad)
        return read if isinstance(read, str) else (*read[:3], (("MASK", at),))

    def task_metric(self, task, metric):
        if not all("MASK" in dict(p.roles) for p in task.pairs):
            raise HeadLensError("The masked logit difference reads a masked-LM encoder's logits at each pair's "
                                "[MASK]: upload pairs whose clean prompt has one, on a model opened with its "
                                "masked-LM head.")
        device = device_of(self.stack)
        return MaskedLogits(torch.tensor([[p.answer, p.distractor] for p in task.pairs], device=device),
                            torch.tensor([[1.0, -1.0]] * len(task.pairs), device=device),
                            torch.tensor([p.role("MASK") for p in task.pairs], device=device))


class ClassLabel(Readout):
    """A sequence classifier's two classes, named by its ``id2label``: ``logit(answer) − logit(distractor)``."""

    name, metric, title, gives = "class_label", "class_logit_diff", "class logit difference", "label"
    needs = "reads a sequence classifier's class logits"
    metrics = {"class_logit_diff": "class logit difference: logit(answer class) − logit(distractor class)"}
    output = "classes"
    first_task = None  # a built-in task's answers are texts or tokens, not this classifier's classes

    def builtin_pairs(self):
        """The founding sentence with each focus changed, its last class against its first."""
        return {name: replace(p, answer=self.labels[-1], distractor=self.labels[0]) for name, p in
                ENCODER_PAIRS.items()}

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


READOUTS = {cls.name: cls for cls in (NextToken, SentenceEmbedding, MaskedToken, ClassLabel)}
TASK_METRICS = {m: what for cls in READOUTS.values() for m, what in cls.metrics.items()}


def readouts(model, stack=None) -> list[Readout]:
    """The readouts ``model``'s stack offers, in the order a pair tries them."""
    stack = stack if stack is not None else stack_of(model, "Patching replaces a head's output")
    return [READOUTS[name](model, stack) for name in stack.readouts]


def own_readout(model, stack=None) -> Readout:
    """The readout of the stack's own prediction (a masked-LM encoder's: its sentence embedding), whose built-in
    pairs and first task the pages show first."""
    return readouts(model, stack)[-1]


def readout_for(model, clean: str | None = None, stack=None) -> Readout:
    """The readout of a pair whose clean prompt is ``clean``: the first the stack offers that reads it (None: the
    stack's first)."""
    offered = readouts(model, stack)
    return next((r for r in offered if clean is None or r.reads(clean)), offered[-1])


def readout_reading(model, metric: str, stack=None) -> Readout:
    """The readout a task's ``metric`` is read with on ``model``, or a sentence naming the model's."""
    if metric not in TASK_METRICS:
        raise HeadLensError(f"Unknown metric '{metric}': choose one of {', '.join(TASK_METRICS)}.")
    offered = readouts(model, stack)
    found = next((r for r in offered if metric in r.metrics), None)
    if found is None:
        asked = next(cls for cls in READOUTS.values() if metric in cls.metrics)
        raise HeadLensError(f"The {asked.title} {asked.needs}; {model.name}'s prediction is read as the "
                            f"{' or the '.join(r.title for r in offered)}: choose "
                            f"{' or '.join(repr(m) for r in offered for m in r.metrics)}"
                            + (" (an encoder's tasks: objects, relation, sentence type, sentiment, or pairs with "
                               "probe texts)." if offered[0].gives == "text" else "."))
    return found
