"""analysis.attention.views and viz.figures on small synthetic attention whose right answers are known by hand."""
import html
import json

import numpy as np
import pytest

from analysis import head_stats, make_view, token_label, word_spans
from models.result import Attention
from viz import head_grid, overview_png, text_shading, token_lines
from viz.export import figure_image
from viz.figures import block_categories, head_heatmap, wrapped_title
from tests.conftest import decode, tick_text


def synthetic(tokens, word_ids, special, weights, text=""):
    n = len(tokens)
    return Attention(tokens=tokens, weights=np.asarray(weights, dtype=np.float32), word_ids=word_ids,
                     special=np.array(special), offsets=[(0, 0)] * n, text=text, model_name="t", backend="t",
                     device="cpu")


def test_hiding_special_tokens_renormalises_and_keeps_empty_rows_empty():
    # row 1 looks only at [CLS]: with [CLS] hidden nothing is left, and it must stay zero, not NaN
    w = np.array([[1.0, 0, 0, 0], [1.0, 0, 0, 0], [0.5, 0.25, 0.25, 0], [0.2, 0.2, 0.2, 0.4]])[None, None]
    att = synthetic(["[CLS]", "a", "b", "[SEP]"], [None, 0, 1, None], [True, False, False, True], w)
    v = make_view(att, hide_special=True)
    assert v.query_labels == ["a", "b"]
    np.testing.assert_allclose(v.weights[0, 0], [[0, 0], [0.5, 0.5]])


def test_merging_pieces_sums_keys_and_averages_queries():
    tokens = ["Ġun", "believ", "able", "Ġday"]  # byte-level pieces: no special tokens at all
    w = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.5, 0.5]])
    att = synthetic(tokens, [0, 0, 0, 1], [False] * 4, w[None, None], text="unbelievable day")
    att = Attention(**{**att.__dict__, "offsets": [(0, 2), (2, 8), (8, 12), (13, 16)]})
    assert word_spans(att) == [(0, 3), (3, 4)]
    v = make_view(att, merge_words=True)
    assert v.query_labels == ["unbelievable", "day"]
    want = [[np.mean([0.6, 0.9, 0.75]), np.mean([0.4, 0.1, 0.25])], [0.5, 0.5]]
    np.testing.assert_allclose(v.weights[0, 0], want, atol=1e-6)


def test_token_labels_drop_space_marks():
    assert [token_label(t) for t in ["Ġthe", "▁cat", "##s", "Ġ", "Ċ"]] == ["the", "cat", "##s", "␣", "\\n"]  # a lone space shown


def test_entropy_of_uniform_and_one_hot_heads():
    n = 4
    w = np.stack([np.full((n, n), 1 / n), np.eye(n)])[None]  # (1 layer, 2 heads, n, n)
    att = synthetic(list("abcd"), [0, 1, 2, 3], [False] * 4, w)
    stats = head_stats(make_view(att))
    np.testing.assert_allclose(stats["entropy"][0], [np.log(4), 0.0], atol=1e-6)
    np.testing.assert_allclose(stats["max_weight"][0], [0.25, 1.0])


def test_grid_keeps_repeated_words_apart_and_labels_every_token():
    labels = [f"w{i % 5}" for i in range(39)] + ["a_very_long_subword_token", "end"]
    n = len(labels)
    w = np.random.default_rng(0).dirichlet(np.ones(n), size=(2, n)).astype(np.float32)
    fig = json.loads(head_grid(w, labels, labels, [0, 1]).to_json())
    assert len(set(fig["data"][0]["x"])) == n  # "w0" occurs 9 times, each its own column
    assert tick_text(fig) == tick_text(fig, "yaxis") == labels[:39] + ["a_very_long…", "end"]
    assert fig["layout"]["xaxis"]["tickmode"] == "auto"  # plotly draws as many as the width holds


