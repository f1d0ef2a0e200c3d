"""RASP typed as text (Weiss et al. 2021's notation, as Tracr names it), parsed by a grammar and built into Tracr's
RASP objects: nothing a user types is run as Python.

    smaller = select(tokens, tokens, <)
    target = selector_width(smaller)
    sort = aggregate(select(target, indices, ==), tokens)

One assignment per line; the last is the program's output. ``tokens``, ``indices`` and ``length`` are given.
``select(keys, queries, comparison)`` with ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` or ``true``;
``aggregate(selector, values)``, ``selector_width(selector)``; ``map(f, values)`` and ``sequence_map(f, a, b)``,
where ``f`` is an expression of ``x`` (and ``y``) from a fixed list of operators (``+ - * / // %``, comparisons,
``and``/``or``/``not``, ``a if c else b``, ``min``, ``max``, ``abs``), numbers and quoted strings;
``numerical(...)`` and ``categorical(...)`` set an expression's encoding. A text that does not parse, a name not
defined above, or a program too large to compile gets a sentence naming the line and column.
"""
from __future__ import annotations

import hashlib
import json
import operator
from dataclasses import dataclass
from functools import cache

from .errors import HeadLensError

MAX_LINES = 30  # assignments in a program typed in the app
MAX_ATTENTION = 8  # Selects one after another (each is an attention layer) on the longest path
GIVEN = ("tokens", "indices", "length")

GRAMMAR = r"""
start: (assign | _NL)*
assign: NAME "=" sop _NL?

?sop: NAME                                       -> ref
    | "select" "(" sop "," sop "," COMPARISON ")" -> select
    | "aggregate" "(" sop "," sop ")"              -> aggregate
    | "selector_width" "(" sop ")"                 -> selector_width
    | "map" "(" fn "," sop ")"                     -> map
    | "sequence_map" "(" fn "," sop "," sop ")"    -> sequence_map
    | "numerical" "(" sop ")"                      -> numerical
    | "categorical" "(" sop ")"                    -> categorical

COMPARISON: "==" | "!=" | "<=" | ">=" | "<" | ">" | "true" | "TRUE"

?fn: either ("if" either "else" fn)?             -> choose
?either: both ("or" both)*                        -> any_of
?both: negated ("and" negated)*                   -> all_of
?negated: "not" negated                           -> negate
    | compared
?compared: arith (CMP arith)?                     -> compare
?arith: term (ADD term)*                          -> arith
?term: unary (MUL unary)*                         -> arith
?unary: "-" unary                                 -> minus
    | atom
?atom: SIGNED_NUMBER                              -> number
    | ESCAPED_STRING                              -> string
    | FUNC "(" fn ("," fn)* ")"                   -> call
    | NAME                                        -> variable
    | "(" fn ")"

CMP: "==" | "!=" | "<=" | ">=" | "<" | ">"
ADD: "+" | "-"
MUL: "*" | "//" | "/" | "%"
FUNC.2: "min" | "max" | "abs"
COMMENT: /#[^\n]*/
_NL: /(\r?\n[\t ]*)+/

%import common.CNAME -> NAME
%import common.SIGNED_NUMBER
%import common.ESCAPED_STRING
%import common.WS_INLINE
%ignore WS_INLINE
%ignore COMMENT
"""

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
             "//": operator.floordiv, "%": operator.mod, "==": operator.eq, "!=": operator.ne, "<": operator.lt,
             "<=": operator.le, ">": operator.gt, ">=": operator.ge}
FUNCTIONS = {"min": min, "max": max, "abs": abs}
COMPARISONS = {"==": "EQ", "!=": "NEQ", "<": "LT", "<=": "LEQ", ">": "GT", ">=": "GEQ", "true": "TRUE",
               "TRUE": "TRUE"}


@cache
def _parser():
    from lark import Lark

    return Lark(GRAMMAR, parser="lalr", propagate_positions=True)


def _where(node) -> str:
    meta = getattr(node, "meta", None)
    return f"Line {meta.line}, column {meta.column}" if meta is not None and not meta.empty else "The program"


