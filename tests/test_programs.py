"""A head's program chosen greedily (``analysis.explanations.programs.Gram.programs``), on sums built by hand: parts
whose rows are disjoint blocks of keys, and a head's row an exact mixture of some of them, so that the weights the
fit must find are the mixture's own."""
import numpy as np
import pytest

from analysis.explanations.programs import MAX_RULES, MIN_GAIN, MIN_SHARE, Gram

KEYS = 40  # the flattened (query, key) cells every part spreads over


def _parts(rules: int) -> np.ndarray:
    """``(rules + 1, KEYS)``: each rule's part, the uniform row on its own block of ``KEYS // rules`` cells, then the
    fallback's, every cell evenly."""
    F = np.zeros((rules + 1, KEYS))
    block = KEYS // rules
    for r in range(rules):
        F[r, r * block:(r + 1) * block] = 1.0 / block
    F[-1] = 1.0 / KEYS
    return F


def _mixed(mixtures: list[list[float]], rules: int) -> np.ndarray:
    """One head's row per mixture: its weights on the rules, the fallback's the rest."""
    return np.array([np.append(m, 1 - sum(m)) @ _parts(rules) for m in mixtures])


def _gram(X: np.ndarray, rules: int) -> Gram:
    """The sums a fit of heads whose rows are ``X`` reads, over ``_parts(rules)``, every part naming keys for ten
    queries."""
    F = _parts(rules)
    return Gram(G=F @ F.T, B=X @ F.T, ss=np.einsum("ij,ij->i", X, X), aside=np.zeros((len(X), 2)),
                covered=np.full(rules + 1, 10.0), texts=1)


def _by_hand(F: np.ndarray, x: np.ndarray, chosen: list[int]) -> np.ndarray:
    """The weights of the parts ``chosen`` minimising ``|Σ w F − x|²`` with ``Σ w = 1`` (Lagrange's system; every
    weight comes out positive in these cases, so non-negativity holds)."""
    A = F[chosen]
    k = len(chosen)
    system = np.block([[2 * A @ A.T, np.ones((k, 1))], [np.ones((1, k)), np.zeros((1, 1))]])
    return np.linalg.solve(system, np.append(2 * A @ x, 1.0))[:k]


def test_a_head_mixing_three_rules_gets_all_three_and_their_weights():
    """The greedy fit keeps adding the rule that cuts the error most: a head that is 0.5, 0.3 and 0.2 of three of
    four rules gets exactly those three with those weights, the fourth and the fallback none."""
    assert MAX_RULES == 3
    weights = _gram(_mixed([[0.5, 0.0, 0.3, 0.2]], 4), rules=4).programs(range(4))
    np.testing.assert_allclose(weights[0], [0.5, 0.0, 0.3, 0.2, 0.0], atol=1e-6)


def test_a_head_mixing_four_rules_keeps_the_three_largest():
    """At most three rules: of a 0.1, 0.4, 0.3, 0.2 mixture the smallest is left out and the fallback, every block
    evenly, takes 0.1 of each: the weights the least squares give, worked out below (0.3, 0.2, 0.1 and 0.4)."""
    X = _mixed([[0.1, 0.4, 0.3, 0.2]], 4)
    found = _gram(X, rules=4).programs(range(4))[0]
    assert found[0] == 0 and (found[1:4] > 0).all(), found  # three rules; the fallback spreads the fourth's 0.1
    np.testing.assert_allclose(found[[1, 2, 3, 4]], _by_hand(_parts(4), X[0], [1, 2, 3, 4]), atol=1e-6)


def test_a_rule_that_cuts_too_little_of_the_error_left_does_not_join():
    """After the first rule, one joins only if it cuts at least ``MIN_GAIN`` of the error left: a head that is
    0.98 of one rule and 0.02 of another keeps the first alone."""
    d = np.zeros(KEYS)
    d[10:16], d[16:20] = 1.0, -1.0  # within the second rule's block, nearly orthogonal to it (its sum 2 of 10 cells)
    gram = _gram(_parts(4)[0][None] + 0.05 * d, rules=4)
    _, alone = gram._solve(0, [4, 0])
    _, both = gram._solve(0, [4, 0, 1])
    assert 0 < alone - both < MIN_GAIN * alone  # the second's gain, below the bar
    found = gram.programs(range(4))[0]
    assert found[0] > 0.9 and not found[1:4].any(), found
    np.testing.assert_allclose(found[[4, 0]], gram._solve(0, [4, 0])[0], atol=1e-12)


def test_a_rule_that_gives_too_little_of_the_rows_goes_and_the_rest_are_refitted():
    """A rule that joined but gives under ``MIN_SHARE`` of what the rules give (its weight times the queries it
    names keys for) is dropped: with the second rule's coverage a hundredth of the others', its 0.2 counts for
    little, and the other two are fitted again without it."""
    gram = _gram(_mixed([[0.5, 0.2, 0.3, 0.0]], 4), rules=4)
    gram.covered = np.array([10.0, 0.1, 10.0, 10.0, 10.0])
    assert 0.2 * 0.1 < MIN_SHARE * (0.5 * 10 + 0.2 * 0.1 + 0.3 * 10)
    found = gram.programs(range(4))[0]
    want, _ = gram._solve(0, [4, 0, 2])
    assert found[1] == 0 and found[3] == 0, found
    np.testing.assert_allclose(found[[4, 0, 2]], want, atol=1e-9)
    assert found[0] > found[2] > 0.2


