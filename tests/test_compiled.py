"""Transformers compiled from RASP programs by Tracr (``models.compiled``), run on our engine: their outputs are
Tracr's own ``apply`` on random inputs, their attention the softmax of Tracr's ``attn_logits``, and the ground truth
is what the compiler placed (``make_length``'s worked out by hand)."""
import random

import numpy as np
import pandas as pd
import pytest

from models import HeadLensError, load_model
from models.compiled import BOS, BUILT_IN, PAD, compile_rasp, compiled, ground_truth, write_assembled
from models.compiled_truth import assembled

INPUTS = 12  # random inputs per program, of every length up to its longest


def _tracr_and_ours(name: str, folder):
    """Tracr's compiled model of the built-in ``name`` and ours, written from the same compilation."""
    p = BUILT_IN[name]
    tracr, truth = assembled(p.make(), p.vocab, p.max_seq_len, p.causal, BOS, PAD)
    write_assembled(tracr, truth, p.max_seq_len, p.causal, name, folder)
    return p, tracr, load_model(folder, backend="scratch", device="cpu")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(name)`` -> ``_tracr_and_ours(name)``, compiled once for this module's tests (5 to 10 s each)."""
    done = {}

    def make(name: str):
        if name not in done:
            done[name] = _tracr_and_ours(name, tmp_path_factory.mktemp("compiled") / name)
        return done[name]

    return make


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _check(p, tracr, ours):
    rng = random.Random(p.name)
    for k in range(INPUTS):
        seq = [rng.choice(p.vocab) for _ in range(1 + k % p.max_seq_len)]
        text = " ".join(map(str, seq))
        want = tracr.apply([BOS, *seq])
        got = ours.apply(text)
        if ours.config.numerical:
            assert got[0] == BOS and np.allclose(got[1:], want.decoded[1:], atol=1e-5), (text, got, want.decoded)
        else:
            assert got == list(want.decoded), text
        att = ours.attend(text)
        assert att.tokens == [BOS, *map(str, seq)] and att.special.tolist() == [True] + [False] * len(seq)
        assert att.causal == p.causal
        for layer, logits in enumerate(want.attn_logits):
            expected = _softmax(np.asarray(logits, dtype=np.float64)[0])                  # (heads, n, n)
            np.testing.assert_allclose(att.weights[layer], expected, atol=1e-6, err_msg=f"{text} L{layer}")


FAST = ["length", "previous_token"]


@pytest.mark.parametrize("name", FAST)
def test_a_compiled_programs_outputs_and_attention_are_tracrs(name, built):
    _check(*built(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in BUILT_IN if n not in FAST])
def test_every_built_in_programs_outputs_and_attention_are_tracrs(name, built):
    _check(*built(name))


def _explained(name, built):
    """Every head of a built-in program whose Select compares the tokens or the positions, or a value a rule
    composes from them (a sort's rank, a sort by frequency's, a reverse's mirror position, the previous position, the
    last), is explained on held-out random inputs with the right comparison, held-out score and IoU with Tracr's own
    evaluation of its Select >= 0.95, and every head the compiler placed a Select in has a row."""
    from analysis.compiled import explanation_scores

    _, _, model = built(name)
    truth = ground_truth(model)
    found = explanation_scores(model, truth, n=120).set_index("block")
    assert set(found.index) == {b for b, h in zip(truth.blocks["block"], truth.blocks["head"]) if h is not pd.NA}
    assert found["right"].all() and (found["score"] >= 0.95).all() and (found["iou_select"] >= 0.95).all(), found
    return found


def test_explanations_name_each_compiled_heads_select(built):
    found = _explained("sort_unique", built)
    assert found.loc["L0 H0", "named"] == "Select(tokens, tokens, LT)"  # SelectorWidth: how many tokens are smaller
    assert found.loc["L1 H0", "named"] == "rank"  # the token with as many smaller ones as the query's position
    found = _explained("previous_token", built)
    assert found.loc["L1 H0", "named"] == "previous token"


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in BUILT_IN if n not in ("sort_unique", "previous_token")])
def test_explanations_name_every_built_in_programs_selects(name, built):
    _explained(name, built)


