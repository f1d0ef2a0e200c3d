"""Tasks: many prompt pairs (clean, corrupted, answer, distractor) built for one model's tokenizer, each pair's
positions named by role so that pairs from different templates line up.

- ``ioi``: the indirect object (Wang et al. 2022), templates in both name orders (ABBA, BABA), corrupted by
  the subject's second mention flipped to the other name (``s2``) or by three other names (``abc``);
  roles ``START``, ``IO``, ``S1``, ``S1+1``, ``S2``, ``PLACE``, ``OBJECT``, ``END``.
- ``facts``: a landmark's city, a country's capital, a country's language; the corrupted prompt names another
  subject of the same token length (its answer the distractor); roles ``SUBJECT``, ``END``.
- ``greater_than`` (Hanna et al. 2023): "The war lasted from the year 17YY to the year 17"; metric the
  probability of the years after YY minus those up to it; corrupted with YY = 01. Both bundled tokenizers read
  a year digit by digit, so the next token is the tens digit: YY ends in 9 (19, 29, ... 89), which makes
  "after YY" exactly a tens digit above YY's (and "up to YY" one at or below it); roles ``YY``, ``END``.
- ``induction``: random words, then the same words again (clean) against the first copy with its last
  word changed (corrupted); roles ``FIRST`` (that word in the first copy), ``END``.
- ``objects``, ``relation``, ``sentence_type``, ``sentiment``: an encoder's tasks, from the four foci of "Which do you
  like better, coffee or tea?": an object changed (tea → juice), the relation (like → hate), a question made a
  statement, the sentiment (better → worse). Each pair has probes, the texts whose embeddings the sentence's is
  compared with (its metric ``embedding``: ``cos(e, answer) - cos(e, distractor)``); roles name the changed word
  (``FOCUS``) and the others the template has (``OBJECT``, ``OTHER``), with ``START`` and ``END``.
- ``from_rows`` / ``from_csv``: a user's pairs; each bad row gets a sentence naming it, and the good rows go
  on; roles ``DIFF`` (the first position where the prompts differ) and ``END``. On an encoder the answer and
  distractor are probe texts.

Every pair is checked under the model's tokenizer (both prompts of the same length, the answer one token,
each role on its token), and a task is the same from the same seed.
"""
from __future__ import annotations

import csv
import io
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from models import AttentionModel, HeadLensError

from .task_words import (CENTURIES, FACT_TEMPLATES, FOODS, IOI_TEMPLATES, NAMES, OBJECT_TEMPLATES, OBJECTS, PLACES,
                         RELATION_PROBES, RELATION_TEMPLATES, RELATIONS, SENTIMENTS, TYPE_PROBES, TYPE_TEMPLATES,
                         WAR_NOUNS)

MAX_PAIRS = 10_000   # pairs in one task
PAGE_ROWS = 1_000    # rows of a CSV read on the page


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


INDUCTION_WORDS = 8     # words in each copy of an induction sequence

TASKS = {"ioi": "Indirect object (Wang et al. 2022)", "facts": "Facts: a city, a capital, a language",
         "greater_than": "Greater-than (Hanna et al. 2023)", "induction": "Induction: random words repeated"}
ENCODER_TASKS = {"objects": "Objects: coffee or tea → coffee or juice", "relation": "Relation: like → hate",
                 "sentence_type": "Sentence type: a question → a statement",
                 "sentiment": "Sentiment: better → worse"}
CORRUPTIONS = {"s2": "the subject's second mention flipped to the other name",
               "abc": "three other names (Wang et al.'s ABC)"}


# --- the tokenizer's view ---------------------------------------------------------------------------------

class _Reader:
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


def _token_at(offsets: list[tuple[int, int]], char: int) -> int | None:
    for i, (a, b) in enumerate(offsets):
        if a <= char < b and b > a:
            return i
    return None


def _fill(template: str, **values: str) -> tuple[str, dict[str, int]]:
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


