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
- ``objects``, ``relation``, ``sentence_type``, ``sentiment``: an encoder's tasks (``analysis.tasks.focus``).
- ``from_rows`` / ``from_csv``: a user's pairs; each bad row gets a sentence naming it, and the good rows go
  on; roles ``DIFF`` (the first position where the prompts differ) and ``END``. On an encoder the answer and
  distractor are probe texts.

What a pair and a task are, and the pieces every generator uses, are in ``analysis.tasks.pairs``. Every pair is
checked under the model's tokenizer (both prompts of the same length, the answer one token,
each role on its token), and a task is the same from the same seed.
"""
from __future__ import annotations

import csv
import io
import random
from collections.abc import Iterable

from models import AttentionModel, HeadLensError
from models.run import stack_of

from ..effects.readouts import own_readout, readouts
from .focus import ENCODER_GENERATORS, ENCODER_TASKS
from .pairs import MAX_PAIRS, Reader, Task, TaskPair, draw, fill, pair_of
from .words import CENTURIES, FACT_TEMPLATES, IOI_TEMPLATES, NAMES, OBJECTS, PLACES, WAR_NOUNS

PAGE_ROWS = 1_000    # rows of a CSV read on the page
INDUCTION_WORDS = 8     # words in each copy of an induction sequence

TASKS = {"ioi": "Indirect object (Wang et al. 2022)", "facts": "Facts: a city, a capital, a language",
         "greater_than": "Greater-than (Hanna et al. 2023)", "induction": "Induction: random words repeated"}
CORRUPTIONS = {"s2": "the subject's second mention flipped to the other name",
               "abc": "three other names (Wang et al.'s ABC)"}


# --- the generators ---------------------------------------------------------------------------------------

def ioi(model: AttentionModel, n: int = 100, seed: int = 0, corruption: str = "s2") -> Task:
    """Indirect-object pairs: half ABBA, half BABA, over every template; answer the indirect object, distractor
    the subject."""
    if corruption not in CORRUPTIONS:
        raise HeadLensError(f"Unknown corruption '{corruption}': choose {' or '.join(map(repr, CORRUPTIONS))}.")
    reader = Reader(model)
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
        clean, chars = fill(template, A=first, B=second, S=s, P=place, O=obj)
        if corruption == "s2":
            corrupted, _ = fill(template, A=first, B=second, S=io_, P=place, O=obj)
        else:
            corrupted, _ = fill(template, A=x, B=y, S=z, P=place, O=obj)
        roles = {"START": 0, "IO": chars["A" if order == "ABBA" else "B"],
                 "S1": chars["B" if order == "ABBA" else "A"], "S2": chars["S"], "PLACE": chars["P"],
                 "OBJECT": chars["O"]}
        pair = pair_of(reader, clean, corrupted, reader.one(" " + io_), reader.one(" " + s), roles,
                     f"{order} {IOI_TEMPLATES.index(template) + 1}")
        if pair is None:
            return None
        s1 = pair.role("S1")
        order_roles = ["START", "IO", "S1", "S1+1", "S2", "PLACE", "OBJECT", "END"]
        found = dict(pair.roles) | {"S1+1": s1 + 1}
        return TaskPair(**{**pair.__dict__, "roles": tuple((r, found[r]) for r in order_roles)})

    return Task("ioi", f"{TASKS['ioi']}, corrupted by {CORRUPTIONS[corruption]}", tuple(draw(n, seed, make)))


def facts(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """Facts in three templates; the corrupted prompt names another subject of the same token length."""
    reader = Reader(model)
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
        clean, chars = fill(template, X=s)
        corrupted, _ = fill(template, X=s2)
        last = chars["X"] + len(s) - 1  # the subject's last character: its last token
        return pair_of(reader, clean, corrupted, a, d, {"SUBJECT": last}, kind)

    return Task("facts", TASKS["facts"], tuple(draw(n, seed, make)))


def greater_than(model: AttentionModel, n: int = 100, seed: int = 0) -> Task:
    """Greater-than pairs: "The {noun} lasted from the year {C}{YY} to the year {C}", YY in 19, 29, ... 89,
    corrupted with YY = 01; the next token is the tens digit, ``above`` those over YY's, ``below`` the rest."""
    reader = Reader(model)
    digits = [reader.one(str(d)) for d in range(10)]
    if any(d is None for d in digits):
        raise HeadLensError(f"{model.name}'s tokenizer does not read each digit as one token; greater-than here is "
                            "built for tokenizers that read years digit by digit.")
    nouns = reader.singles(WAR_NOUNS)

    def make(rng: random.Random) -> TaskPair | None:
        noun, century, tens = rng.choice(nouns), rng.choice(CENTURIES), rng.randrange(1, 9)
        template = "The {N} lasted from the year {C}{Y} to the year {C}"
        clean, chars = fill(template, N=noun, C=str(century), Y=f"{tens}9")
        corrupted, _ = fill(template, N=noun, C=str(century), Y="01")
        pair = pair_of(reader, clean, corrupted, digits[tens + 1], digits[tens], {"YY": chars["Y"]}, noun,
                     above=tuple(digits[tens + 1:]), below=tuple(digits[:tens + 1]))
        return pair

    return Task("greater_than", TASKS["greater_than"], tuple(draw(n, seed, make)), metric="greater_than")


