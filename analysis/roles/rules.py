"""Rules that say where a head should attend: each maps a text, in a model's tokens, to the keys each query should
attend to. A rule is public so that anyone can score one of their own against a head.

    rule = rule_named("previous token")
    rule.keys(model, "The cat sat.")      # for each token position, the predicted key positions

Positional rules read positions; lexical rules read the tokens (a duplicate is the same token, as the tokenizer
writes it); syntactic rules and the seed's foci read spaCy's parse, each token standing for the word holding its
first character (pieces of a word share their word's keys, as Head roles merges them). A query whose rule names no
key gets an empty list. In a causal model no rule names a key after its query.

The rules prose needs sit beside them: recency (the last 4·h tokens, weighted down by half every h tokens back:
``Rule.spread``), the nearest earlier noun, verb, proper noun or pronoun, the previous sentence's end, the same word
earlier and the word after its earlier copy (word level, in lower case), the sentence's subject, the second token,
and the text's first copy of a common word (a second sink some heads keep).
"""
from __future__ import annotations

import functools
import operator
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

    @cached_property
    def _sentences(self) -> tuple[list[tuple[list, object]], list[int]]:
        spans = list(self.doc.sents)
        of = [0] * len(self.doc)
        for i, span in enumerate(spans):
            of[span.start:span.end] = [i] * (span.end - span.start)
        return [([w for w in span if not w.is_space], span.root) for span in spans], of

    def sentence(self, word: int, before: int = 0) -> tuple[list, object] | None:
        """The words (spaces left out) and the root of the sentence holding spaCy word ``word``, or of the sentence
        ``before`` sentences earlier (None where there is none)."""
        spans, of = self._sentences
        i = of[word] - before
        return spans[i] if i >= 0 else None

    @cached_property
    def copies(self) -> list[list[int]]:
        """For each spaCy word, the earlier words that are the same word (in lower case; punctuation never)."""
        seen: dict[str, list[int]] = {}
        out = []
        for w in self.doc:
            skip = w.is_punct or w.is_space
            out.append([] if skip else list(seen.get(w.lower_, ())))
            if not skip:
                seen.setdefault(w.lower_, []).append(w.i)
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
    half_life: float | None = None  # a recency rule's decay: a key d tokens before the previous one weighs 2^(-d/h)
    select: str = ""  # the rule as a RASP Select (keys, queries, comparison), where it is one

    @property
    def comparisons(self) -> set[str]:
        """The comparisons of the Selects the rule is ({"LT"}; {"EQ", "LT"} for two joined); none for a rule that is
        no Select."""
        return {part.rsplit(", ", 1)[1].rstrip(")") for part in self.select.split(" & ")} if self.select else set()

    def spread(self, queries: np.ndarray, named: np.ndarray) -> np.ndarray:
        """How a program spreads this rule's part of each query's row over the keys it names (``named``, bool
        ``(queries, n)``): evenly, or (a recency rule) halving every ``half_life`` tokens back from the previous
        token. Each row sums to 1, or to 0 where the rule names no key."""
        w = named.astype(np.float64)
        if self.half_life is not None:
            back = np.asarray(queries)[:, None] - 1 - np.arange(named.shape[1])[None, :]
            w *= 0.5 ** (np.maximum(back, 0) / self.half_life)
        total = w.sum(-1, keepdims=True)
        return np.divide(w, total, out=np.zeros_like(w), where=total > 0)

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
    families = UNION.join(dict.fromkeys(a.family.split(UNION) + b.family.split(UNION)))
    said = b.sentence.removeprefix("attends ").removeprefix("to ")
    return Rule(f"{a.name}{UNION}{b.name}", families, f"{a.sentence}, or to {said}",
                lambda r: [x + y for x, y in zip(a.predict(r), b.predict(r))])


# --- positional ---------------------------------------------------------------------------------------------------

def _offset(d: int) -> Callable[[Reading], Keys]:
    return lambda r: [[q + d] if 0 <= q + d < len(r) else [] for q in range(len(r))]


def _offset_select(d: int) -> str:
    return f"Select(indices, indices{d:+d}, EQ)" if d else "Select(indices, indices, EQ)"


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


def _final_mark(r: Reading) -> Keys:
    def mark(word) -> list[int]:
        words, _ = r.sentence(word.i)
        end = len(words) - 1
        while end > 0 and words[end].text in CLOSING:
            end -= 1
        return [words[end].i] if words and words[end].text in FINAL_MARKS else []
    return r.word_keys(mark)


