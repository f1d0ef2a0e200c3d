"""The Circuits page in AppTest on SmolLM2: its circuit, curve, heads and exports against ``analysis.circuits``
computed directly on the same pairs; the size and method from the link and the slider; path patching on a
button; the default encoder's circuit over a focus task."""
import io
import json

import numpy as np
import pandas as pd
import pytest

from analysis import circuits as AC
from analysis.circuits import circuit_heads, role_attention
from analysis.tasks.build import ioi
from tests.conftest import COLD_RUN_S, decode, downloads, figures, title_text

PAGE = "app_pages/circuits.py"
LINK = {"model": "smollm2", "task": "ioi", "task_pairs": "10", "circuit_edges": "50"}


@pytest.fixture(scope="module")
def expected(smollm2):
    task = ioi(smollm2, n=10, seed=0)
    scores = AC.edge_scores(smollm2, task, "eap_ig", AC.STEPS)
    return task, scores, AC.faithfulness(smollm2, scores)


def _figure(at, title: str) -> dict:
    return next(f for f in figures(at) if title in title_text(f))


def test_the_page_draws_the_circuit_and_its_curve_as_analysis_computes_them(new_app, smollm2, expected):
    task, scores, curve = expected
    at = new_app(LINK, page=PAGE, timeout=COLD_RUN_S)
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Pairs"] == "10" and metrics["Edges"] == f"{scores.graph.n_edges:,}" == "70,651"
    assert metrics["Clean − corrupted"] == f"{(scores.clean - scores.corrupted).mean():+.2f}"
    # the circuit: the top 50 edges, each edge's hover its score, each head node one the edges touch
    top = scores.frame(50)
    one = AC.faithfulness(smollm2, scores, [50])
    graph = _figure(at, "The top 50 edges")
    assert f"faithfulness {one.faithfulness[0]:.0%}" in title_text(graph)
    hovers = next(t for t in graph["data"] if t.get("name") == "edges")["text"]
    assert [h.split("<br>")[0] for h in hovers] == [f"{a} → {b}" for a, b in zip(top.sender, top.receiver)]
    shown = [float(h.split("score ")[1].split(" ")[0]) for h in hovers]
    np.testing.assert_allclose(shown, top.score, atol=1e-3)
    heads = next(t for t in graph["data"] if t.get("name") == "head")
    touched = {tuple(int(x) for x in s[1:].split(" H")) for s in [*top.sender, *(r.split(".")[0] for r in top.receiver)]
               if s.startswith("L") and " H" in s}
    assert {tuple(c) for c in heads["customdata"]} == touched
    # the curve: faithfulness at each size, and the smallest circuit reaching 80% in the title
    fig = _figure(at, "Faithfulness against the circuit's size")
    line = next(t for t in fig["data"] if t.get("name") == "faithfulness")
    np.testing.assert_allclose(decode(line["y"]), curve.faithfulness, atol=1e-6)
    np.testing.assert_allclose(decode(line["x"]), curve.sizes, atol=0)
    assert f"has {curve.smallest():,} edges" in title_text(fig)
    # exports: the circuit's JSON and every edge's CSV
    files = downloads(at)
    graph_json = json.loads(files["Circuit · JSON"])
    assert graph_json["pairs"] == 10 and graph_json["faithfulness"] == pytest.approx(one.faithfulness[0])
    assert [(e["sender"], e["receiver"]) for e in graph_json["edges"]] == list(zip(top.sender, top.receiver))
    edges = pd.read_csv(io.BytesIO(files["Every edge · CSV"]))
    assert len(edges) == scores.graph.n_edges
    np.testing.assert_allclose(edges["score"][:200], scores.frame(200).score, rtol=1e-9)
    # what the heads are: the classes of the heads of the circuit, as circuit_heads gives them
    expected_heads = circuit_heads(scores, 50, role_attention(smollm2, task)).sort_values("head")
    table = next(df for df in at.dataframe if "class" in df.value.columns).value.sort_values("head")
    assert list(table["head"]) == list(expected_heads["head"])
    np.testing.assert_allclose(table["attn END→IO"], expected_heads["attn END→IO"], atol=1e-6)
    np.testing.assert_allclose(table["edges_in"], expected_heads["edges_in"], rtol=1e-9)


