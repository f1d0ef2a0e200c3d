"""Properties that are the truth whatever the input, tried on inputs Hypothesis draws: every rule's keys lie within
the text and, in a causal model, at or before their query; a rule's replacement pattern gives each replaced row a
whole unit of weight; a circuit of every edge is the clean run and of none the corrupted one, and patching the
stream where two prompts differ, at the first layer, recovers the whole difference; an edit that returns what it
was given leaves the run as it was. A tiny random GPT-2 whose tokens are whole words, in float64, and the bundled
MiniLM."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from analysis.circuits import graph as C
from analysis.effects import patch_residual
from analysis.effects.readouts import readout_for
from analysis.explanations.programs import Program
from analysis.roles.rules import RULES, Reading, Rule, rule_named
from models import load_model
from models.run import POINTS, Edits
from tests.conftest import build_words_gpt2

WORDS = ["the", "cat", "dog", "sat", "ran", "on", "mat", "and", "a", "big", "red", "saw", "it", ".", ","]
UNIONS = ["previous token or first token", "induction or itself", "duplicate or punctuation"]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=16).map(" ".join)


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    """The tiny GPT-2 (every word of ``WORDS`` one token, first in a text or after a space), in float64."""
    folder = build_words_gpt2(tmp_path_factory.mktemp("words-gpt2"), [" ".join(WORDS), *WORDS,
                                                                       " ".join(reversed(WORDS))])
    model = load_model(folder, backend="scratch")
    model.stack.double()
    return model


def _keys_are_sound(model, text: str) -> None:
    reading = Reading.read(model, text)
    n = len(reading)
    for name in [*RULES, *UNIONS]:
        keys = rule_named(name).keys(model, text)
        assert len(keys) == n, name
        for q, ks in enumerate(keys):
            assert ks == sorted(set(ks)) and all(0 <= k < n for k in ks), (name, q, ks)
            if reading.causal:
                assert all(k <= q for k in ks), (name, text, q, ks)


@SETTINGS
@given(text=sentences)
def test_every_rules_keys_lie_in_the_text_and_never_after_a_causal_query(words, text):
    assert len(words.tokenizer.tokenize(text)) == len(text.split())  # a token a word
    _keys_are_sound(words, text)


@SETTINGS
@given(text=sentences)
def test_every_rules_keys_lie_in_an_encoders_text(hf_model, text):
    _keys_are_sound(hf_model, text)


@st.composite
def readings(draw):
    """A reading of ``n`` tokens (causal or not, the first and last special in an encoder), a program of a rule
    naming keys drawn among the tokens each query may name (halving with distance or not), and its weights."""
    n = draw(st.integers(1, 12))
    causal = draw(st.booleans())
    special = np.zeros(n, dtype=bool)
    if not causal and n >= 2:
        special[[0, -1]] = True
    keys = [sorted(draw(st.sets(st.integers(0, q if causal else n - 1), max_size=4))) for q in range(n)]
    reading = Reading("x" * n, ["x"] * n, [(i, i + 1) for i in range(n)], special, causal)
    rule = Rule("drawn", "positional", "attends to the drawn keys", lambda r: keys,
                half_life=draw(st.sampled_from([None, 1.0, 4.0])))
    sink, special_share = draw(st.floats(0.0, 1.0)), draw(st.floats(0.0, 1.0))
    special_share *= 1 - sink
    program = Program((rule,), (draw(st.floats(0.0, 1.0)),), draw(st.floats(0.0, 1.0)), sink, special_share)
    return reading, keys, program


@settings(max_examples=200, deadline=None)
@given(drawn=readings())
def test_a_programs_pattern_gives_each_replaced_row_a_whole_unit_of_weight(drawn):
    reading, keys, program = drawn
    pattern, rows = program.pattern(reading)
    assert (pattern >= 0).all()
    np.testing.assert_allclose(pattern[rows].sum(1), 1.0, atol=1e-9)
    assert not pattern[~rows].any()  # rows it does not replace are left to the head
    if reading.causal:
        assert not np.triu(pattern, 1).any() and not rows[0]  # nothing after a query; the first token kept
    for q in np.flatnonzero(rows):
        on = set(np.flatnonzero(pattern[q]))
        sinks = {0} | set(np.flatnonzero(reading.special))
        if program.fallback == 0 and program.weights[0] > 0 and set(keys[q]) - sinks:
            assert on <= set(keys[q]) | sinks  # its rule's keys and the keys set aside, nothing else
        assert pattern[q, 0] >= program.sink - 1e-12


@st.composite
def pairs(draw):
    """A clean prompt of words and a corrupted one with one word changed; two answer words."""
    clean = draw(st.lists(st.sampled_from(WORDS), min_size=2, max_size=12))
    at = draw(st.integers(0, len(clean) - 1))
    other = draw(st.sampled_from([w for w in WORDS if w != clean[at]]))
    answer, distractor = draw(st.lists(st.sampled_from(WORDS[:13]), min_size=2, max_size=2, unique=True))
    return " ".join(clean), " ".join(clean[:at] + [other] + clean[at + 1:]), at, " " + answer, " " + distractor


@SETTINGS
@given(pair=pairs())
def test_every_edge_is_the_clean_run_none_the_corrupted_and_the_changed_token_patched_is_the_whole(words, pair):
    clean, corrupted, at, answer, distractor = pair
    stack, tok = words.stack, words.tokenizer
    ids = [torch.tensor([tok(t)["input_ids"]]) for t in (clean, corrupted)]
    assert ids[0].shape == ids[1].shape
    measure, _, _ = readout_for(words, clean).pair(ids[0][0].tolist(), answer, distractor)
    graph, rows = C.graph_of(stack), torch.zeros(1, dtype=torch.long)
    with torch.inference_mode():
        good, bad = (C.run_ids(stack, graph, i, measure, rows) for i in ids)
        every = C.all_edges(graph).double()
        assert float(C.circuit_values(stack, graph, ids[0], bad, every, measure, rows)) == \
            pytest.approx(float(good.value), abs=1e-12)
        assert float(C.circuit_values(stack, graph, ids[0], bad, every * 0, measure, rows)) == \
            pytest.approx(float(bad.value), abs=1e-12)
    assume(abs(float(good.value - bad.value)) > 1e-6)
    frame = patch_residual(words, clean, corrupted, answer, distractor)
    first = frame.query("layer == 0").set_index("position")["recovered"]
    assert first.loc[at] == pytest.approx(1.0, abs=1e-9)
    assert np.abs(first.drop(at).to_numpy()).max(initial=0.0) < 1e-9  # the tokens both prompts share: nothing


PASSING = ["resid_pre", "attn_in", "z", "mlp_in", "mlp_out", "resid_post"]  # an edit there keeps the path the run takes
BY_HEAD = ["qkv_in", "pattern", "result"]  # an edit there has the attention run head by head, or form its weights


@SETTINGS
@given(text=sentences, point=st.sampled_from(PASSING + BY_HEAD), layer=st.integers(0, 1))
def test_an_edit_that_changes_nothing_leaves_the_run_as_it_was(words, text, point, layer):
    assert set(PASSING + BY_HEAD) <= set(POINTS)
    ids = torch.tensor([words.tokenizer(text)["input_ids"]])
    with torch.inference_mode():
        plain = words.stack(ids)
        edited = words.stack(ids, edits=Edits({(point, layer): lambda value: value}))
    if point in PASSING:  # bit for bit
        assert torch.equal(plain.logits, edited.logits) and torch.equal(plain.last_hidden_state,
                                                                        edited.last_hidden_state)
        assert all(torch.equal(a, b) for a, b in zip(plain.attentions, edited.attentions))
    else:  # another order of the same sums, in float64
        torch.testing.assert_close(edited.logits, plain.logits, atol=1e-12, rtol=0)
        for i, (a, b) in enumerate(zip(plain.attentions, edited.attentions)):
            if i == layer and point != "pattern":  # a layer run head by head forms no weights of all its heads
                assert b is None
            else:
                torch.testing.assert_close(b, a, atol=1e-12, rtol=0)