def _sentence_start(r: Reading) -> Keys:
    def first_token(word) -> list[int]:
        words, _ = r.sentence(word)
        tokens = r.tokens_of.get(words[0].i, []) if words else []
        return tokens[:1]
    cache: dict[int, list[int]] = {}
    return [[] if w is None else cache.setdefault(w, first_token(w)) for w in r.words]


# --- syntactic and the seed's foci ---------------------------------------------------------------------------------

def _dependents(relation: str) -> Callable[[Reading], Keys]:
    return lambda r: r.word_keys(lambda w: [c.i for c in w.children if c.dep_ == relation])


def _focus(focus: str) -> Callable[[Reading], Keys]:
    def predict(r: Reading) -> Keys:
        members = np.flatnonzero(word_classes(r.doc)[focus]).tolist()
        return r.word_keys(lambda w: members)
    return predict


# --- prose: recency, the nearest word of a class, the same word, the sentence around -----------------------------

RECENT = (1, 2, 4, 8)  # recency rules' half-lives, in tokens; each names the last four half-lives' tokens


def _recent(half_life: int) -> Callable[[Reading], Keys]:
    return lambda r: [list(range(max(0, q - 4 * half_life), q)) for q in range(len(r))]


def _nearest_earlier(test: Callable[[object], bool]) -> Callable[[Reading], Keys]:
    """The tokens of the nearest word before the query's word that passes ``test`` (a spaCy token)."""
    def predict(r: Reading) -> Keys:
        before, last = [], None
        for w in r.doc:
            before.append(last)
            if test(w):
                last = w.i
        return r.word_keys(lambda w: [] if before[w.i] is None else [before[w.i]])
    return predict


def _previous_end(r: Reading) -> Keys:
    def end(word) -> list[int]:
        before = r.sentence(word.i, before=1)
        return [before[0][-1].i] if before and before[0] else []
    return r.word_keys(end)


def _subject(r: Reading) -> Keys:
    return r.word_keys(lambda w: [c.i for c in r.sentence(w.i)[1].children if c.dep_ in ("nsubj", "nsubjpass")])


COMMON = {"the": "'the'", "a": "'a'", "and": "'and'", "of": "'of'", "to": "'to'", ",": "comma",
          ".": "full stop"}  # words whose first copy a head may use as a second sink, as a rule names them


def _first_copy(word: str) -> Callable[[Reading], Keys]:
    def predict(r: Reading) -> Keys:
        first = next((w.i for w in r.doc if w.lower_ == word), None)
        return r.word_keys(lambda w: [] if first is None or first >= w.i else [first])
    return predict


CLASSES = {"noun": ("NOUN",), "verb": ("VERB",), "proper noun": ("PROPN",), "pronoun": ("PRON",)}


def _prose_rules() -> list[Rule]:
    return [
        *(Rule(f"recent {h}", "positional",
               f"attends to the last {4 * h} tokens, less the further back (half as much every {h} back)",
               _recent(h), half_life=h) for h in RECENT),
        *(Rule(f"nearest {name}", "syntactic", f"attends to the nearest earlier {name}",
               _nearest_earlier(lambda w, pos=pos: w.pos_ in pos)) for name, pos in CLASSES.items()),
        Rule("previous sentence end", "lexical", "attends to the end of the sentence before its own", _previous_end),
        Rule("same word", "lexical", "attends to earlier copies of its word",
             lambda r: r.word_keys(lambda w: r.copies[w.i])),
        Rule("word induction", "lexical", "attends to the word after an earlier copy of its word",
             lambda r: r.word_keys(lambda w: [v + 1 for v in r.copies[w.i] if v + 1 < w.i])),
        Rule("sentence subject", "syntactic", "attends to the subject of its sentence", _subject),
        Rule("second token", "positional", "attends to the second token, the first after the first token",
             lambda r: [[1] if q >= 1 else [] for q in range(len(r))]),
        *(Rule(f"first {said}", "lexical", f"attends to the text's first {said} before its word (a second sink)",
               _first_copy(w)) for w, said in COMMON.items()),
    ]


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
        Rule("previous token", "positional", "attends to the previous token", _offset(-1), select=_offset_select(-1)),
        Rule("next token", "positional", "attends to the next token", _offset(1), select=_offset_select(1)),
        Rule("itself", "positional", "attends to itself", _offset(0), select=_offset_select(0)),
        Rule("2 back", "positional", "attends to the token two back", _offset(-2), select=_offset_select(-2)),
        Rule("3 back", "positional", "attends to the token three back", _offset(-3), select=_offset_select(-3)),
        Rule("first token", "positional", f"attends to {FIRST}", _first),
        Rule("last token", "positional", f"attends to {LAST}", _last, select="Select(indices, length-1, EQ)"),
        Rule("duplicate", "lexical", "attends to an earlier copy of the current token", _duplicate,
             select="Select(tokens, tokens, EQ) & Select(indices, indices, LT)"),
        Rule("induction", "lexical", "attends to the token after an earlier copy of the current one (induction)",
             _induction),
        Rule("punctuation", "lexical", "attends to the nearest earlier punctuation", _punctuation),
        Rule("final mark", "lexical", "attends to its sentence's final mark", _final_mark),
        Rule("sentence start", "lexical", "attends to the start of its sentence", _sentence_start),
        Rule("dependency head", "syntactic", "attends from a word to the word it depends on (its head in the parse)",
             lambda r: r.word_keys(lambda w: [w.head.i] if w.head.i != w.i else [])),
        *(Rule(f"dependents: {rel}", "syntactic", f"attends from a word to {said} ({rel})", _dependents(rel))
          for rel, said in DEPENDENCIES.items()),
        Rule("root verb", "syntactic", "attends to its sentence's root verb",
             lambda r: r.word_keys(lambda w: [r.sentence(w.i)[1].i])),
        *(Rule(f"focus: {f}", "focus", f"attends to the {FOCUS_NAMES[f]} words", _focus(f)) for f in FOCI),
        *_prose_rules(),
    ]
    return {rule.name: rule for rule in rules}


