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

from dataclasses import dataclass, replace
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

@dataclass(frozen=True)
class Asks:
    """What a pair typed on Effects asks for beside its prompts: the answer's and the distractor's labels and helps,
    the sentence shown while either is empty (typed ones), and the name the page keeps them under (its URL's)."""

    answer: str
    distractor: str
    answer_help: str
    distractor_help: str
    empty: str = ""
    key: str = "probe"


@dataclass(frozen=True)
class Candidate:
    """A token offered as the answer or the distractor: which prompt it comes from, whether as one of that prompt's
    most likely next tokens (``rank``, from 1, with its probability ``p``) or as one of its tokens (``rank`` 0)."""

    prompt: str      # "clean" or "corrupted"
    rank: int = 0
    p: float = 0.0

    @property
    def predicted(self) -> bool:
        return self.rank > 0

    def __str__(self) -> str:
        if self.predicted:
            return f"{self.prompt} prompt's #{self.rank} next token, p = {self.p:.2f}"
        return f"in the {self.prompt} prompt"


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
    # its built-in tasks (``analysis.tasks``): "focus", the founding sentence's four foci changed; "next_token", the
    # indirect object, facts, greater-than and induction; None: none, a user's pairs alone
    tasks: ClassVar[str | None] = "focus"
    tasks_help: ClassVar[str] = (
        "The four foci of “Which do you like better, coffee or tea?”, each changed in templates over foods: an "
        "object, the relation, the sentence type, the sentiment. The metric: how much nearer the sentence's "
        "embedding is to the pair's answer text than to its distractor. Or a CSV of your own pairs.")
    pairs_help: ClassVar[str] = (
        "“Which do you like better, coffee or tea?” with one of its foci changed: an object, the relation, the "
        "sentence type, the sentiment. The figures measure how much nearer the sentence's embedding is to the "
        "answer text than to the distractor's.")
    csv_example: ClassVar[str] = (
        "clean,corrupted,answer,distractor\n"
        "\"Which do you like better, coffee or tea?\",\"Which do you like better, coffee or juice?\",tea,juice\n"
        "I like coffee.,I hate coffee.,I like it.,I hate it.\n")
    csv_note: ClassVar[str] = "the answer and the distractor are texts the sentence's embedding is compared with."
    roles_note: ClassVar[str] = " (FOCUS: the word changed)"  # a task's roles, where a caption names one
    # the words a pair typed on Effects asks for; ``options``: what they are chosen from, where they are not typed
    asks: ClassVar[Asks] = Asks(
        "Answer text", "Distractor text",
        "A word or a sentence the clean prompt's embedding should be near: the page explains cos(e, answer) − "
        "cos(e, distractor), e the prompt's sentence embedding (the mean over its tokens).",
        "A word or a sentence the corrupted prompt's embedding is nearer to.",
        "Type an answer text and a distractor text to compare the sentence's embedding with.")

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

    def adapt(self, task):
        """A built-in task of its kind (``tasks``) as this readout reads it: itself, for most."""
        return task

    @property
    def reads_from(self) -> str:
        """Where a task's role attention is read from (``analysis.tasks.effects``), in words: under a causal mask the
        last token, the one query that sees every role; else every token, the mean, as an embedding pools them."""
        return "the last token" if self.stack.causal else "every token (the mean)"

    def options(self, clean: str, corrupted: str, predicted=None) -> dict | None:
        """What a typed pair's answer and distractor are chosen from, each with a note saying where it comes from
        (None: typed, as ``asks`` words it); ``predicted(text)``: a prompt's most likely next tokens and their
        probabilities, for a readout that offers them."""
        return None

    def option_label(self, option, note) -> str:
        """How an option reads in its picker."""
        return str(option)

    def first_options(self, options: dict) -> tuple:
        """The answer and the distractor a picker of ``options`` starts with: its first two."""
        first = next(iter(options))
        return first, self.against(options, first)

    def against(self, options: dict, answer) -> object:
        """The distractor a picker starts with once ``answer`` is chosen: the first other option."""
        return next(o for o in options if o != answer)

    def typed(self, first) -> tuple[str, str]:
        """The answer and the distractor a typed pair starts with, ``first`` the first built-in pair."""
        return first.answer, first.distractor

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
    tasks = "next_token"
    tasks_help = ("Indirect object: 17 templates in both name orders (Wang et al. 2022). Facts: a landmark's city, a "
                  "capital, a language. Greater-than: \"The war lasted from the year 1729 to the year 17\" (Hanna "
                  "et al. 2023). Induction: random words repeated. Or a CSV of your own pairs.")
    pairs_help = ("Indirect object (Wang et al. 2022): the name that did not give the drink; the corrupted prompt "
                  "swaps who gave it. A fact: one landmark's city against another's. Induction: a sequence seen "
                  "once, then again, the corrupted prompt with another token in the first copy.")
    csv_example = ("clean,corrupted,answer,distractor\n"
                   "\"When Mary and John went to the store, John gave a drink to\","
                   "\"When Mary and John went to the store, Mary gave a drink to\", Mary, John\n"
                   "The Eiffel Tower is located in the city of,The Colosseum is located in the city of, Paris, Rome\n")
    csv_note = "the answer and the distractor are one token each (with their leading space)."
    roles_note = " (indirect object: a name mover looks from END at IO)"
    asks = Asks("Answer", "Distractor",
                "The token the clean prompt should predict: each prompt's likely next tokens and every token of the "
                "prompts, as the tokenizer reads them (a leading space is part of a token).",
                "The token the corrupted prompt favours: the page explains logit(answer) − logit(distractor).",
                key="")

    def options(self, clean, corrupted, predicted=None):
        """Token id -> ``Candidate``: each prompt's most likely next tokens (``predicted``), then every token of the
        prompts (a token named twice keeps its first place)."""
        out: dict[int, Candidate] = {}
        for what, text in (("clean", clean), ("corrupted", corrupted)):
            for rank, (token, p) in enumerate(predicted(text) if predicted else (), start=1):
                out.setdefault(token, Candidate(what, rank, p))
        for what, text in (("clean", clean), ("corrupted", corrupted)):
            for token in self.model.tokenizer(text, add_special_tokens=False)["input_ids"]:
                out.setdefault(int(token), Candidate(what))
        return out

    def option_label(self, option, note):
        return f"“{token_text(self.model, option)}” · id {option}" + (f" · {note}" if str(note) else "")

    def against(self, options, answer):
        """The corrupted prompt's likeliest next token other than ``answer``, else the first other option."""
        rest = [t for t in options if t != answer]
        return next((t for t in rest if options[t].prompt == "corrupted" and options[t].predicted), rest[0])

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
        units = unit_embeddings(self.model, texts, self.stack)
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
    tasks = None  # a masked-LM encoder's own prediction is its sentence embedding: its tasks are that readout's

    @property
    def mask(self) -> str:
        return self.model.tokenizer.mask_token

    @property
    def asks(self):
        return Asks(f"Answer token at {self.mask}", "Distractor token",
                    f"The token the clean prompt should put at its {self.mask}, as the tokenizer reads it: the page "
                    "explains logit(answer) − logit(distractor) there.",
                    f"The token the corrupted prompt favours at its {self.mask}.",
                    f"Type the answer and the distractor: one token each, compared at the {self.mask}.")

    def typed(self, first):
        return "", ""

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

    def first_options(self, options):
        """Its last class against its first, as its built-in pairs."""
        return self.labels[-1], self.against(options, self.labels[-1])

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
