"""What a prediction is, one readout per kind of model: everything that differs by kind lives here, and effects,
tasks, circuits, the QK split over a task and the card take a readout without asking what model they hold.

A stack names the readouts it offers (``Stack.readouts``): a language model's next token; an encoder's sentence
embedding against two probe texts; a masked-LM encoder's two tokens at its ``[MASK]`` (before its embedding, for
a prompt that has one); a sequence classifier's two class labels; a compiled program's output values. A readout says what the user gives (tokens,
texts, labels), checks a pair's inputs (a sentence for a bad one), reads a run's final residual stream as a
``Metric`` of each pair, gives the metric's linear direction for direct attribution or the sentence saying why it
has none, and the words the pages use.

What a run is read as, for a batch of pairs, is a ``metrics.Metric``.
"""
from __future__ import annotations

from models import HeadLensError
from models.run import stack_of

from .base import Asks, Candidate, Readout
from .classifier import ClassLabel
from .compiled import CompiledOutput
from .encoder import MaskedToken, SentenceEmbedding
from .language import NextToken

__all__ = ["READOUTS", "TASK_METRICS", "Asks", "Candidate", "ClassLabel", "CompiledOutput", "MaskedToken", "NextToken", "Readout",
           "SentenceEmbedding", "own_readout", "readout_for", "readout_reading", "readouts"]

READOUTS = {cls.name: cls for cls in (NextToken, SentenceEmbedding, MaskedToken, ClassLabel, CompiledOutput)}
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