def test_raspss_comparisons_name_the_keys_tracrs_own_select_names():
    """Each comparison rule's keys are what Tracr's RASP evaluator selects, on tokens and on positions, and the
    composed ones' (the mirror position, a sort's rank) what their RASP selects (the BOS neither queries nor is
    named); "3 1 5 2" with LT and "3 1 3 2" worked out by hand."""
    from tracr.rasp import rasp

    from analysis.roles.rules import COMPARISONS, Reading

    def reading(values):
        words = [str(v) for v in values]
        offsets, at = [(0, 0)], 0
        for w in words:
            offsets.append((at, at + len(w)))
            at += len(w) + 1
        return Reading(" ".join(words), ["BOS", *words], offsets, np.array([True] + [False] * len(words)), False)

    lt = COMPARISONS["Select(tokens, tokens, LT)"].keys_of(reading([3, 1, 5, 2]))
    assert lt == [[], [2, 4], [], [1, 2, 4], [2]]  # 3 sees 1 and 2; 1 none; 5 all three others; 2 sees 1
    # "3 1 3 2": the mirror of each position; the ranks (smaller tokens) 2 0 2 1, stable (ties by position) 2 0 3 1
    assert COMPARISONS["mirror"].keys_of(reading([3, 1, 3, 2])) == [[], [4], [3], [2], [1]]
    assert COMPARISONS["rank"].keys_of(reading([3, 1, 3, 2])) == [[], [2], [4], [1, 3], []]
    assert COMPARISONS["stable rank"].keys_of(reading([3, 1, 3, 2])) == [[], [2], [4], [1], [3]]
    # by count (2 1 2 1), most often first, ties by position: positions 1, 3, 2, 4
    assert COMPARISONS["more frequent"].keys_of(reading([3, 1, 3, 2])) == [[], [], [1, 3], [1], [1, 2, 3]]
    assert COMPARISONS["frequency rank"].keys_of(reading([3, 1, 3, 2])) == [[], [1], [3], [2], [4]]
    length = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.TRUE))
    opposite = rasp.SequenceMap(lambda n, i: n - i - 1, length, rasp.indices)
    pair = rasp.SequenceMap(lambda t, i: (t, i), rasp.tokens, rasp.indices)
    count = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.EQ))
    by_count = rasp.SequenceMap(lambda c, i: (-c, i), count, rasp.indices)
    composed = {"mirror": rasp.Select(rasp.indices, opposite, rasp.Comparison.EQ),
                "more frequent": rasp.Select(by_count, by_count, rasp.Comparison.LT),
                "frequency rank": rasp.Select(rasp.SelectorWidth(rasp.Select(by_count, by_count, rasp.Comparison.LT)),
                                              rasp.indices, rasp.Comparison.EQ),
                "rank": rasp.Select(rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.LT)),
                                    rasp.indices, rasp.Comparison.EQ),
                "stable rank": rasp.Select(rasp.SelectorWidth(rasp.Select(pair, pair, rasp.Comparison.LT)),
                                           rasp.indices, rasp.Comparison.EQ)}
    rng = random.Random(0)
    for rule in COMPARISONS.values():
        if rule.name in composed:
            select = composed[rule.name]
        else:
            over = rasp.tokens if "tokens" in rule.name else rasp.indices
            select = rasp.Select(over, over, rasp.Comparison[rule.name.rsplit(", ", 1)[1].rstrip(")")])
        for _ in range(5):
            values = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 6))]
            want = [[k + 1 for k, on in enumerate(row) if on] for row in rasp.evaluate(select, values)]
            assert rule.keys_of(reading(values)) == [[], *want], (rule.name, values)


