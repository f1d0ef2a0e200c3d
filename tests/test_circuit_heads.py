"""What a circuit's heads are: their attention between the indirect-object task's roles against transformers' own
weights, and each head's row (its edges in and out, its patterns, OV scores, detector label and class) worked by
hand from edge scores set by hand on a tiny random Llama's graph."""
import numpy as np
import pandas as pd
import pytest
import torch

from analysis import circuits as AC
from analysis.tasks.pairs import Task, TaskPair
from models import HeadLensError, load_model
from tests import test_llama

ROLES = (("IO", 2), ("S1", 3), ("S1+1", 4), ("S2", 6), ("END", 9))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(ours, transformers') tiny Llama: 2 layers of 4 query heads, each pair of them reading one key/value head."""
    _, folder, hf, _ = test_llama.build("llama", tmp_path_factory.mktemp("circuit-heads"))
    return load_model(folder, backend="scratch"), hf


def _task(n: int = 20) -> Task:
    ids = torch.randint(5, 300, (n, 10), generator=torch.Generator().manual_seed(0)).tolist()
    return Task("roles", "Roles", tuple(TaskPair("", "", tuple(x), tuple(x), 7, 9, ROLES) for x in ids))


def test_role_attention_is_transformers_weight_between_the_roles_over_the_first_prompts(llama, scratch_model):
    ours, hf = llama
    task = _task()
    got = AC.role_attention(ours, task, sample=18)  # a batch of 16 and one of 2
    with torch.inference_mode():
        weights = torch.stack(hf(torch.tensor([p.clean_ids for p in task.pairs[:18]]),
                                 output_attentions=True).attentions, 1).double().numpy()  # (b, L, H, n, n)
    at = dict(ROLES)
    assert set(got) == {"name mover", "S-inhibition", "induction", "duplicate token", "previous token"}
    for name, (a, b) in {"name mover": ("END", "IO"), "S-inhibition": ("END", "S2"), "induction": ("S2", "S1+1"),
                         "duplicate token": ("S2", "S1"), "previous token": ("S1+1", "S1")}.items():
        np.testing.assert_allclose(got[name], weights[:, :, :, at[a], at[b]].mean(0), atol=1e-6)
    assert got["name mover"].shape == (2, 4) and not np.allclose(got["name mover"], got["S-inhibition"])
    lacking = Task("short", "Short", tuple(TaskPair("", "", p.clean_ids, p.clean_ids, 7, 9, (("END", 9), ("S2", 6)))
                                           for p in task.pairs[:2]))
    with pytest.raises(HeadLensError, match="this task lacks IO, S1, S1\\+1\\.$"):
        AC.role_attention(ours, lacking)
    with pytest.raises(HeadLensError, match="^The heads' attention between roles is read on a language model; "):
        AC.role_attention(scratch_model, task)  # MiniLM, an encoder


def _scores(model, task: Task, edges: dict) -> AC.EdgeScores:
    graph = AC.graph_of(model.stack)
    scores = np.zeros((len(graph.senders), len(graph.receivers)))
    for (sender, receiver), value in edges.items():
        scores[graph.senders.index(sender), graph.receivers.index(receiver)] = value
    return AC.EdgeScores(task, "logit_diff", "eap", 1, graph, scores, np.ones(len(task)), np.zeros(len(task)))


def test_a_circuits_heads_are_read_from_its_edges_by_hand(llama):
    ours, _ = llama
    scores = _scores(ours, _task(2), {
        (("head", 1, 2), ("logits", 2, -1)): 4.0,
        (("head", 0, 1), ("q", 1, 2)): 3.0,
        (("input", -1, -1), ("k", 1, 1)): -2.0,  # the key/value head L1 H2 and L1 H3 read, both in
        (("head", 0, 1), ("q", 1, 3)): 1.0,
        (("mlp", 0, -1), ("v", 1, 0)): 0.5,      # read by L1 H0 and L1 H1, neither in the circuit
    })
    attention = {name: np.zeros((2, 4)) for name in AC.PATTERNS}
    attention["name mover"][0, 1] = 0.6
    attention["induction"][0, 1] = 0.2
    attention["induction"][1, 2] = 0.25                     # its strongest pattern, short of the bar
    copying = pd.DataFrame({"layer": [0, 1], "head": [1, 2], "copying": [0.2, 0.9], "suppression": [0.5, 0.1]})
    detector = pd.DataFrame({"layer": [0, 1], "head": [1, 2], "induction_lo": [0.1, 0.0],
                             "duplicate_token_lo": [0.0, 0.0], "previous_token_lo": [0.5, 0.0], "sink_lo": [0.0, 0.2]})
    rows = AC.circuit_heads(scores, 5, attention, copying, detector)
    assert list(rows.columns) == ["head", "layer", "index", "edges_in", "edges_out", "attn END→IO", "attn END→S2",
                                  "attn S2→S1+1", "attn S2→S1", "attn S1+1→S1", "copying", "suppression", "detector",
                                  "class"]
    assert rows[["head", "layer", "index"]].values.tolist() == [["L0 H1", 0, 1], ["L1 H2", 1, 2], ["L1 H3", 1, 3]]
    assert rows.edges_in.tolist() == [0.0, 5.0, 3.0] and rows.edges_out.tolist() == [4.0, 4.0, 0.0]
    assert rows["attn END→IO"].tolist() == [0.6, 0.0, 0.0] and rows["attn S2→S1+1"].tolist() == [0.2, 0.25, 0.0]
    assert rows.copying.tolist()[:2] == [0.2, 0.9] and rows.suppression.tolist()[:2] == [0.5, 0.1]
    assert np.isnan(rows.copying[2]) and np.isnan(rows.suppression[2])  # L1 H3 has no OV scores given
    assert rows.detector.tolist() == ["previous token", "other", ""]
    assert rows["class"].tolist() == ["negative name mover", "other", "other"]  # suppresses more than it copies
    # the top edge alone, then the top query edge alone; no OV scores or detector: NaN and no label
    top = AC.circuit_heads(scores, 1, attention)
    assert top[["head", "edges_in", "edges_out"]].values.tolist() == [["L1 H2", 0.0, 4.0]]
    assert np.isnan(top.copying).all() and top.detector.tolist() == [""]
    queries = AC.circuit_heads(scores, 1, attention, kinds=("q",))
    assert queries[["head", "edges_in", "edges_out"]].values.tolist() == [["L0 H1", 0.0, 3.0], ["L1 H2", 3.0, 0.0]]
    graph = scores.graph  # the nodes the rows are read by: a key/value input's group, no index for an MLP or logits
    assert [graph.receiver_node(graph.receivers.index(r)) for r in [("q", 1, 2), ("k", 1, 1), ("v", 0, 0),
                                                                     ("mlp", 1, -1), ("logits", 2, -1)]] == [
        ("head", 1, 2), ("kv", 1, 1), ("kv", 0, 0), ("mlp", 1, -1), ("logits", 2, -1)]
    assert queries["class"].tolist() == ["name mover", "other"]  # no OV scores: a name mover as its attention says


def test_a_head_takes_the_class_of_the_pattern_it_attends_along_most_from_the_bar():
    pattern = {name: 0.0 for name in AC.PATTERNS}
    assert AC.classify({**pattern, "induction": 0.29}) == "other"
    assert AC.classify({**pattern, "induction": 0.3}) == "induction"
    assert AC.classify({**pattern, "induction": 0.4, "previous token": 0.5}) == "previous token"
    assert AC.classify({**pattern, "name mover": 0.5}, 0.3, 0.2) == "name mover"
    assert AC.classify({**pattern, "name mover": 0.5}, 0.2, 0.3) == "negative name mover"
    assert AC.classify({**pattern, "name mover": 0.5}, 0.3, 0.3) == "name mover"  # suppressing no more than copying
    assert AC.classify({**pattern, "name mover": 0.5}, np.nan, 0.3) == "name mover"
    assert AC.classify({**pattern, "name mover": 0.5}, 0.2, np.nan) == "name mover"
    assert AC.classify({**pattern, "S-inhibition": 0.5}, 0.2, 0.3) == "S-inhibition"


def test_a_heads_shared_key_and_value_edges_add_up(llama):
    ours, _ = llama
    scores = _scores(ours, _task(2), {
        (("head", 1, 2), ("logits", 2, -1)): 4.0,
        (("input", -1, -1), ("k", 1, 1)): -2.0,  # the key and the value head that L1 H2 and L1 H3 read
        (("mlp", 0, -1), ("v", 1, 1)): 0.5,
    })
    rows = AC.circuit_heads(scores, 3, {name: np.zeros((2, 4)) for name in AC.PATTERNS})
    assert rows[["head", "edges_in", "edges_out"]].values.tolist() == [["L1 H2", 2.5, 4.0]]