def test_a_smaller_circuit_and_path_patching_from_the_page(new_app, smollm2, expected):
    task, scores, _ = expected
    at = new_app(LINK, page=PAGE, timeout=COLD_RUN_S)
    at.select_slider(key="circuit_edges").set_value(20).run()
    assert _figure(at, "The top 20 edges") and at.query_params["circuit_edges"] in ("20", ["20"])
    # path patching: the sender and receivers chosen, the result the one path_patching gives
    at.selectbox(key="path_sender").set_value((20, 0)).run()
    at.multiselect(key="path_receivers").set_value([(23, 0), (24, 4)]).run()
    at.button(key="path-run").click().run()
    assert not at.exception, at.exception
    result = AC.path_patching(smollm2, task, (20, 0), [(23, 0), (24, 4)], kinds=("q",))
    shown = next(m for m in at.metric if m.label.startswith("L20 H0 →"))
    assert shown.value == f"{result.share:.1%}"
    assert shown.label == "L20 H0 → L23 H0.q, L24 H4.q"


def test_the_default_encoder_gets_its_circuit_over_a_focus_task(new_app, scratch_model):
    """MiniLM, the objects task: the page's scores and faithfulness are those of ``analysis.circuits`` on the same
    pairs, with the embedding difference as the metric; no sentence about decoders."""
    from analysis.tasks.build import make_task

    at = new_app({"task_pairs": "10", "circuit_edges": "50"}, page=PAGE, timeout=COLD_RUN_S)
    assert not at.exception and not at.error
    assert not [i.value for i in at.info if "encoder" in i.value or "decoder" in i.value]
    task = make_task(scratch_model, "objects", 10, seed=0)
    scores = AC.edge_scores(scratch_model, task, "eap_ig", AC.STEPS)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Pairs"] == "10" and metrics["Edges"] == f"{scores.graph.n_edges:,}" == "7,588"
    assert metrics["Clean − corrupted"] == f"{(scores.clean - scores.corrupted).mean():+.2f}"
    one = AC.faithfulness(scratch_model, scores, [50])
    assert f"faithfulness {one.faithfulness[0]:.0%}" in title_text(_figure(at, "The top 50 edges"))
    top = scores.frame(50)
    hovers = next(t for t in _figure(at, "The top 50 edges")["data"] if t.get("name") == "edges")["text"]
    assert [h.split("<br>")[0] for h in hovers] == [f"{a} → {b}" for a, b in zip(top.sender, top.receiver)]
    np.testing.assert_allclose([float(h.split("score ")[1].split(" ")[0]) for h in hovers], top.score, atol=1e-3)
    # a path patched from the page: a head of layer 3 to the queries of layer 5's heads
    at.selectbox(key="path_sender").set_value((3, 11)).run()
    at.multiselect(key="path_receivers").set_value([(5, 11), (5, 5)]).run()
    at.button(key="path-run").click().run()
    result = AC.path_patching(scratch_model, task, (3, 11), [(5, 11), (5, 5)], kinds=("q",))
    assert next(m for m in at.metric if m.label.startswith("L3 H11 →")).value == f"{result.share:.1%}"


def test_why_a_circuit_head_attends_to_its_key_on_a_pair_and_over_the_task(new_app, smollm2, expected):
    from analysis.qk_attribution import qk_attribution, qk_attribution_task

    task, scores, _ = expected
    frame, graph = scores.frame(50), scores.graph
    entered = [graph.receivers[r] for r in frame.receiver_index if graph.receivers[r][0] in ("q", "k")]
    kind, layer, index = entered[0]  # the page's first head: the one the strongest query or key edge enters
    head = index if kind == "q" else graph.reads[layer][index][0]
    at = new_app({**LINK, "cwhy_pair": "2"}, page=PAGE, timeout=COLD_RUN_S)
    assert at.selectbox(key="cwhy_head").value == (layer, head)
    pair = task.pairs[1]
    split = qk_attribution(smollm2, pair.clean, layer, head, query=pair.role("END"))  # to its strongest key
    assert at.selectbox(key="cwhy_query").value == pair.role("END")
    assert at.selectbox(key="cwhy_key").value == split.key
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Score"] == f"{split.scores[split.key]:+.2f}"
    assert metrics["Weight"] == f"{split.weights[split.key]:.2f}"
    at.button(key="cwhy-task").click().run()
    found = qk_attribution_task(smollm2, task, layer, head, "END", "S2")
    table = next(df.value for df in at.dataframe if "part_lo" in df.value.columns)
    expected_frame = found.frame("clean")
    assert list(table.query_writer) == list(expected_frame.query_writer)
    np.testing.assert_allclose(table.part, expected_frame.part, atol=1e-6)
    at.segmented_control(key="cwhy_which").set_value("difference").run()
    table = next(df.value for df in at.dataframe if "part_lo" in df.value.columns)
    np.testing.assert_allclose(table.part, found.frame("difference").part, atol=1e-6)