class _Fn:
    """A map's function: the parsed expression of ``x`` (and ``y``), walked on each value (never Python's eval)."""

    def __init__(self, tree, names: tuple[str, ...], text: str):
        self.tree, self.names, self.text = tree, names, text
        self._check(tree)

    def _check(self, node) -> None:
        from lark import Token, Tree

        if isinstance(node, Tree):
            for child in node.children:
                self._check(child)
        elif isinstance(node, Token) and node.type == "NAME" and str(node) not in self.names:
            raise HeadLensError(f"Line {node.line}, column {node.column}: a function here reads "
                                f"{' and '.join(self.names)}, not '{node}'.")

    def __call__(self, *values):
        env = dict(zip(self.names, values))
        try:
            return self._value(self.tree, env)
        except ArithmeticError:
            raise  # Tracr leaves such a value out of what the map can give
        except (TypeError, ValueError) as err:
            shown = ", ".join(f"{n} = {v!r}" for n, v in env.items())
            raise HeadLensError(f"{_where(self.tree)}: {self.text} fails where {shown}: {err}.") from None

    def _value(self, node, env):
        kind, kids = node.data, node.children
        if kind in ("choose", "any_of", "all_of") and len(kids) == 1:  # a level of the grammar with nothing at it
            return self._value(kids[0], env)
        if kind == "number":
            text = str(kids[0])
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "string":
            return json.loads(str(kids[0]))
        if kind == "variable":
            return env[str(kids[0])]
        if kind == "call":
            return FUNCTIONS[str(kids[0])](*(self._value(k, env) for k in kids[1:]))
        if kind == "minus":
            return -self._value(kids[0], env)
        if kind == "negate":
            return not self._value(kids[0], env)
        if kind == "any_of":
            return any(self._value(k, env) for k in kids)
        if kind == "all_of":
            return all(self._value(k, env) for k in kids)
        if kind == "choose":
            return self._value(kids[0], env) if self._value(kids[1], env) else self._value(kids[2], env)
        if kind in ("arith", "compare"):
            out = self._value(kids[0], env)
            for op, right in zip(kids[1::2], kids[2::2]):
                out = OPERATORS[str(op)](out, self._value(right, env))
            return out
        raise HeadLensError(f"{_where(node)}: this expression is not one a function may use.")


@dataclass(frozen=True)
class Typed:
    """A program typed as text: its ``text`` and what it is compiled for (``vocab``, ``max_seq_len``, ``causal``)."""

    text: str
    vocab: tuple
    max_seq_len: int
    causal: bool = False

    @property
    def key(self) -> str:
        """A short hash of everything that makes its compiled weights: the folder it compiles into."""
        raw = json.dumps([self.text.strip(), list(map(str, self.vocab)), self.max_seq_len, self.causal])
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


def read_vocab(text: str) -> tuple:
    """A vocabulary typed as tokens separated by spaces: numbers where every token reads as an integer."""
    words = list(dict.fromkeys(str(text).split()))
    if not words:
        raise HeadLensError("Type the program's tokens, separated by spaces (such as 1 2 3 4 5).")
    try:
        return tuple(int(w) for w in words)
    except ValueError:
        return tuple(words)