def test_every_label_is_escaped():
    labels = ["<b>x</b>", "&amp;", "ok"]
    fig = json.loads(head_grid(np.eye(3, dtype=np.float32)[None], labels, labels, [0], title="<i>t</i>").to_json())
    assert tick_text(fig)[:2] == ["&lt;b&gt;x&lt;/b&gt;", "&amp;amp;"]
    assert fig["layout"]["title"]["text"] == "&lt;i&gt;t&lt;/i&gt;"
    assert all("<b>" not in c for c in fig["data"][0]["y"])


def test_overview_max_pools_long_inputs():
    from io import BytesIO

    from PIL import Image

    w = np.zeros((2, 3, 300, 300), dtype=np.float32)
    w[1, 2, 150, 7] = 1.0  # one strong cell must survive pooling 300 -> 96
    png, pitch = overview_png(w, thumb=96)
    img = np.asarray(Image.open(BytesIO(png)).convert("RGB")).astype(int)
    assert pitch == 96 + 6 and img.shape == (2 * pitch - 6, 3 * pitch - 6, 3)
    tile = img[pitch:pitch + 96, 2 * pitch:2 * pitch + 96]
    darkest = np.unravel_index(tile.sum(-1).argmin(), tile.shape[:2])
    assert darkest == (150 * 96 // 300, 7 * 96 // 300)
    assert img[:96, :96].sum(-1).min() > tile.sum(-1).min()


def test_text_shading_wraps_and_keeps_order():
    labels = [f"word{i}" for i in range(30)] + ["x" * 30, "end"]
    values = np.linspace(0, 1, 32)
    fig = json.loads(text_shading(labels, values, line_chars=40).to_json())
    lines = fig["data"]
    assert [t for line in lines for t in line["text"][0]] == labels[:30] + ["x" * 19 + "…", "end"]
    np.testing.assert_allclose(np.concatenate([decode(line["z"]).ravel() for line in lines]), values, atol=1e-6)
    assert len(lines) > 1 and all(decode(line["x"])[-1] <= 40 for line in lines)
    # a cell is as wide as its token, with 3 characters of room
    first = lines[0]
    assert np.diff(decode(first["x"])).tolist() == [len(t) + 3 for t in first["text"][0]]


def test_image_export_without_a_browser_says_what_to_do(monkeypatch):
    import plotly.graph_objects as go

    fig = go.Figure()
    monkeypatch.setattr(go.Figure, "to_image", lambda self, **kw: (_ for _ in ()).throw(OSError("no chrome")))
    with pytest.raises(RuntimeError, match="needs Chrome or Chromium.*camera button"):
        figure_image(fig, "png")


def test_long_axes_are_max_pooled_in_blocks_named_by_their_tokens():
    n = 512
    labels = [f"t{i}" for i in range(n)]
    w = np.random.default_rng(1).dirichlet(np.ones(n), size=(1, n)).astype(np.float32)
    fig = json.loads(head_grid(w, labels, labels, [0]).to_json())
    (trace,) = fig["data"]
    z = decode(trace["z"])
    assert z.shape == (128, 128)  # 4 x 4 tokens a cell
    np.testing.assert_array_equal(z, w[0].reshape(128, 4, 128, 4).max(axis=(1, 3)))
    assert trace["x"][0] == "0–3: t0 … t3" and trace["y"][-1] == "508–511: t508 … t511"
    assert tick_text(fig)[:2] == ["t0", "t4"]  # a block's tick is its first token
    assert "largest weight in this block" in trace["hovertemplate"]


def test_a_difference_keeps_the_value_largest_in_magnitude_and_full_resolution_keeps_all():
    n = 300
    labels = [str(i) for i in range(n)]
    d = np.random.default_rng(2).normal(size=(n, n)).astype(np.float32)
    z = decode(json.loads(head_heatmap(d, labels, labels, diverging=True).to_json())["data"][0]["z"])
    step = 3  # ceil(300 / 128): 100 blocks a side
    blocks = d.reshape(100, step, 100, step).transpose(0, 2, 1, 3).reshape(100, 100, -1)
    want = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    np.testing.assert_array_equal(z, want)
    assert block_categories(labels, np.array([0, 3]))[0] == "0–2: 0 … 2"
    full = json.loads(head_heatmap(d, labels, labels, max_cells=None).to_json())["data"][0]
    np.testing.assert_array_equal(decode(full["z"]), d)
    assert full["hovertemplate"].startswith("%{y} → %{x}<br>weight")


def test_titles_wrap_and_stay_escaped():
    t = wrapped_title("Layer 0 · " + "a <b>word</b> " * 12, chars=40)
    lines = t["text"].split("<br>")
    assert len(lines) == 5 and all(len(html.unescape(line)) <= 40 for line in lines)
    assert "&lt;b&gt;" in t["text"] and "<b>" not in t["text"]


def test_head_view_keeps_each_querys_strongest_lines():
    n = 300
    w = np.random.default_rng(3).dirichlet(np.full(n, 5.0), size=(2, n)).astype(np.float32)
    fig = json.loads(token_lines(w, [str(i) for i in range(n)], [str(i) for i in range(n)], [0, 1], 7).to_json())
    for head in (0, 1):
        ends = [-int(y) for t in fig["data"] if t["mode"] == "lines" and t["name"] == f"head {head}"
                for y in t["y"][1::3]]
        assert sorted(ends) == sorted(np.argsort(w[head, 7])[-24:].tolist())  # all far above 2% of the largest


def test_a_click_on_a_circuits_head_lands_on_the_head_not_on_an_edge_across_it():
    """An edge from L0 H1 into L2 H1's query passes over L1 H1: its hover point sits off layer 1's row (a third of a
    layer), so that plotly's nearest point to a click on L1 H1 is the head; an edge across one layer keeps its middle."""
    from types import SimpleNamespace

    import pandas as pd

    from viz.circuits import circuit_figure

    senders = [("head", 0, 1), ("head", 1, 1)]
    receivers = [("q", 2, 1), ("q", 1, 1)]
    graph = SimpleNamespace(n_layers=3, senders=senders, receivers=receivers, reads=None, output="logits",
                            receiver_node=lambda r: ("head", *receivers[r][1:]))
    frame = pd.DataFrame({"sender_index": [0, 1, 0], "receiver_index": [0, 0, 1], "score": [1.0, 0.5, 0.2],
                          "kind": ["q"] * 3, "share": [0.1] * 3,
                          "sender": ["L0 H1", "L1 H1", "L0 H1"], "receiver": ["L2 H1.q", "L2 H1.q", "L1 H1.q"]})
    fig = circuit_figure(frame, graph, n_heads=4)
    edges = next(t for t in fig.data if t.name == "edges")
    heads = next(t for t in fig.data if t.name == "head")
    assert sorted(zip(heads.x, heads.y)) == [(1, 0), (1, 1), (1, 2)]
    assert list(zip(edges.x, edges.y)) == [(1, pytest.approx(4 / 3)), (1, 1.5), (1, 0.5)]


def test_a_role_grids_numbers_are_sent_once_on_its_click_targets():
    """Each cell's numbers are the hover of its click target (point ``layer * heads + head`` of "heads"); the cells
    under them carry none: SmolLM2's 270 tips, sent twice, were half of Head roles' charts."""
    from viz import role_grid

    layers, heads = np.repeat(np.arange(2), 3), np.tile(np.arange(3), 2)
    labels = ["positional", "broad", "positional", "mixed", "broad", "mixed"]
    tips = [f"<b>{label}</b><br>cell {i}" for i, label in enumerate(labels)]
    fig = json.loads(role_grid(layers, heads, labels, tips, title="Roles").to_json())
    cells, targets = fig["data"]
    assert cells["type"] == "heatmap" and cells["hoverinfo"] == "skip" and "customdata" not in cells
    assert targets["name"] == "heads" and targets["text"] == tips  # layer * 3 + head, in that order
    assert decode(cells["z"]).tolist() == [[2, 0, 2], [1, 0, 1]]  # broad 0, mixed 1, positional 2: the colours' order