def _pair(reader: _Reader, clean: str, corrupted: str, answer: int, distractor: int, chars: dict[str, int],
          template: str, **more) -> TaskPair | None:
    """A pair when both prompts have the same length and each role's character lies in a token; else None."""
    ids, offsets = reader.ids(clean)
    bad_ids, _ = reader.ids(corrupted)
    if len(ids) != len(bad_ids) or answer == distractor:
        return None
    roles = [("START", 0)] if "START" in chars else []
    for role, char in chars.items():
        if role == "START":
            continue
        at = _token_at(offsets, char)
        if at is None:
            return None
        roles.append((role, at))
    roles.append(("END", len(ids) - 1))
    return TaskPair(clean, corrupted, tuple(ids), tuple(bad_ids), answer, distractor, tuple(roles), template, **more)


def _draw(n: int, seed: int, make) -> list[TaskPair]:
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


# --- the generators ---------------------------------------------------------------------------------------

def ioi(model: AttentionModel, n: int = 100, seed: int = 0, corruption: str = "s2") -> Task:
    """Indirect-object pairs: half ABBA, half BABA, over every template; answer the indirect object, distractor
    the subject."""
    if corruption not in CORRUPTIONS:
        raise HeadLensError(f"Unknown corruption '{corruption}': choose {' or '.join(map(repr, CORRUPTIONS))}.")
    reader = _Reader(model)
    names, places, objects = reader.singles(NAMES), reader.singles(PLACES), reader.singles(OBJECTS)
    if len(names) < 5 or not places or not objects:
        raise HeadLensError(f"{model.name}'s tokenizer reads too few of the task's names, places and objects as "
                            "one token each to build indirect-object pairs.")

    def make(rng: random.Random) -> TaskPair | None:
        k = rng.randrange(len(IOI_TEMPLATES) * 2)
        template, order = IOI_TEMPLATES[k // 2], "ABBA" if k % 2 == 0 else "BABA"
        io_, s, x, y, z = rng.sample(names, 5)
        place, obj = rng.choice(places), rng.choice(objects)
        first, second = (io_, s) if order == "ABBA" else (s, io_)
        clean, chars = _fill(template, A=first, B=second, S=s, P=place, O=obj)
        if corruption == "s2":
            corrupted, _ = _fill(template, A=first, B=second, S=io_, P=place, O=obj)
        else:
            corrupted, _ = _fill(template, A=x, B=y, S=z, P=place, O=obj)
        roles = {"START": 0, "IO": chars["A" if order == "ABBA" else "B"],
                 "S1": chars["B" if order == "ABBA" else "A"], "S2": chars["S"], "PLACE": chars["P"],
                 "OBJECT": chars["O"]}
        pair = _pair(reader, clean, corrupted, reader.one(" " + io_), reader.one(" " + s), roles,
                     f"{order} {IOI_TEMPLATES.index(template) + 1}")
        if pair is None:
            return None
        s1 = pair.role("S1")
        order_roles = ["START", "IO", "S1", "S1+1", "S2", "PLACE", "OBJECT", "END"]
        found = dict(pair.roles) | {"S1+1": s1 + 1}
        return TaskPair(**{**pair.__dict__, "roles": tuple((r, found[r]) for r in order_roles)})

    return Task("ioi", f"{TASKS['ioi']}, corrupted by {CORRUPTIONS[corruption]}", tuple(_draw(n, seed, make)))


def facts(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """Facts in three templates; the corrupted prompt names another subject of the same token length."""
    reader = _Reader(model)
    usable = {}
    for kind, (table, template) in FACT_TEMPLATES.items():
        rows = [(s, a, reader.one(" " + a)) for s, a in table]
        usable[kind] = ([r for r in rows if r[2] is not None], template)
    kinds = [k for k, (rows, _) in usable.items() if len(rows) >= 2]
    if not kinds:
        raise HeadLensError(f"{model.name}'s tokenizer reads too few of the facts' answers as one token each.")

    def make(rng: random.Random) -> TaskPair | None:
        kind = rng.choice(kinds)
        rows, template = usable[kind]
        (s, _, a), (s2, _, d) = rng.sample(rows, 2)
        clean, chars = _fill(template, X=s)
        corrupted, _ = _fill(template, X=s2)
        last = chars["X"] + len(s) - 1  # the subject's last character: its last token
        return _pair(reader, clean, corrupted, a, d, {"SUBJECT": last}, kind)

    return Task("facts", TASKS["facts"], tuple(_draw(n, seed, make)))


def greater_than(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """Greater-than pairs: "The {noun} lasted from the year {C}{YY} to the year {C}", YY in 19, 29, ... 89,
    corrupted with YY = 01; the next token is the tens digit, ``above`` those over YY's, ``below`` the rest."""
    reader = _Reader(model)
    digits = [reader.one(str(d)) for d in range(10)]
    if any(d is None for d in digits):
        raise HeadLensError(f"{model.name}'s tokenizer does not read each digit as one token; greater-than here is "
                            "built for tokenizers that read years digit by digit.")
    nouns = reader.singles(WAR_NOUNS)

    def make(rng: random.Random) -> TaskPair | None:
        noun, century, tens = rng.choice(nouns), rng.choice(CENTURIES), rng.randrange(1, 9)
        template = "The {N} lasted from the year {C}{Y} to the year {C}"
        clean, chars = _fill(template, N=noun, C=str(century), Y=f"{tens}9")
        corrupted, _ = _fill(template, N=noun, C=str(century), Y="01")
        pair = _pair(reader, clean, corrupted, digits[tens + 1], digits[tens], {"YY": chars["Y"]}, noun,
                     above=tuple(digits[tens + 1:]), below=tuple(digits[:tens + 1]))
        return pair

    return Task("greater_than", TASKS["greater_than"], tuple(_draw(n, seed, make)), metric="greater_than")


def _plain_words(model: AttentionModel, reader: _Reader) -> list[str]:
    """Words the tokenizer reads as one token with a leading space: lower-case letters, 4 to 9 of them."""
    out = []
    for token in sorted(model.tokenizer.get_vocab()):
        word = model.tokenizer.convert_tokens_to_string([token])
        if word.startswith(" ") and word[1:].isascii() and word[1:].isalpha() and word[1:].islower() \
                and 4 <= len(word) - 1 <= 9 and reader.one(word) is not None:
            out.append(word[1:])
    return out


def induction(model: AttentionModel, n: int = 100, seed: int = 0, words: int = INDUCTION_WORDS) -> Task:
    """Random words, then the same words again, the last one left for the model to say; the corrupted prompt
    has another word in its place in the first copy."""
    reader = _Reader(model)
    vocab = _plain_words(model, reader)
    if len(vocab) < words + 1:
        raise HeadLensError(f"{model.name}'s tokenizer has too few whole words for induction pairs.")

    def make(rng: random.Random) -> TaskPair | None:
        seq = rng.sample(vocab, words + 1)
        first, other = seq[:words], seq[words]
        clean = " " + " ".join(first + first[:-1])
        corrupted = " " + " ".join(first[:-1] + [other] + first[:-1])
        chars = {"FIRST": len(" " + " ".join(first)) - len(first[-1])}
        return _pair(reader, clean, corrupted, reader.one(" " + first[-1]), reader.one(" " + other), chars,
                     f"{words} words")

    return Task("induction", TASKS["induction"], tuple(_draw(n, seed, make)))


def _probed(reader: _Reader, clean: str, corrupted: str, probes: tuple[str, str], chars: dict[str, int],
            template: str) -> TaskPair | None:
    """An encoder's pair when both prompts have the same length and each role's character lies in a token."""
    ids, offsets = reader.ids(clean)
    bad_ids, _ = reader.ids(corrupted)
    if len(ids) != len(bad_ids) or probes[0] == probes[1]:
        return None
    roles = [("START", 0)]
    for role, char in chars.items():
        at = _token_at(offsets, char)
        if at is None:
            return None
        roles.append((role, at))
    roles.append(("END", len(ids) - 1))
    return TaskPair(clean, corrupted, tuple(ids), tuple(bad_ids), -1, -1, tuple(roles), template, probes=probes)


def _focus_task(model: AttentionModel, name: str, n: int, seed: int, make) -> Task:
    """An encoder's task ``name`` of ``n`` pairs, each from ``make(rng, foods)`` (foods: those the tokenizer reads as
    one token)."""
    reader = _Reader(model)
    foods = reader.singles(FOODS)
    if len(foods) < 4:
        raise HeadLensError(f"{model.name}'s tokenizer reads too few of the task's foods as one token each.")
    return Task(name, ENCODER_TASKS[name], tuple(_draw(n, seed, lambda rng: make(reader, rng, foods))),
                metric="embedding")


def objects(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """The second object changed: "coffee or tea" → "coffee or juice"; probes the two objects."""
    def make(reader, rng, foods):
        template = rng.choice(OBJECT_TEMPLATES)
        x, y, z = rng.sample(foods, 3)
        clean, chars = _fill(template, X=x, Y=y)
        corrupted, _ = _fill(template, X=x, Y=z)
        return _probed(reader, clean, corrupted, (y, z), {"OBJECT": chars["X"], "FOCUS": chars["Y"]}, template)
    return _focus_task(model, "objects", n, seed, make)


def relation(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """The relation changed: like → hate; probes "I like it." and "I hate it."."""
    def make(reader, rng, foods):
        template = rng.choice(RELATION_TEMPLATES)
        (r, r2), (x, y) = rng.choice(RELATIONS), rng.sample(foods, 2)
        clean, chars = _fill(template, R=r, X=x, Y=y)
        corrupted, _ = _fill(template, R=r2, X=x, Y=y)
        probes = (RELATION_PROBES[0].format(R=r), RELATION_PROBES[1].format(R=r2))
        return _probed(reader, clean, corrupted, probes, {"FOCUS": chars["R"], "OBJECT": chars["X"]}, template)
    return _focus_task(model, "relation", n, seed, make)


def sentence_type(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """A question made a statement of as many tokens ("Do you like tea?" → "You do like tea."); probes "Is it?"
    and "It is."."""
    def make(reader, rng, foods):
        question, statement = rng.choice(TYPE_TEMPLATES)
        x, y = rng.sample(foods, 2)
        clean, chars = _fill(question, X=x, Y=y)
        corrupted, _ = _fill(statement, X=x, Y=y)
        clean, corrupted = clean[0].upper() + clean[1:], corrupted[0].upper() + corrupted[1:]
        return _probed(reader, clean, corrupted, TYPE_PROBES, {"FOCUS": len(clean) - 1, "OBJECT": chars["X"]},
                       question)
    return _focus_task(model, "sentence_type", n, seed, make)


def sentiment(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """The sentiment changed: better → worse, good → bad; probes the two words."""
    def make(reader, rng, foods):
        words, templates = rng.choice(SENTIMENTS)
        (w, w2), template, (x, y) = rng.choice(words), rng.choice(templates), rng.sample(foods, 2)
        clean, chars = _fill(template, S=w, X=x, Y=y)
        corrupted, _ = _fill(template, S=w2, X=x, Y=y)
        clean, corrupted = clean[0].upper() + clean[1:], corrupted[0].upper() + corrupted[1:]
        return _probed(reader, clean, corrupted, (w, w2), {"FOCUS": chars["S"], "OBJECT": chars["X"]}, template)
    return _focus_task(model, "sentiment", n, seed, make)


GENERATORS = {"ioi": ioi, "facts": facts, "greater_than": greater_than, "induction": induction}
ENCODER_GENERATORS = {"objects": objects, "relation": relation, "sentence_type": sentence_type,
                      "sentiment": sentiment}


def tasks_for(model: AttentionModel) -> dict[str, str]:
    """The built-in tasks ``model`` runs, by name: a language model's (``TASKS``) or an encoder's
    (``ENCODER_TASKS``)."""
    return TASKS if model.causal else ENCODER_TASKS


def make_task(model: AttentionModel, name: str, n: int = 100, seed: int = 0, **options) -> Task:
    """The task ``name`` (``TASKS``, or on an encoder ``ENCODER_TASKS``) of ``n`` pairs for ``model``'s
    tokenizer."""
    generators = GENERATORS if model.causal else ENCODER_GENERATORS
    if name not in generators:
        kind = "a language model" if model.causal else "an encoder"
        raise HeadLensError(f"'{name}' is not a task for {kind}: choose one of {', '.join(generators)}, or give your "
                            "own pairs.")
    return generators[name](model, n=n, seed=seed, **options)


# --- a user's pairs ---------------------------------------------------------------------------------------

COLUMNS = ("clean", "corrupted", "answer", "distractor")


def _one_token(reader: _Reader, value, what: str) -> tuple[int | None, str | None]:
    if not isinstance(value, str) or not value:
        return None, f"its {what} is empty; give the token as text, such as \" Mary\" with its leading space"
    ids = reader.tok(value, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = " ".join(repr(p) for p in reader.tok.convert_ids_to_tokens(ids))
        return None, (f"its {what} {value!r} is {len(ids)} tokens ({pieces}); give a string the tokenizer reads "
                      "as one token")
    return int(ids[0]), None


def from_rows(model: AttentionModel, rows: Iterable[dict], name: str = "yours", limit: int = MAX_PAIRS,
              first_row: int = 2) -> Task:
    """A task from rows with ``clean``, ``corrupted``, ``answer`` and ``distractor``; a row that cannot be a pair
    is left out with a sentence in ``problems`` naming it (rows counted from ``first_row``, a CSV's first data
    row being its line 2)."""
    reader, pairs, problems = _Reader(model), [], []
    over = []
    for number, row in enumerate(rows, start=first_row):
        if len(pairs) >= limit:
            over.append(number)
            continue
        why = _row_problem(reader, row)
        if isinstance(why, str):
            problems.append(f"Row {number}: {why}.")
        else:
            pairs.append(why)
    if over:
        problems.append(f"Rows {over[0]:,} to {over[-1]:,} are past the limit of {limit:,} pairs; split the file "
                        "or run it from the command line (python -m analysis.task_run).")
    if not pairs:
        raise HeadLensError("No row could be made a pair. " + " ".join(problems[:5]))
    return Task(name, "Your pairs", tuple(pairs), "logit_diff" if model.causal else "embedding",
                problems=tuple(problems))


def _row_problem(reader: _Reader, row: dict) -> TaskPair | str:
    texts = {}
    for what in ("clean", "corrupted"):
        value = row.get(what)
        if not isinstance(value, str) or not value.strip():
            return f"the {what} prompt is empty or not text; write the prompt in the '{what}' column"
        texts[what] = value
    if not reader.model.causal:  # an encoder's answer and distractor: probe texts
        probes = tuple(row.get(what).strip() if isinstance(row.get(what), str) else "" for what in
                       ("answer", "distractor"))
        if not all(probes):
            return ("its answer or distractor is empty; on an encoder each is a text (a word or a sentence) the "
                    "sentence's embedding is compared with")
        if probes[0] == probes[1]:
            return "its answer and distractor are the same text; give two different ones"
        answer = distractor = -1
    else:
        probes = ()
        answer, why = _one_token(reader, row.get("answer"), "answer")
        if why:
            return why
        distractor, why = _one_token(reader, row.get("distractor"), "distractor")
        if why:
            return why
        if answer == distractor:
            return "its answer and distractor are the same token; give two different ones"
    ids, _ = reader.ids(texts["clean"])
    bad, _ = reader.ids(texts["corrupted"])
    if len(ids) != len(bad):
        return (f"the clean prompt is {len(ids)} tokens and the corrupted one {len(bad)}; change the corrupted "
                "prompt so that both have the same number of tokens")
    if len(ids) > 256:
        return f"the prompts are {len(ids)} tokens; a pair has at most 256"
    differ = [i for i, (a, b) in enumerate(zip(ids, bad)) if a != b]
    roles = (("DIFF", differ[0] if differ else len(ids) - 1), ("END", len(ids) - 1))
    return TaskPair(texts["clean"], texts["corrupted"], tuple(ids), tuple(bad), answer, distractor, roles, "row",
                    probes=probes)


def from_csv(model: AttentionModel, text: str | bytes, limit: int = PAGE_ROWS) -> Task:
    """A task from a CSV with the columns clean, corrupted, answer, distractor (a header row first)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise HeadLensError("The file is not UTF-8 text; save it as a UTF-8 CSV.") from err
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip().lower() for h in (reader.fieldnames or [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise HeadLensError(f"The CSV needs a header row with the columns {', '.join(COLUMNS)}; it lacks "
                            f"{', '.join(missing)}.")
    reader.fieldnames = header
    return from_rows(model, reader, limit=limit)
