"""RASP typed as text (``models.rasp_text``): parsed by a grammar into Tracr's own objects, compiled as Tracr's library
programs are, and nothing typed ever run as Python."""
import builtins
import random

import numpy as np
import pytest

from models import HeadLensError
from models.compiled import BUILT_IN
from models.rasp_text import MAX_ATTENTION, Typed, compile_typed, parse_rasp, read_vocab

SORT_UNIQUE = """
# Tracr's make_sort_unique, typed
smaller = select(tokens, tokens, <)
target_pos = selector_width(smaller)
sort = aggregate(select(target_pos, indices, ==), tokens)
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))


def test_a_typed_program_is_tracrs_library_program():
    """Typed sort_unique evaluates as Tracr's ``make_sort_unique`` on random inputs (Tracr's own evaluator), and its
    compiled model gives Tracr's decoded output."""
    from tracr.rasp import rasp

    typed, library = parse_rasp(SORT_UNIQUE), BUILT_IN["sort_unique"].make()
    rng = random.Random(0)
    inputs = [rng.sample([1, 2, 3, 4, 5], rng.randint(1, 5)) for _ in range(20)]
    for xs in inputs:
        assert rasp.evaluate(typed, xs) == rasp.evaluate(library, xs) == sorted(xs), xs
    model = compile_typed(Typed(SORT_UNIQUE, read_vocab("1 2 3 4 5"), 5), device="cpu")
    for xs in inputs:
        assert model.apply(" ".join(map(str, xs))) == ["BOS", *sorted(xs)]
    assert model.program["name"] == "your program"


def test_maps_read_a_fixed_list_of_operators_on_x_and_y():
    """A map's function is its parsed expression walked on each value: each checked against the Python it says."""
    from tracr.rasp import rasp

    cases = {"x + 1": lambda x: x + 1, "x * 2 - 3": lambda x: x * 2 - 3, "x // 2": lambda x: x // 2,
             "x % 3": lambda x: x % 3, "-x": lambda x: -x, "x / 4": lambda x: x / 4, "abs(x - 3)": lambda x: abs(x - 3),
             "min(x, 2)": lambda x: min(x, 2), "1 if x > 2 else 0": lambda x: 1 if x > 2 else 0,
             "x == 3 or x < 2": lambda x: x == 3 or x < 2, "not x >= 2 and x != 0": lambda x: not x >= 2 and x != 0,
             "(x + 1) * (x - 1)": lambda x: (x + 1) * (x - 1)}
    for text, want in cases.items():
        sop = parse_rasp(f"out = map({text}, tokens)")
        assert isinstance(sop, rasp.Map)
        assert [sop.f(x) for x in range(5)] == [want(x) for x in range(5)], text
    pair = parse_rasp("out = sequence_map(x * 10 + y, tokens, indices)")
    assert rasp.evaluate(pair, [3, 1, 2]) == [30, 11, 22]
    brackets = parse_rasp('out = map(1 if x == "(" else 0, tokens)')
    assert rasp.evaluate(brackets, ["(", ")", "("]) == [1, 0, 1]


def test_text_typed_as_a_program_never_runs_as_python(monkeypatch, tmp_path):
    """Python typed as RASP is refused where it stands, before anything runs: neither eval, exec nor an import
    is called, and nothing compiles."""
    import models.compiled

    called = []
    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, lambda *a, name=name, **k: called.append(name))
    monkeypatch.setattr(models.compiled, "write_compiled", lambda *a, **k: called.append("compiled"))
    marker = tmp_path / "ran"
    attempts = {"__import__('os')": "Line 1, column 11: '(' is not RASP here",
                f"x = __import__('os').system('touch {marker}')": "Line 1, column 15: '(' is not RASP here",
                f"x = map(open('{marker}', 'w'), tokens)": "Line 1, column 13: '(' is not RASP here",
                "x = map(x.__class__, tokens)": "Line 1, column 10: '.' is not RASP here",
                "x = map(y, tokens)": "Line 1, column 9: a function here reads x, not 'y'."}
    for text, said in attempts.items():
        with pytest.raises(HeadLensError) as err:
            compile_typed(Typed(text, (1, 2), 3))
        assert str(err.value).startswith(said), str(err.value)
    assert not called and not marker.exists()


def test_a_program_that_does_not_parse_or_compile_gets_a_sentence_pointing_at_the_place():
    wrong = {
        "a = select(tokens, tokens, <": "Line 1, column 29: the line ends in the middle of an expression",
        "a = map(x + 1, tokens)\nb = aggregate(a, tokens)": "Line 2, column 15: this needs a selector",
        "a = map(x + 1, tokenz)": "Line 1, column 16: 'tokenz' is not defined above: define it on an earlier line, "
                                  "or use tokens, indices, length.",
        "a = select(tokens, indices, <)": "Line 1, column 1: the last line is the output, and a selector is none",
        "indices = map(x, tokens)": "Line 1, column 1: 'indices' is given",
        "a = selector_width(tokens)": "Line 1, column 20: this needs a selector",
        "a = select(tokens, tokens, =>)": "Line 1, column 28: '=' is not RASP here",
        "": "Type a RASP program",
    }
    for text, said in wrong.items():
        with pytest.raises(HeadLensError) as err:
            parse_rasp(text)
        assert str(err.value).startswith(said), (text, str(err.value))
    with pytest.raises(HeadLensError, match="Tracr could not compile this program: a: An aggregate's output encoding must match its input"):
        compile_typed(Typed("m = numerical(map(x, tokens))\na = aggregate(select(indices, indices, <), m)",
                            (1, 2), 3))


def test_compiling_is_bounded_with_a_sentence():
    from models.compiled import MAX_LENGTH, MAX_VOCAB

    with pytest.raises(HeadLensError, match=f"at most {MAX_VOCAB} tokens; this vocabulary has {MAX_VOCAB + 1}"):
        parse_rasp(SORT_UNIQUE, tuple(range(MAX_VOCAB + 1)), 5)
    with pytest.raises(HeadLensError, match=f"inputs of 1 to {MAX_LENGTH} tokens, not {MAX_LENGTH + 1}"):
        parse_rasp(SORT_UNIQUE, (1, 2), MAX_LENGTH + 1)
    chain = [f"a{i} = aggregate(select(indices, indices, ==), "
                                        f"{'tokens' if i == 0 else f'a{i - 1}'})" for i in range(MAX_ATTENTION + 1)]
    parse_rasp("\n".join(chain[:MAX_ATTENTION]))  # the most layers one after another: compiles
    with pytest.raises(HeadLensError, match=f"Line {MAX_ATTENTION + 1}, column 1: 'a{MAX_ATTENTION}' needs "
                                            f"{MAX_ATTENTION + 1} attention layers one after another"):
        parse_rasp("\n".join(chain))


def test_a_vocabulary_is_typed_as_tokens():
    assert read_vocab("3 1 2 1") == (3, 1, 2) and read_vocab("( ) x") == ("(", ")", "x")
    with pytest.raises(HeadLensError, match="Type the program's tokens"):
        read_vocab("  ")
    assert Typed(SORT_UNIQUE, (1, 2), 5).key != Typed(SORT_UNIQUE, (1, 2), 6).key
    assert Typed(SORT_UNIQUE + "\n", (1, 2), 5).key == Typed(SORT_UNIQUE, (1, 2), 5).key
    assert np.unique([Typed(SORT_UNIQUE, (1, 2), 5, c).key for c in (False, True)]).size == 2
