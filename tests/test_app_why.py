"""Why it attends here in AppTest, on a tiny random Llama opened as a custom model: the Head page's section against
``qk_attribution`` computed directly (metrics, the grid's parts, the bars' heads, the weights without a writer, the
downloads), a query and a key chosen and kept in the URL; Explore's section from its link and the cells a click
takes; a custom decoder whose tokenizer cannot build the task gets a note, and the page goes on."""
import io
import json

import numpy as np
import pandas as pd
import pytest

from analysis import qk_attribution as QA
from models import load_model
from tests.conftest import decode, downloads, figures, title_text
from tests.test_llama import build

TEXT = "Which do you like better, coffee or tea?"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("why-llama")
    build("llama", folder)
    return str(folder), load_model(folder)


def link(folder: str, **more) -> dict:
    return {"model": "custom", "custom_model": folder, "text": TEXT, **more}


def _grid(at) -> dict:
    return next(f for f in figures(at) if "split by writer" in title_text(f))


def test_the_head_page_splits_the_score_as_analysis_does(new_app, tiny):
    folder, model = tiny
    at = new_app(link(folder, head="1.2"), page="app_pages/head.py")
    assert "Why it attends here" in [s.value for s in at.subheader]
    split = QA.qk_attribution(model, TEXT, 1, 2)
    assert at.selectbox(key="why_query").value == split.query == len(split.tokens) - 1
    assert at.selectbox(key="why_key").value == split.key
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Score"] == f"{split.scores[split.key]:+.2f}"
    assert metrics["Weight"] == f"{split.weights[split.key]:.2f}"
    rows, cols, grid = split.grid()
    fig = _grid(at)["data"][0]
    assert list(fig["y"]) == rows and list(fig["x"]) == cols
    np.testing.assert_allclose(decode(fig["z"]), grid, atol=1e-6)
    assert abs(decode(fig["z"]).sum() - split.scores[split.key]) < 1e-4 * abs(split.scores[split.key])
    bars = next(f for f in figures(at) if "largest writers" in title_text(f))
    keys = bars["data"][1]
    top = split.key_writers().head(QA.GRID)
    assert list(keys["y"]) == list(top.writer)
    heads = [tuple(c) for c in keys["customdata"] if c is not None]  # a head's bar opens its card
    assert heads == [(n[1], n[2]) for n in (split.nodes[i] for i in top["index"]) if n[0] == "head"]
    table = next(df.value for df in at.dataframe if "weight without (run)" in df.value.columns)
    writers = split.query_writers().head(QA.GRID)
    np.testing.assert_allclose(table["weight without (split)"], writers.weight_without)
    ran = writers.weight_without_run.notna().to_numpy()
    np.testing.assert_allclose(table["weight without (run)"][ran].astype(float), writers.weight_without_run[ran],
                               atol=5e-4)
    assert (table["weight without (run)"][~ran] == "not run").all()
    files = downloads(at)
    shown = pd.read_csv(io.BytesIO(files["Writer pairs · CSV"]))
    np.testing.assert_allclose(shown.part, split.pairs().part, atol=1e-9)
    assert json.loads(files["Split · JSON"])["key"] == split.key
    # the task: this tokenizer reads too few names as one token; a note, and the card goes on below it
    assert any("Over a task" in i.value for i in at.info) and not at.error
    assert "Heads like L1 H2" in [s.value for s in at.subheader]
    # another query and key, kept in the URL
    at.selectbox(key="why_query").set_value(4).run()
    other = QA.qk_attribution(model, TEXT, 1, 2, query=4)
    assert at.query_params["why_query"] in ("4", ["4"]) and at.selectbox(key="why_key").value == other.key
    at.selectbox(key="why_key").set_value(0).run()
    assert {m.label: m.value for m in at.metric}["Score"] == f"{other.scores[0]:+.2f}"
    np.testing.assert_allclose(decode(_grid(at)["data"][0]["z"]), other.grid(0)[2], atol=1e-6)
    # the runs without a writer are this key's own largest writers'
    mine = QA.qk_attribution(model, TEXT, 1, 2, query=4, key=0).key_writers().head(QA.GRID)
    table = [df.value for df in at.dataframe if "weight without (run)" in df.value.columns][1]
    ran = mine.weight_without_run.notna().to_numpy()
    assert ran.sum() == len(mine) - 1  # every node of this small model; the biases are not a node
    np.testing.assert_allclose(table["weight without (run)"][ran].astype(float), mine.weight_without_run[ran],
                               atol=5e-4)


def test_explore_opens_the_section_from_its_link_and_every_seen_cell_takes_a_click(new_app, tiny):
    folder, model = tiny
    at = new_app(link(folder, layer="1"), page="app_pages/explore.py")
    assert "Why it attends here" not in [s.value for s in at.subheader]
    assert any(b.key == "explore-why-open" for b in at.button)
    grid = next(f for f in figures(at) if title_text(f).startswith("Layer 1"))
    cells = [t for t in grid["data"] if t.get("name") == "cells"]
    n = len(model.tokenizer(TEXT)["input_ids"])
    assert len(cells) == model.n_heads and all(len(t["customdata"]) == n * (n + 1) // 2 for t in cells)
    assert {tuple(c) for c in cells[2]["customdata"]} == {(2, q, k) for q in range(n) for k in range(q + 1)}
    at.button(key="explore-why-open").click().run()
    assert "Why it attends here" in [s.value for s in at.subheader]
    at = new_app(link(folder, layer="1", xwhy_head="3", xwhy_query="5"), page="app_pages/explore.py")
    split = QA.qk_attribution(model, TEXT, 1, 3, query=5)
    assert {m.label: m.value for m in at.metric}["Score"] == f"{split.scores[split.key]:+.2f}"
    assert at.selectbox(key="xwhy_key").value == split.key