def test_every_head_gets_its_own_program_and_only_the_candidates():
    """Two heads, two mixtures; a rule outside ``candidates`` is never chosen, its share left to the fit."""
    X = _mixed([[0.6, 0.4, 0.0, 0.0], [0.0, 0.0, 0.7, 0.3]], 4)
    gram = _gram(X, rules=4)
    found = gram.programs(range(4))
    np.testing.assert_allclose(found, [[0.6, 0.4, 0, 0, 0], [0, 0, 0.7, 0.3, 0]], atol=1e-6)
    without = gram.programs([0, 2, 3])[0]
    assert without[1] == 0 and without[2] == without[3] == 0, without  # the blocks it does not touch stay out
    np.testing.assert_allclose(without[[0, 4]], _by_hand(_parts(4), X[0], [0, 4]), atol=1e-6)


def _decoder(tiny):
    from models import load_model

    return load_model(tiny("gpt2"), backend="scratch")


TEXTS = ["the cat sat on the mat and the dog sat too", "a dog ran after the cat in the park today"]


def test_a_text_with_no_query_is_passed_over_and_a_fit_of_none_has_no_sums(tiny):
    """A decoder's one-token text has no query (its first token is set aside): the sums and the readings skip it and
    go on to the texts after it; a fit of such texts alone has no sums at all."""
    from analysis.explanations.programs import evaluate
    from analysis.roles.rules import RULES

    model = _decoder(tiny)
    rules = [RULES["previous token"], RULES["first token"]]
    lone, *texts = model.attend(["the", *TEXTS])
    with_lone, without = Gram.of([lone, *texts], rules), Gram.of(texts, rules)
    for name in ("G", "B", "ss", "aside", "covered"):
        np.testing.assert_array_equal(getattr(with_lone, name), getattr(without, name), err_msg=name)
    assert with_lone.texts == without.texts == 2 and with_lone.causal
    weights = without.programs(range(len(rules)))
    (a,), (b,) = (evaluate(t, rules, [weights], without.aside, 50) for t in ([lone, *texts], texts))
    np.testing.assert_array_equal(a.score, b.score)
    assert a.texts == b.texts == 2
    empty = Gram.of([lone], rules)
    assert (empty.G, empty.B, empty.ss, empty.aside, empty.covered, empty.texts) == (None,) * 5 + (0,)


def test_each_parts_covered_queries_are_counted_by_hand(tiny):
    """``covered``: the queries each part names a content key for. In a decoder the queries are positions 1 … n-1 and
    the content keys 1 … q: the previous token names one for every query but the first (its previous token is the
    first token, set aside), the first token for none, the fallback for all."""
    from analysis.roles.rules import RULES

    model = _decoder(tiny)
    atts = model.attend(TEXTS)
    gram = Gram.of(atts, [RULES["previous token"], RULES["first token"]])
    queries = sum(len(a.tokens) - 1 for a in atts)
    np.testing.assert_array_equal(gram.covered, [queries - len(atts), 0, queries])


def test_a_row_with_nothing_on_the_kept_keys_scales_to_zeros():
    """``_scaled``: each row's weights on the kept keys, scaled to sum to 1; a row with nothing there is zeros, not
    0/0."""
    import warnings

    from analysis.explanations.programs import _scaled

    X = np.array([[0.2, 0.3, 0.5], [0.6, 0.0, 0.4], [1.0, 0.0, 0.0]])
    keep = np.array([[True, True, False], [False, True, False], [False, True, True]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = _scaled(X, keep)
    np.testing.assert_allclose(out, [[0.4, 0.6, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_a_program_in_words_names_its_parts_by_their_shares():
    """``in_words``: the parts of at least 0.01, largest first, joined with commas and a last "and"; none at all:
    "attends evenly"."""
    from analysis.explanations.programs import in_words
    from analysis.roles.rules import RULES

    rules = [RULES["previous token"], RULES["itself"]]
    shares = np.array([0.62, 0.20, 0.03, 0.15, 0.0])  # the rules, the fallback, the first token, the other special
    assert in_words(rules, shares, causal=True) == ("attends to the previous token (0.62), itself (0.20), the first "
                                                    "token (0.15) and the rest evenly (0.03)")
    assert in_words(rules, np.array([0.0, 0.0, 0.005, 0.995, 0.0]), causal=False) == "attends to [CLS] (0.99)"
    assert in_words(rules, np.full(5, 0.001), causal=True) == "attends evenly"


def test_a_program_read_beside_another_gives_the_iou_it_gives_alone(tiny):
    """``evaluate`` reads the programs after the first for their IoU alone: each the IoU the same program gets read
    first on the same texts (its readings beside that IoU are not numbers)."""
    from analysis.explanations.programs import evaluate
    from analysis.roles.rules import RULES

    model = _decoder(tiny)
    rules = [RULES["previous token"], RULES["first token"], RULES["itself"]]
    atts = model.attend(TEXTS)
    gram = Gram.of(atts, rules)
    every, positional = gram.programs(range(3)), gram.programs([0, 2])
    first, second = evaluate(atts, rules, [every, positional], gram.aside, 50)
    (alone,) = evaluate(atts, rules, [positional], gram.aside, 50)
    np.testing.assert_allclose(second.iou, alone.iou, rtol=1e-12)
    assert np.isfinite(second.iou).all() and np.isnan(second.score).all() and np.isfinite(first.score).all()


def test_what_a_rule_attends_to_is_its_sentence_after_the_first_to():
    """``said``: what a rule's sentence says it attends to, the sentence cut at its first " to " (a conjunction's
    sentence has a second one) or past its leading "to"."""
    from analysis.explanations.programs import said
    from analysis.roles.rules import RULES

    assert said(RULES["dependents: conj"]) == "the word it is joined to by a conjunction (conj)"
    assert said(RULES["previous token"]) == "the previous token"