def test_make_lengths_ground_truth_by_hand(built):
    """``make_length``: ``SelectorWidth(Select(tokens, tokens, TRUE))``. Tracr puts its attention in L0 H0 (every
    query to every key, the BOS among them, reading the BOS's value), and its count in L0's feed-forward, which the
    output reads: five edges."""
    _, _, model = built("length")
    truth = ground_truth(model)
    assert (truth.output["label"], truth.output["numerical"]) == ("length", False)
    rows = truth.blocks.to_dict("records")
    assert [(r["block"], r["layer"], r["head"], r["expression"]) for r in rows] == [
        ("L0 H0", 0, 0, "SelectorWidth"), ("L0 MLP", 0, None, "SelectorWidth")]
    assert rows[0]["says"] == "SelectorWidth(Select(tokens, tokens, TRUE))" and rows[0]["comparisons"] == ["TRUE"]
    assert rows[0]["keys"] == rows[0]["queries"] == ["tokens"]
    edges = set(truth.edges.itertuples(index=False, name=None))
    assert edges == {("embed", "L0 H0", "q"), ("embed", "L0 H0", "k"), ("embed", "L0 H0", "v"),
                     ("L0 H0", "L0 MLP", "mlp"), ("L0 MLP", "output", "output")}
    assert truth.head(0, 0)["label"] == "length" and truth.head(0, 1) is None
    # every token's query gives the BOS and each token alike, 1 / (n + 1) each; the BOS's own query reads itself
    w = model.attend("1 2 3").weights[0, 0]
    np.testing.assert_allclose(w, [[1, 0, 0, 0], *[[0.25] * 4] * 3], atol=1e-6)


def test_the_previous_token_programs_head_is_its_select(built):
    """A Select of ``indices`` against ``indices - 1`` with EQ, compiled causal: L0's feed-forward computes
    ``indices - 1`` and L1 H0 reads each query's previous token (the first token, with nothing before it, the BOS);
    the truth names both and the comparison."""
    _, _, model = built("previous_token")
    w = model.attend("3 1 2 2").weights[1, 0]
    assert w[1:].argmax(-1).tolist() == [0, 1, 2, 3] and (w[np.arange(1, 5), np.arange(4)] > 0.99).all()
    truth = ground_truth(model)
    head = truth.head(1, 0)
    assert head["select"] == "Select(indices, before, EQ)" and head["reads"] == "tokens"
    assert truth.blocks.set_index("block").loc["L0 MLP", "says"] == "Map(indices)"
    assert ("L0 MLP", "L1 H0", "q") in set(truth.edges.itertuples(index=False, name=None))
    assert model.apply("3 1 2 2")[2:] == [3, 1, 2]


def test_a_built_in_program_compiles_once_into_the_cache_and_reads_only_its_tokens(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path))
    model = compiled("length", device="cpu")
    folders = [f for f in (tmp_path / "compiled").glob("length-*") if f.is_dir()]
    assert len(folders) == 1 and (folders[0] / "model.safetensors").is_file()
    stamp = (folders[0] / "model.safetensors").stat().st_mtime_ns
    again = compiled("length", device="cpu")  # read from the cache, not compiled again
    assert (folders[0] / "model.safetensors").stat().st_mtime_ns == stamp and again.apply("1 1") == [BOS, 2, 2]
    assert model.program == {"name": "length", "vocab": [1, 2, 3], "max_seq_len": 5, "causal": False,
                             "numerical": False}
    with pytest.raises(HeadLensError, match=r"'4' is not a token of this compiled program: it reads 1, 2, 3"):
        model.attend("1 4")
    with pytest.raises(HeadLensError, match="reads at most 5 tokens; the text has 6"):
        model.attend("1 2 3 1 2 3")
    with pytest.raises(HeadLensError, match="No built-in program named 'sorted': choose one of length, reverse"):
        compiled("sorted")


