"""Rules that say where a head should attend: each maps a text, in a model's tokens, to the keys each query should
attend to. A rule is public so that anyone can score one of their own against a head.

    rule = rule_named("previous token")
    rule.keys(model, "The cat sat.")      # for each token position, the predicted key positions

Positional rules read positions; lexical rules read the tokens (a duplicate is the same token, as the tokenizer
writes it); syntactic rules and the seed's foci read spaCy's parse, each token standing for the word holding its
first character (pieces of a word share their word's keys, as Head roles merges them). A query whose rule names no
key gets an empty list. In a causal model no rule names a key after its query.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from models import HeadLensError

from .foci import CLOSING, FINAL_MARKS, FOCI, FOCUS_NAMES, word_classes
from .measure import align_to_words, is_punct, parse

Keys = list[list[int]]

DEPENDENCIES = {"nsubj": "its subject", "dobj": "its direct object", "det": "its determiner",
                "amod": "its adjective", "prep": "its preposition", "pobj": "its preposition's object",
                "aux": "its auxiliary", "advmod": "its adverb", "compound": "the other part of its compound",
                "conj": "the word it is joined to by a conjunction", "poss": "its possessor"}
UNION = " or "  # joins two rules' names: "previous token or first token"


@dataclass(frozen=True)
class Reading:
    """A text as a rule reads it: the model's tokens (as the tokenizer writes them), each token's character span,
    which are special, whether a query sees later keys; spaCy's parse and each token's word when a rule asks."""

    text: str
    tokens: list[str]
    offsets: list[tuple[int, int]]
    special: np.ndarray
    causal: bool

    @classmethod
    def of(cls, attention) -> Reading:
        """What an ``Attention`` (or a long prompt's) says about its text's tokens."""
        return cls(attention.text, list(attention.tokens), [tuple(o) for o in attention.offsets],
                   np.asarray(attention.special, dtype=bool), bool(attention.causal))

    @classmethod
    def read(cls, model, text: str) -> Reading:
        """``text`` in ``model``'s tokens, cut to what the model reads, as ``attend`` tokenizes it."""
        model.token_counts([text])  # an empty or unreadable text gets its sentence here
        enc = model.tokenize(text, truncation=True, max_length=model.max_tokens, return_offsets_mapping=True,
                             return_special_tokens_mask=True)
        return cls(text, model.tokenizer.convert_ids_to_tokens(enc["input_ids"]),
                   [tuple(o) for o in enc["offset_mapping"]], np.asarray(enc["special_tokens_mask"], dtype=bool),
                   bool(model.causal))

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def pieces(self) -> list[str]:
        """Each token's own characters of the text ("" for a special token)."""
        return ["" if s or b >= e else self.text[b:e] for (b, e), s in zip(self.offsets, self.special)]

    @cached_property
    def doc(self):
        return parse([self.text])[0]

    @cached_property
    def words(self) -> list[int | None]:
        """Each token's spaCy word (the one holding its first character); None for special tokens."""
        return align_to_words(self, self.doc)

    @cached_property
    def tokens_of(self) -> dict[int, list[int]]:
        """Each word's tokens, in order."""
        out: dict[int, list[int]] = {}
        for t, w in enumerate(self.words):
            if w is not None:
                out.setdefault(w, []).append(t)
        return out

    def word_keys(self, targets: Callable[[object], Sequence[int]]) -> Keys:
        """For each token, the tokens of the words ``targets(word)`` names for its word (``word`` a spaCy token)."""
        cache: dict[int, list[int]] = {}
        out = []
        for w in self.words:
            if w is None:
                out.append([])
                continue
            if w not in cache:
                cache[w] = sorted(t for v in targets(self.doc[w]) for t in self.tokens_of.get(v, ()))
            out.append(list(cache[w]))
        return out


@dataclass(frozen=True)
class Rule:
    """Where a head should attend: ``name`` (what ``rule_named`` takes back), ``family`` (positional, lexical,
    syntactic, focus, or the two families of a union) and the sentence that says it."""

    name: str
    family: str
    sentence: str
    predict: Callable[[Reading], Keys]

    def keys(self, model, text: str) -> Keys:
        """For each token position of ``model``'s tokenization of ``text``, the key positions this rule predicts."""
        return self.keys_of(Reading.read(model, text))

    def keys_of(self, reading: Reading) -> Keys:
        """The keys for a text already read (``Reading.of(attention)``): sorted, each once, none after its query in a
        causal model."""
        out = []
        for q, keys in enumerate(self.predict(reading)):
            keys = sorted({int(k) for k in keys if 0 <= k < len(reading) and not (reading.causal and k > q)})
            out.append(keys)
        return out

    def __or__(self, other: Rule) -> Rule:
        return union(self, other)


def union(a: Rule, b: Rule) -> Rule:
    """The keys of either rule: "the previous token or the first token"."""
    families = a.family if a.family == b.family else f"{a.family}{UNION}{b.family}"
    said = b.sentence.removeprefix("attends ").removeprefix("to ")
    return Rule(f"{a.name}{UNION}{b.name}", families, f"{a.sentence}, or to {said}",
                lambda r: [x + y for x, y in zip(a.predict(r), b.predict(r))])


# --- positional ---------------------------------------------------------------------------------------------------

def _offset(d: int) -> Callable[[Reading], Keys]:
    return lambda r: [[q + d] if 0 <= q + d < len(r) else [] for q in range(len(r))]


def _first(r: Reading) -> Keys:
    return [[0] for _ in range(len(r))]


def _last(r: Reading) -> Keys:
    return [[len(r) - 1] for _ in range(len(r))]


# --- lexical -------------------------------------------------------------------------------------------------------

def _duplicate(r: Reading) -> Keys:
    return [[k for k in range(q) if r.tokens[k] == r.tokens[q]] for q in range(len(r))]


def _induction(r: Reading) -> Keys:
    return [[k + 1 for k in range(q - 1) if r.tokens[k] == r.tokens[q]] for q in range(len(r))]


def _punctuation(r: Reading) -> Keys:
    out, last = [], None
    for q, piece in enumerate(r.pieces):
        out.append([] if last is None else [last])
        if is_punct(piece.strip()):
            last = q
    return out


def _sentence_words(sent) -> list:
    return [w for w in sent if not w.is_space]


def _final_mark(word) -> list[int]:
    words = _sentence_words(word.sent)
    end = len(words) - 1
    while end > 0 and words[end].text in CLOSING:
        end -= 1
    return [words[end].i] if words and words[end].text in FINAL_MARKS else []


def _sentence_start(r: Reading) -> Keys:
    def first_token(word) -> list[int]:
        words = _sentence_words(word.sent)
        tokens = r.tokens_of.get(words[0].i, []) if words else []
        return tokens[:1]
    cache: dict[int, list[int]] = {}
    return [[] if w is None else cache.setdefault(w, first_token(r.doc[w])) for w in r.words]


# --- syntactic and the seed's foci ---------------------------------------------------------------------------------

def _dependents(relation: str) -> Callable[[Reading], Keys]:
    return lambda r: r.word_keys(lambda w: [c.i for c in w.children if c.dep_ == relation])


def _focus(focus: str) -> Callable[[Reading], Keys]:
    def predict(r: Reading) -> Keys:
        members = np.flatnonzero(word_classes(r.doc)[focus]).tolist()
        return r.word_keys(lambda w: members)
    return predict


FIRST = "the first token ([CLS] in an encoder, the sink in a decoder)"
LAST = "the last token ([SEP] in an encoder)"
NAMED = {False: {FIRST: "[CLS]", LAST: "[SEP]"}, True: {FIRST: "the first token (the sink)", LAST: "the last token"}}


def in_words(sentence: str, causal: bool) -> str:
    """A rule's sentence as it reads for an encoder (``[CLS]``, ``[SEP]``) or a decoder (the sink)."""
    for general, said in NAMED[bool(causal)].items():
        sentence = sentence.replace(general, said)
    return sentence


def _rules() -> dict[str, Rule]:
    rules = [
        Rule("previous token", "positional", "attends to the previous token", _offset(-1)),
        Rule("next token", "positional", "attends to the next token", _offset(1)),
        Rule("itself", "positional", "attends to itself", _offset(0)),
        Rule("2 back", "positional", "attends to the token two back", _offset(-2)),
        Rule("3 back", "positional", "attends to the token three back", _offset(-3)),
        Rule("first token", "positional", f"attends to {FIRST}", _first),
        Rule("last token", "positional", f"attends to {LAST}", _last),
        Rule("duplicate", "lexical", "attends to an earlier copy of the current token", _duplicate),
        Rule("induction", "lexical", "attends to the token after an earlier copy of the current one (induction)",
             _induction),
        Rule("punctuation", "lexical", "attends to the nearest earlier punctuation", _punctuation),
        Rule("final mark", "lexical", "attends to its sentence's final mark",
             lambda r: r.word_keys(_final_mark)),
        Rule("sentence start", "lexical", "attends to the start of its sentence", _sentence_start),
        Rule("dependency head", "syntactic", "attends from a word to the word it depends on (its head in the parse)",
             lambda r: r.word_keys(lambda w: [w.head.i] if w.head.i != w.i else [])),
        *(Rule(f"dependents: {rel}", "syntactic", f"attends from a word to {said} ({rel})", _dependents(rel))
          for rel, said in DEPENDENCIES.items()),
        Rule("root verb", "syntactic", "attends to its sentence's root verb",
             lambda r: r.word_keys(lambda w: [w.sent.root.i])),
        *(Rule(f"focus: {f}", "focus", f"attends to the {FOCUS_NAMES[f]} words", _focus(f)) for f in FOCI),
    ]
    return {rule.name: rule for rule in rules}


RULES: dict[str, Rule] = _rules()


def rule_named(name: str) -> Rule:
    """The rule ``name`` names: one of ``RULES`` or two of them joined by " or " ("previous token or first token")."""
    if name in RULES:
        return RULES[name]
    parts = name.split(UNION)
    if len(parts) == 2 and all(p in RULES for p in parts):
        return union(RULES[parts[0]], RULES[parts[1]])
    unknown = [p for p in parts if p not in RULES] or [name]
    raise HeadLensError(f"There is no rule named {unknown[0]!r}. Rules: {', '.join(RULES)}; or two of them joined "
                        f"by {UNION.strip()!r}.")
