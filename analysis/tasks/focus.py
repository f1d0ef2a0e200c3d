"""An encoder's tasks, from the four foci of "Which do you like better, coffee or tea?": an object changed
(``objects``: tea → juice), the relation (``relation``: like → hate), a question made a statement
(``sentence_type``), the sentiment (``sentiment``: better → worse). Each pair has probes, the texts whose embeddings
the sentence's is compared with (its metric ``embedding``: ``cos(e, answer) - cos(e, distractor)``); its roles are
``START``, the changed word (``FOCUS``), an object the template names (``OBJECT``) and ``END``."""
from __future__ import annotations

from models import AttentionModel, HeadLensError

from .pairs import Reader, Task, draw, fill, pair_of
from .words import (FOODS, OBJECT_TEMPLATES, RELATION_PROBES, RELATION_TEMPLATES, RELATIONS, SENTIMENTS,
                         TYPE_PROBES, TYPE_TEMPLATES)

ENCODER_TASKS = {"objects": "Objects: coffee or tea → coffee or juice", "relation": "Relation: like → hate",
                 "sentence_type": "Sentence type: a question → a statement",
                 "sentiment": "Sentiment: better → worse"}


def _focus_task(model: AttentionModel, name: str, n: int, seed: int, make) -> Task:
    """An encoder's task ``name`` of ``n`` pairs, each from ``make(reader, rng, foods)`` (foods: those the tokenizer
    reads as one token)."""
    reader = Reader(model)
    foods = reader.singles(FOODS)
    if len(foods) < 4:
        raise HeadLensError(f"{model.name}'s tokenizer reads too few of the task's foods as one token each.")
    return Task(name, ENCODER_TASKS[name], tuple(draw(n, seed, lambda rng: make(reader, rng, foods))),
                metric="embedding")


def _probed(reader: Reader, clean: str, corrupted: str, probes: tuple[str, str], chars: dict[str, int],
            template: str):
    """``pair_of`` for an encoder's pair: ``START`` first, no tokens compared, the two probes instead."""
    return pair_of(reader, clean, corrupted, -1, -1, {"START": 0, **chars}, template, probes=probes)


def _capitalised(*texts: str) -> list[str]:
    return [t[0].upper() + t[1:] for t in texts]


def objects(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """The second object changed: "coffee or tea" → "coffee or juice"; probes the two objects."""
    def make(reader, rng, foods):
        template = rng.choice(OBJECT_TEMPLATES)
        x, y, z = rng.sample(foods, 3)
        clean, chars = fill(template, X=x, Y=y)
        corrupted, _ = fill(template, X=x, Y=z)
        return _probed(reader, clean, corrupted, (y, z), {"OBJECT": chars["X"], "FOCUS": chars["Y"]}, template)
    return _focus_task(model, "objects", n, seed, make)


def relation(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """The relation changed: like → hate; probes "I like it." and "I hate it."."""
    def make(reader, rng, foods):
        template = rng.choice(RELATION_TEMPLATES)
        (r, r2), (x, y) = rng.choice(RELATIONS), rng.sample(foods, 2)
        clean, chars = fill(template, R=r, X=x, Y=y)
        corrupted, _ = fill(template, R=r2, X=x, Y=y)
        probes = (RELATION_PROBES[0].format(R=r), RELATION_PROBES[1].format(R=r2))
        return _probed(reader, clean, corrupted, probes, {"FOCUS": chars["R"], "OBJECT": chars["X"]}, template)
    return _focus_task(model, "relation", n, seed, make)


def sentence_type(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """A question made a statement of as many tokens ("Do you like tea?" → "You do like tea."); probes "Is it?"
    and "It is."."""
    def make(reader, rng, foods):
        question, statement = rng.choice(TYPE_TEMPLATES)
        x, y = rng.sample(foods, 2)
        clean, chars = fill(question, X=x, Y=y)
        corrupted, _ = fill(statement, X=x, Y=y)
        clean, corrupted = _capitalised(clean, corrupted)
        return _probed(reader, clean, corrupted, TYPE_PROBES, {"FOCUS": len(clean) - 1, "OBJECT": chars["X"]},
                       question)
    return _focus_task(model, "sentence_type", n, seed, make)


def sentiment(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """The sentiment changed: better → worse, good → bad; probes the two words."""
    def make(reader, rng, foods):
        words, templates = rng.choice(SENTIMENTS)
        (w, w2), template, (x, y) = rng.choice(words), rng.choice(templates), rng.sample(foods, 2)
        clean, chars = fill(template, S=w, X=x, Y=y)
        corrupted, _ = fill(template, S=w2, X=x, Y=y)
        clean, corrupted = _capitalised(clean, corrupted)
        return _probed(reader, clean, corrupted, (w, w2), {"FOCUS": chars["S"], "OBJECT": chars["X"]}, template)
    return _focus_task(model, "sentiment", n, seed, make)


ENCODER_GENERATORS = {"objects": objects, "relation": relation, "sentence_type": sentence_type,
                      "sentiment": sentiment}