def test_a_program_of_ones_own_compiles_and_any_other_model_has_no_ground_truth(tmp_path, hf_model):
    from tracr.rasp import rasp

    double = rasp.numerical(rasp.Map(lambda x: 2 * x, rasp.numerical(rasp.Map(lambda t: t, rasp.tokens)))).named("double")
    model = compile_rasp(double, vocab={0, 1, 2}, max_seq_len=3, folder=tmp_path / "double", device="cpu")
    assert model.apply("2 0 1") == [BOS, 4.0, 0.0, 2.0] or np.allclose(model.apply("2 0 1")[1:], [4, 0, 2], atol=1e-5)
    assert (ground_truth(model).output["label"], ground_truth(model).output["numerical"]) == ("double", True)
    with pytest.raises(HeadLensError, match="is not a compiled program: its heads' jobs are not known"):
        ground_truth(hf_model)


def test_the_edge_auroc_is_the_chance_a_true_edge_scores_above_a_false_one():
    from analysis.compiled import auroc

    assert auroc(np.array([3.0, 1.0, 2.0, 0.0]), np.array([True, False, True, False])) == 1.0
    assert auroc(np.array([1.0, 1.0, 0.0]), np.array([True, False, False])) == 0.75  # a tie counts half
    assert auroc(np.array([0.0, 2.0, 1.0]), np.array([True, False, False])) == 0.0
    assert np.isnan(auroc(np.array([1.0]), np.array([True])))


@pytest.fixture(scope="module")
def sort_unique(built):
    return built("sort_unique")[2]


def test_the_one_token_task_changes_one_token_and_the_output_at_the_last_position(sort_unique):
    from analysis.tasks.build import make_task

    task = make_task(sort_unique, "one_token", n=6)
    assert len(task) == 6 and task.metric == "output_diff"
    for p in task.pairs:
        clean, corrupted = p.clean.split(), p.corrupted.split()
        assert len(clean) == len(corrupted) == 5 and sum(a != b for a, b in zip(clean, corrupted)) == 1
        assert p.clean_ids == tuple(sort_unique.tokenize(p.clean)["input_ids"])
        # the answer is the clean input's sorted output at its last position (sort_unique: its largest token,
        # where every token is distinct), the distractor the corrupted one's
        values = sort_unique.config.outputs
        assert values[p.answer] == sort_unique.apply(p.clean)[-1] and values[p.distractor] == \
            sort_unique.apply(p.corrupted)[-1] and p.answer != p.distractor
        if len(set(clean)) == 5:
            assert values[p.answer] == max(map(int, clean))


def test_circuits_and_patching_find_sort_uniques_compiled_edges(sort_unique):
    """sort_unique: L0 H0 and L0's feed-forward count the smaller tokens (each token's target position), L1 H0 reads
    the token whose target is its query's position. Of its eight true edges a one-token change moves six: not the
    BOS's value L0 H0 reads (it counts against it) nor the positions L1 H0 queries with. Exact edge patching ranks the
    six above every false edge, and patching L1 H0 alone recovers the whole difference."""
    from analysis.compiled import edge_auroc, head_recovery, moved, patched_together, true_edges
    from analysis.circuits import graph_of
    from analysis.tasks.build import make_task
    from models.run import stack_of

    task, truth = make_task(sort_unique, "one_token", n=8), ground_truth(sort_unique)
    graph = graph_of(stack_of(sort_unique, "A circuit"))
    named = lambda mask: {(graph.sender_name(s), graph.receiver_name(r)) for s, r in np.argwhere(mask)}  # noqa: E731
    truly = true_edges(graph, truth)
    assert named(truly) == {("input", "L0 H0.q"), ("input", "L0 H0.k"), ("input", "L0 H0.v"), ("L0 H0", "MLP 0"),
                            ("input", "L1 H0.q"), ("input", "L1 H0.v"), ("MLP 0", "L1 H0.k"), ("L1 H0", "output")}
    assert named(truly & ~moved(sort_unique, task, graph)) == {("input", "L0 H0.v"), ("input", "L1 H0.q")}
    exact = edge_auroc(sort_unique, task, truth, methods=("exact",)).iloc[0]
    assert exact["auroc_moved"] == 1.0 and exact["holds_every_moved"] and exact["moved"] == 6
    heads = head_recovery(sort_unique, task, truth).set_index(["layer", "head"])
    assert heads.loc[(1, 0), "recovered"] == pytest.approx(1.0, abs=1e-6) and heads["on_path"].all()
    # both heads together recover every pair's whole difference; L0 H0 alone, what each pair's change of the
    # smaller tokens' count leaves L1 H0 to read (some pairs' change is in a token L1 H0 reads directly)
    assert patched_together(sort_unique, task, [(0, 0), (1, 0)]) == pytest.approx(np.ones(len(task)), abs=1e-6)
    alone = patched_together(sort_unique, task, [(0, 0)])
    assert heads.loc[(0, 0), "recovered"] == pytest.approx(alone.mean(), abs=1e-6)


