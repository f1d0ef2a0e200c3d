"""Every task generator under the bundled SmolLM2's and Gemma 3's tokenizers: pairs of equal length, each role on
the token it names, the same pairs from the same seed; and SmolLM2's indirect-object heads over a task."""
import numpy as np
import pytest

from analysis.tasks.effects import run_task, table
from analysis.tasks.build import FACT_TEMPLATES, IOI_TEMPLATES, OBJECTS, PLACES, facts, greater_than, induction, ioi
from models import load_model

pytestmark = pytest.mark.bundled


@pytest.fixture(scope="module", params=["HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-270m"])
def bundled(request):
    return load_model(request.param, backend="scratch")


def _tokens(model, ids):
    return [model.tokenizer.decode([i]) for i in ids]


def _equal_lengths(task):
    assert all(len(p.clean_ids) == len(p.corrupted_ids) == len(p) for p in task.pairs)
    assert all(dict(p.roles)["END"] == len(p) - 1 for p in task.pairs)


def test_ioi_pairs_name_their_roles_in_both_orders_and_every_template(bundled):
    task = ioi(bundled, n=300, seed=3)
    _equal_lengths(task)
    assert task.pairs == ioi(bundled, n=300, seed=3).pairs and task.pairs != ioi(bundled, n=300, seed=4).pairs
    orders = {p.template.split()[0] for p in task.pairs}
    templates = {p.template.split()[1] for p in task.pairs}
    assert orders == {"ABBA", "BABA"} and len(templates) == len(IOI_TEMPLATES) >= 15
    for p in task.pairs:
        r = dict(p.roles)
        clean, corrupted = p.clean_ids, p.corrupted_ids
        assert clean[r["IO"]] == p.answer and clean[r["S1"]] == clean[r["S2"]] == p.distractor
        assert corrupted[r["S2"]] == p.answer  # the subject's second mention flipped to the other name
        assert [i for i, (a, b) in enumerate(zip(clean, corrupted)) if a != b] == [r["S2"]]
        assert (r["IO"] < r["S1"]) == p.template.startswith("ABBA") and r["S1+1"] == r["S1"] + 1
        assert _tokens(bundled, [clean[r["PLACE"]]])[0].strip() in PLACES
        assert _tokens(bundled, [clean[r["OBJECT"]]])[0].strip() in OBJECTS
    abc = ioi(bundled, n=50, seed=0, corruption="abc")
    _equal_lengths(abc)
    for p in abc.pairs:
        r = dict(p.roles)
        names = {p.corrupted_ids[r[k]] for k in ("IO", "S1", "S2")}
        assert len(names) == 3 and not names & {p.answer, p.distractor}


def test_facts_pairs_change_the_subject_alone(bundled):
    task = facts(bundled, n=100, seed=0)
    _equal_lengths(task)
    assert {p.template for p in task.pairs} == {"city", "capital", "language"}
    for p in task.pairs:
        table_, _ = FACT_TEMPLATES[p.template]
        (subject, answer), = [(s, a) for s, a in table_ if f" {s} " in f" {p.clean} "]
        (_, other), = [(s, a) for s, a in table_ if f" {s} " in f" {p.corrupted} "]
        assert _tokens(bundled, [p.answer, p.distractor]) == [f" {answer}", f" {other}"]
        at = dict(p.roles)["SUBJECT"]
        assert subject.endswith(_tokens(bundled, [p.clean_ids[at]])[0].strip())
        differ = [i for i, (a, b) in enumerate(zip(p.clean_ids, p.corrupted_ids)) if a != b]
        assert differ and max(differ) <= at


def test_greater_than_pairs_read_the_tens_digit(bundled):
    task = greater_than(bundled, n=100, seed=0)
    _equal_lengths(task)
    assert task.metric == "greater_than"
    for p in task.pairs:
        yy = _tokens(bundled, [p.clean_ids[dict(p.roles)["YY"]]])[0]
        tens = int(yy)
        assert f"{tens}9 to the year" in p.clean and "01 to the year" in p.corrupted
        assert _tokens(bundled, p.above) == [str(d) for d in range(tens + 1, 10)]
        assert _tokens(bundled, p.below) == [str(d) for d in range(0, tens + 1)]


def test_induction_pairs_repeat_their_words(bundled):
    task = induction(bundled, n=50, seed=0)
    _equal_lengths(task)
    for p in task.pairs:
        first = dict(p.roles)["FIRST"]
        assert p.clean_ids[first] == p.answer and p.corrupted_ids[first] == p.distractor
        words = p.clean.split()
        half = (len(words) + 1) // 2
        assert words[half:] == words[:half - 1]


def test_smollm2s_indirect_object_heads_over_a_task():
    model = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="scratch")
    effects = run_task(model, ioi(model, n=24, seed=0), method="attribution", residual=False)
    assert effects.accuracy >= 0.9
    frame = table(effects).sort_values("mean", ascending=False)
    top = [(int(r.layer), int(r.head)) for r in frame.head(3).itertuples()]
    assert (23, 3) in top and bool(frame.iloc[0]["significant"])
    assert np.all(frame["low"] <= frame["high"])