def parse_rasp(text: str, vocab=None, max_seq_len: int | None = None):
    """The RASP program ``text`` says (its last assignment), as Tracr's objects; a sentence naming the line and
    column for a text that does not parse or a name not defined above it. ``vocab`` and ``max_seq_len``, where
    given, are checked against the app's bounds."""
    from lark import Tree
    from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
    from tracr.rasp import rasp

    from .compiled import MAX_LENGTH, MAX_VOCAB

    if vocab is not None and not 1 <= len(vocab) <= MAX_VOCAB:
        raise HeadLensError(f"A program compiles here for at most {MAX_VOCAB} tokens; this vocabulary has "
                            f"{len(vocab)}.")
    if max_seq_len is not None and not 1 <= max_seq_len <= MAX_LENGTH:
        raise HeadLensError(f"A program compiles here for inputs of 1 to {MAX_LENGTH} tokens, not {max_seq_len}.")
    source = str(text).replace("\r\n", "\n") + "\n"
    try:
        tree = _parser().parse(source)
    except UnexpectedInput as err:
        where = f"Line {err.line}, column {err.column}"
        line = source.splitlines()[err.line - 1] if 0 < err.line <= len(source.splitlines()) else ""
        if isinstance(err, UnexpectedToken) and err.token.type == "$END":
            said = "the program ends in the middle of an expression"
        elif isinstance(err, (UnexpectedCharacters, UnexpectedToken)):
            got = err.char if isinstance(err, UnexpectedCharacters) else err.token
            said = f"'{got}' is not RASP here" if str(got).strip() else "the line ends in the middle of an expression"
        else:
            said = "this is not RASP"
        raise HeadLensError(f"{where}: {said}: {line.strip()!r}. A line reads name = select(...), "
                            "aggregate(...), selector_width(...), map(...), sequence_map(...), numerical(...) or "
                            "categorical(...).") from None
    lines = [a for a in tree.children if isinstance(a, Tree)]
    if not lines:
        raise HeadLensError("Type a RASP program: one assignment per line, the last the output (such as "
                            "sort = aggregate(select(indices, indices, ==), tokens)).")
    if len(lines) > MAX_LINES:
        raise HeadLensError(f"A program compiles here in at most {MAX_LINES} lines; this one has {len(lines)}.")
    length = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.TRUE)).named("length")
    named = {"tokens": rasp.tokens, "indices": rasp.indices, "length": length}
    depth = {"tokens": 0, "indices": 0, "length": 1}

    def build(node):
        kind, kids = node.data, node.children
        if kind == "ref":
            name = str(kids[0])
            if name not in named:
                raise HeadLensError(f"{_where(node)}: '{name}' is not defined above: define it on an earlier line, "
                                    f"or use {', '.join(GIVEN)}.")
            return named[name], depth[name]
        function = kind in ("map", "sequence_map")  # its first part a function, walked when Tracr calls it
        parts = [build(k) if isinstance(k, Tree) and not (function and i == 0) else None for i, k in enumerate(kids)]

        def sop(i: int, what: str):
            value = parts[i][0]
            if isinstance(value, rasp.Selector):
                raise HeadLensError(f"{_where(kids[i])}: a selector cannot be {what}: aggregate it or take its "
                                    "selector_width.")
            return value

        def selector(i: int):
            value = parts[i][0]
            if not isinstance(value, rasp.Selector):
                raise HeadLensError(f"{_where(kids[i])}: this needs a selector, a select(keys, queries, comparison).")
            return value

        deepest = max((p[1] for p in parts if p is not None), default=0)
        if kind == "select":
            comparison = rasp.Comparison[COMPARISONS[str(kids[2])]]
            return rasp.Select(sop(0, "a select's keys"), sop(1, "a select's queries"), comparison), deepest
        if kind == "aggregate":
            return rasp.Aggregate(selector(0), sop(1, "aggregated")), deepest + 1
        if kind == "selector_width":
            return rasp.SelectorWidth(selector(0)), deepest + 1
        if kind == "map":
            return rasp.Map(_Fn(kids[0], ("x",), _snippet(source, kids[0])), sop(1, "mapped")), deepest
        if kind == "sequence_map":
            f = _Fn(kids[0], ("x", "y"), _snippet(source, kids[0]))
            return rasp.SequenceMap(f, sop(1, "mapped"), sop(2, "mapped")), deepest
        if kind in ("numerical", "categorical"):
            inner = sop(0, f"made {kind}")
            if kind == "numerical" and isinstance(inner, rasp.Aggregate):  # a numerical mean: 0 where none selected
                inner = rasp.Aggregate(inner.selector, inner.sop, default=0)
            return getattr(rasp, kind)(inner), deepest
        raise HeadLensError(f"{_where(node)}: this is not RASP.")

    out = None
    for line in lines:
        name = str(line.children[0])
        if name in GIVEN:
            raise HeadLensError(f"{_where(line)}: '{name}' is given; name this line otherwise.")
        value, steps = build(line.children[1])
        if steps > MAX_ATTENTION:
            raise HeadLensError(f"{_where(line)}: '{name}' needs {steps} attention layers one after another; a "
                                f"program compiles here with at most {MAX_ATTENTION}.")
        named[name], depth[name] = value.named(name), steps
        out = named[name]
    if isinstance(out, rasp.Selector):
        raise HeadLensError(f"{_where(lines[-1])}: the last line is the output, and a selector is none: aggregate "
                            "it or take its selector_width.")
    if out is rasp.tokens or out is rasp.indices:
        raise HeadLensError("The program's output is its input: compute something from it.")
    return out


def _snippet(source: str, node) -> str:
    meta = node.meta
    return source[meta.start_pos:meta.end_pos] if not meta.empty else "this function"


def compile_typed(typed: Typed, *, device: str = "auto"):
    """A program typed as text, parsed and compiled once into HeadLens's cache (by its ``key``) and opened."""
    from filelock import FileLock

    from .compiled import write_compiled
    from .gguf import cache_root
    from .loading import load_model

    program = parse_rasp(typed.text, typed.vocab, typed.max_seq_len)
    folder = cache_root() / "compiled" / f"typed-{typed.key}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not (folder / "model.safetensors").is_file():
            try:
                write_compiled(program, typed.vocab, typed.max_seq_len, typed.causal, "your program", folder)
            except HeadLensError:
                raise
            except Exception as err:  # Tracr's own checks of what it can compile, whatever their kind
                said = (str(err).strip().splitlines() or [type(err).__name__])[-1]
                raise HeadLensError(f"Tracr could not compile this program: {said}") from err
    return load_model(folder, backend="scratch", device=device)