def _plain_words(model: AttentionModel, reader: Reader) -> list[str]:
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
    reader = Reader(model)
    vocab = _plain_words(model, reader)
    if len(vocab) < words + 1:
        raise HeadLensError(f"{model.name}'s tokenizer has too few whole words for induction pairs.")

    def make(rng: random.Random) -> TaskPair | None:
        seq = rng.sample(vocab, words + 1)
        first, other = seq[:words], seq[words]
        clean = " " + " ".join(first + first[:-1])
        corrupted = " " + " ".join(first[:-1] + [other] + first[:-1])
        chars = {"FIRST": len(" " + " ".join(first)) - len(first[-1])}
        return pair_of(reader, clean, corrupted, reader.one(" " + first[-1]), reader.one(" " + other), chars,
                     f"{words} words")

    return Task("induction", TASKS["induction"], tuple(draw(n, seed, make)))


GENERATORS = {"ioi": ioi, "facts": facts, "greater_than": greater_than, "induction": induction}
def _compiled(model, n: int = 100, seed: int = 0):
    return own_readout(model).task(n, seed)


BUILT_IN = {"next_token": (GENERATORS, TASKS), "focus": (ENCODER_GENERATORS, ENCODER_TASKS),  # by ``Readout.tasks``
            "compiled": ({"one_token": _compiled}, {"one_token": "One token changed"})}


def built_in(readout) -> dict[str, str]:
    """The built-in tasks ``readout`` reads (``Readout.tasks``): name -> title; none for a readout without."""
    return dict(BUILT_IN[readout.tasks][1]) if readout.tasks else {}


def make_task(model: AttentionModel, name: str, n: int = 100, seed: int = 0, **options) -> Task:
    """The task ``name`` of ``n`` pairs for ``model``'s tokenizer, one of the built-in tasks its own readout reads
    (``built_in``: a language model's ``TASKS``, an encoder's or a classifier's ``ENCODER_TASKS``, a classifier's
    pairs comparing its last class with its first), as that readout reads it."""
    readout = own_readout(model, stack_of(model, "A task is read"))
    generators = BUILT_IN[readout.tasks][0] if readout.tasks else {}
    if name not in generators:
        every = {t for g, _ in BUILT_IN.values() for t in g}
        what = f"'{name}' is not a task for {model.name}" if name in every else f"There is no task '{name}'"
        raise HeadLensError(f"{what}, whose prediction is read as the {readout.title}: "
                            + (f"choose one of {', '.join(generators)}, or give your own pairs." if generators else
                               f"give your own pairs ({readout.csv_note.rstrip('.')})."))
    return readout.adapt(generators[name](model, n=n, seed=seed, **options))


# --- a user's pairs ---------------------------------------------------------------------------------------

COLUMNS = ("clean", "corrupted", "answer", "distractor")


def _one_token(reader: Reader, value, what: str) -> tuple[int | None, str | None]:
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
    row being its line 2). Each row's answer and distractor are what its readout compares (``effects.readouts``:
    tokens, probe texts, a masked token's, class labels)."""
    reader, pairs, problems, metrics = Reader(model), [], [], []
    offered = readouts(model, stack_of(model, "A task is read"))
    over = []
    for number, row in enumerate(rows, start=first_row):
        if len(pairs) >= limit:
            over.append(number)
            continue
        why = _row_problem(reader, row, offered)
        if isinstance(why, str):
            problems.append(f"Row {number}: {why}.")
        else:
            pairs.append(why[0])
            metrics.append(why[1])
    if over:
        problems.append(f"Rows {over[0]:,} to {over[-1]:,} are past the limit of {limit:,} pairs; split the file "
                        "or run it from the command line (python -m analysis.tasks.run).")
    if not pairs:
        raise HeadLensError("No row could be made a pair. " + " ".join(problems[:5]))
    metric = metrics[0] if len(set(metrics)) == 1 else offered[-1].metric
    return Task(name, "Your pairs", tuple(pairs), metric, problems=tuple(problems))


def _row_problem(reader: Reader, row: dict, offered) -> tuple[TaskPair, str] | str:
    """A row as a pair and the metric its readout (the first of ``offered`` that reads its clean prompt) gives it,
    or what is wrong with it."""
    texts = {}
    for what in ("clean", "corrupted"):
        value = row.get(what)
        if not isinstance(value, str) or not value.strip():
            return f"the {what} prompt is empty or not text; write the prompt in the '{what}' column"
        texts[what] = value
    readout = next((r for r in offered if r.reads(texts["clean"])), offered[-1])
    ids, _ = reader.ids(texts["clean"])
    bad, _ = reader.ids(texts["corrupted"])
    read = readout.row(row, lambda value, what: _one_token(reader, value, what), ids, bad)
    if isinstance(read, str):
        return read
    answer, distractor, probes, marked = read
    if len(ids) != len(bad):
        return (f"the clean prompt is {len(ids)} tokens and the corrupted one {len(bad)}; change the corrupted "
                "prompt so that both have the same number of tokens")
    if len(ids) > 256:
        return f"the prompts are {len(ids)} tokens; a pair has at most 256"
    differ = [i for i, (a, b) in enumerate(zip(ids, bad)) if a != b]
    roles = (("DIFF", differ[0] if differ else len(ids) - 1), *marked, ("END", len(ids) - 1))
    return TaskPair(texts["clean"], texts["corrupted"], tuple(ids), tuple(bad), answer, distractor, roles, "row",
                    probes=probes), readout.metric


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