RULES: dict[str, Rule] = _rules()


# --- RASP's comparisons: a Select of the tokens or the positions, as a compiled program's head reads them ---------

COMPARED = {"EQ": ("==", "equal to"), "LT": ("<", "less than"), "LEQ": ("<=", "at most"),
            "GT": (">", "greater than"), "GEQ": (">=", "at least"), "NEQ": ("!=", "other than")}
OVER = {"tokens": "token", "indices": "position"}


def _value(piece: str):
    """A token's value as a RASP program compares it: a number where it reads as one, else its text."""
    for kind in (int, float):
        try:
            return kind(piece)
        except ValueError:
            pass
    return piece


def _compare(over: str, comparison: str) -> Callable[[Reading], Keys]:
    """Tracr's ``Select(over, over, comparison)``: for each query, the keys whose value compares with the query's
    as ``comparison(key, query)`` says; special tokens (the BOS) neither query nor are named."""
    test = {"EQ": operator.eq, "LT": operator.lt, "LEQ": operator.le, "GT": operator.gt, "GEQ": operator.ge,
            "NEQ": operator.ne, "TRUE": lambda k, q: True}[comparison]

    def holds(k, q) -> bool:
        try:
            return bool(test(k, q))
        except TypeError:  # a number against a text: never
            return False

    def predict(r: Reading) -> Keys:
        values = list(range(len(r))) if over == "indices" else [_value(p) for p in r.pieces]
        content = [k for k in range(len(r)) if not r.special[k]]
        return [[] if r.special[q] else [k for k in content if holds(values[k], values[q])] for q in range(len(r))]
    return predict


def _content_values(r: Reading) -> tuple[list[int], list]:
    """The positions that are not special (the BOS set aside) and their tokens' values, in order."""
    at = [k for k in range(len(r)) if not r.special[k]]
    return at, [_value(r.pieces[k]) for k in at]


def _mirror(r: Reading) -> Keys:
    """RASP's ``Select(indices, length - indices - 1, EQ)``: the position as far from the end as the query is from
    the start (a reverse's)."""
    at, _ = _content_values(r)
    out: Keys = [[] for _ in range(len(r))]
    for j, q in enumerate(at):
        out[q] = [at[len(at) - 1 - j]]
    return out


SORTED_BY = {  # what a sort compares of content token i (values: the content tokens' values)
    "token": lambda values, i: values[i],
    "token, then position": lambda values, i: (values[i], i),
    "count, then position": lambda values, i: (-values.count(values[i]), i),  # most often first
}


def _sort_keys(by: str, r: Reading) -> tuple[list[int], list] | None:
    at, values = _content_values(r)
    try:
        keys = [SORTED_BY[by](values, i) for i in range(len(values))]
        sorted(keys)
    except TypeError:  # a number against a text: no order
        return None
    return at, keys


