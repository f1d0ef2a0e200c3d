"""What every readout is (``Readout``), what a typed pair asks for (``Asks``), and a token offered as an answer
(``Candidate``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from models import HeadLensError
from models.run import stack_of

from ...defaults import ENCODER_PAIRS, FIRST_ENCODER_TASK, FIRST_ENCODER_TASK_NAME, Pair
from ..inputs import answer_token, token_text, two
from ..metrics import Metric


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

    def first_option(self, options: dict) -> object:
        """The answer a picker of ``options`` starts with: the first."""
        return next(iter(options))

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