def test_a_select_with_true_is_moved_by_no_token_and_a_numerical_pair_goes_up(built):
    """length's L0 H0 is SelectorWidth(Select(tokens, tokens, TRUE)): changing one token changes what its query and
    key projections read, but not one score (TRUE scores every token alike), and its values read the BOS alone:
    no edge into it moves. frac_prevs' pairs each give the clean input the larger value."""
    from analysis.circuits import graph_of
    from analysis.compiled import moved
    from analysis.tasks.build import make_task
    from analysis.tasks.pairs import Task, TaskPair
    from models.run import stack_of

    model = built("length")[2]
    ids = [tuple(model.tokenize(t)["input_ids"]) for t in ("1 2 3", "1 3 3")]
    task = Task("t", "t", (TaskPair("1 2 3", "1 3 3", *ids, 0, 0, ()),), "output_diff")
    graph = graph_of(stack_of(model, "A circuit"))
    out = moved(model, task, graph)
    names = {(graph.sender_name(s), graph.receiver_name(r)) for s, r in np.argwhere(out)}
    assert ("input", "L0 H0.q") not in names and ("input", "L0 H0.k") not in names
    assert not names  # nor into the feed-forward, which reads the head's count alone
    model = built("frac_prevs")[2]
    fracs = make_task(model, "one_token", n=8)
    for p in fracs.pairs:
        assert model.apply(p.clean)[-1] > model.apply(p.corrupted)[-1], (p.clean, p.corrupted)


def test_head_roles_and_the_detectors_score_name_the_compiled_previous_token_head(built):
    """The previous-token program's L1 H0 (``Select(indices, indices - 1, EQ)``, compiled causal), read on 40 random
    inputs of its tokens: Head roles labels it "previous token" and the detector's previous-token score is 1 there;
    L0 H0, a head the compiler left empty (its feed-forward computes ``indices - 1``), is neither."""
    from analysis.roles.detector import text_scores
    from analysis.roles.measure import measure_heads

    _, _, model = built("previous_token")
    rng = random.Random(0)
    texts = [" ".join(rng.choice("123") for _ in range(rng.randint(2, 5))) for _ in range(40)]
    attentions = model.attend(texts)
    labels = measure_heads(attentions).frame().set_index(["layer", "head"])["label"]
    assert labels[(1, 0)] == "previous token" and labels[(0, 0)] != "previous token"
    previous = np.nanmean([text_scores(a)[0] for a in attentions], axis=0)              # (layers, heads)
    assert previous[1, 0] > 0.99 and previous[0, 0] < 0.5
    assert ground_truth(model).head(0, 0) is None and ground_truth(model).head(1, 0)["comparisons"] == ["EQ"]