def _in_sort(by: str, pick: Callable[[list], Callable[[int], list[int]]]) -> Callable[[Reading], Keys]:
    """A rule over a sort by ``by`` (``SORTED_BY``): for the query at content index ``j``, the content keys
    ``pick(keys)(j)`` names (``keys``: what the sort compares of each content token); none where there is no order."""
    def predict(r: Reading) -> Keys:
        out: Keys = [[] for _ in range(len(r))]
        found = _sort_keys(by, r)
        if found is None:
            return out
        at, keys = found
        named = pick(keys)
        for j, q in enumerate(at):
            out[q] = [at[i] for i in named(j)]
        return out
    return predict


def _rank(by: str) -> Callable[[Reading], Keys]:
    """RASP's ``Select(rank, indices, EQ)``, ``rank = SelectorWidth(Select(key, key, LT))`` with ``key`` what a sort
    compares (``SORTED_BY``): the keys with as many smaller ones as the query has positions before it (a sort's)."""
    def pick(keys: list) -> Callable[[int], list[int]]:
        ranks = [sum(other < mine for other in keys) for mine in keys]
        return lambda j: [i for i, rank in enumerate(ranks) if rank == j]
    return _in_sort(by, pick)


def _before_in_sort(by: str) -> Callable[[Reading], Keys]:
    """RASP's ``Select(key, key, LT)``: the keys a sort by ``key`` (``SORTED_BY``) puts before the query."""
    return _in_sort(by, lambda keys: lambda j: [i for i, other in enumerate(keys) if other < keys[j]])


def _comparisons() -> dict[str, Rule]:
    rules = [Rule(f"Select({over}, {over}, {op})", "comparison",
                  f"attends to the keys whose {word} is {said} its own (RASP's Select({over}, {over}, {op}))",
                  _compare(over, op), select=f"Select({over}, {over}, {op})")
             for over, word in OVER.items() for op, (_, said) in COMPARED.items()
             if (over, op) != ("indices", "EQ")]  # "itself"
    rules.append(Rule("Select(indices, indices, TRUE)", "comparison",
                      "attends to every key evenly (RASP's Select(indices, indices, TRUE))",
                      _compare("indices", "TRUE"), select="Select(indices, indices, TRUE)"))
    rules += [Rule("mirror", "comparison", "attends to the position as far from the end as it is from the start",
                   _mirror, select="Select(indices, length-indices-1, EQ)"),
              Rule("rank", "comparison", "attends to the keys with as many smaller tokens as it has positions "
                   "before it (a sort's)", _rank("token"), select="Select(rank, indices, EQ)"),
              Rule("stable rank", "comparison", "attends to the key with as many smaller tokens, ties broken by "
                   "position, as it has positions before it (a stable sort's)", _rank("token, then position"),
                   select="Select(stable_rank, indices, EQ)"),
              Rule("more frequent", "comparison", "attends to the tokens that occur more often than its own, or as "
                   "often and earlier (a sort by frequency's)", _before_in_sort("count, then position"),
                   select="Select(frequency_key, frequency_key, LT)"),
              Rule("frequency rank", "comparison", "attends to the key with as many tokens more frequent than its "
                   "own (ties broken by position) as it has positions before it (a sort by frequency's)",
                   _rank("count, then position"), select="Select(frequency_rank, indices, EQ)")]
    return {rule.name: rule for rule in rules}


COMPARISONS: dict[str, Rule] = _comparisons()
KNOWN: dict[str, Rule] = {**RULES, **COMPARISONS}  # every rule a name finds


def compiled_rules() -> list[Rule]:
    """The rules a compiled program's heads are explained by: the positional rules, an earlier copy (two Selects
    joined: the same token, an earlier position) and RASP's comparisons of the tokens and the positions (its tokens
    are no English, which the other lexical rules and the syntactic ones read)."""
    return [r for r in RULES.values() if r.family == "positional" or r.name == "duplicate"] + list(COMPARISONS.values())


def rule_named(name: str) -> Rule:
    """The rule ``name`` names: one of ``RULES`` or ``COMPARISONS``, or two or three of them joined by " or "
    ("previous token or first token", a program's rules)."""
    if name in KNOWN:
        return KNOWN[name]
    parts = name.split(UNION)
    if 2 <= len(parts) <= 3 and all(p in KNOWN for p in parts):
        return functools.reduce(union, (KNOWN[p] for p in parts))
    unknown = [p for p in parts if p not in KNOWN] or [name]
    raise HeadLensError(f"There is no rule named {unknown[0]!r}. Rules: {', '.join(RULES)}; or two or three of them "
                        f"joined by {UNION.strip()!r}.")
