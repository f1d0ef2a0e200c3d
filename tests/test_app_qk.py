"""The Queries & keys page: every head's picture, a head's scatter and a sentence's heatmap, against
analysis.qk_attribution.pictures and attend() on the same model."""
import pytest
import numpy as np

from analysis.qk_attribution.pictures import qk_embedding, qk_vectors
from tests.conftest import decode, figures, heatmaps

PAGE = "app_pages/queries_keys.py"
TEXT = "Which do you like better, coffee or tea?\nThe cat sat on the mat because it was warm."
SENTENCES = TEXT.split("\n")


def open_page(new_app, **params):
    at = new_app({"text": TEXT, "qk_corpus": "sidebar", **params}, page=PAGE)
    assert not at.error, [e.value for e in at.error]
    return at


def test_every_head_is_a_thumbnail_named_with_its_faithfulness(new_app, scratch_model):
    at = open_page(new_app)
    grid = figures(at)[0]
    assert [t["type"] for t in grid["data"]] == ["image", "scatter"]
    custom = decode(grid["data"][1]["customdata"]).astype(float)
    assert custom.shape == (72, 6)
    for layer, head in [(0, 2), (3, 11), (5, 0)]:
        frame = qk_embedding(qk_vectors(scratch_model, SENTENCES, layer, head))
        a = frame.attrs
        np.testing.assert_array_equal(custom[layer * 12 + head], [layer, head, a["faithfulness"], a["chance"],
                                                                  a["word_faithfulness"], a["word_share"]])
    assert any("Median faithfulness" in c.value for c in at.caption)


def test_a_heads_scatter_and_heatmap_follow_the_pickers(new_app, scratch_model):
    at = open_page(new_app, qk_layer="3", qk_head="11")
    frame = qk_embedding(qk_vectors(scratch_model, SENTENCES, 3, 11))
    scatter = figures(at)[1]
    assert scatter["layout"]["title"]["text"].startswith("L3 H11 · faithfulness")
    queries = next(t for t in scatter["data"] if t["name"] == "queries")
    np.testing.assert_allclose(decode(queries["x"]), frame["x"].iloc[:len(frame) // 2], rtol=1e-6)
    ringed = next(t for t in scatter["data"] if t["name"] == "picked")
    assert ringed["x"][0] == frame["x"].iloc[1]  # "which", the first word of the first sentence
    at.selectbox(key="qk_sentence").set_value(1).run()
    at.selectbox(key="qk_query").set_value(3).run()
    heat = figures(at)[2]
    np.testing.assert_allclose(decode(heatmaps(heat)[0]["z"]), scratch_model.attend(SENTENCES[1]).weights[3, 11],
                               atol=1e-6)
    assert heat["layout"]["shapes"][0]["y0"] == 2.5
    caption = next(c.value for c in at.caption if c.value.startswith("Query 3"))
    assert "sat" in caption
    ringed = next(t for t in figures(at)[1]["data"] if t["name"] == "picked")
    row = len(scratch_model.attend(SENTENCES[0]).tokens) + 3
    assert ringed["x"][0] == frame["x"].iloc[row]


def test_colouring_by_word_class_names_the_classes(new_app):
    at = open_page(new_app, qk_color="word_class")
    names = {t["name"] for t in figures(at)[1]["data"]}
    assert {"object · queries", "object · keys", "special token · keys", "relation · queries"} <= names


def test_a_model_our_engine_does_not_run_gets_a_sentence(new_app, tiny):
    at = new_app({"model": "custom", "custom_model": str(tiny("bloom"))}, page=PAGE)
    assert any("from-scratch engine" in i.value for i in at.info)
    assert not at.get("plotly_chart")


@pytest.mark.slow
def test_the_pictures_are_shown_a_layer_at_a_time_while_they_are_computed(scratch_model):
    """What the page draws before the last head is ready: after each layer, that layer's heads and every one
    before it, each the very picture the finished grid holds (a session waiting on another's computation
    is handed the same values)."""
    from app_pages.results.cache import SharedCache, computed_once
    from app_pages.results.qk import _compute
    from viz.qk import qk_overview_png

    cache, seen, waiting = SharedCache(max_entries=1), [], []

    def shown(ready):
        seen.append(ready)
        waiting.append(cache.partial.get("k"))  # published for the sessions waiting on the same key

    final = computed_once(cache, "k", lambda: _compute(scratch_model, SENTENCES, "fitted"), "", partial=shown)
    L, H = scratch_model.n_layers, scratch_model.n_heads
    assert [sorted(p.frames) for p in seen] == [[(l, h) for l in range(k + 1) for h in range(H)] for k in range(L - 1)]
    assert all(a is b for a, b in zip(seen, waiting))
    for ready in seen:
        for pair, frame in ready.frames.items():
            assert frame is final.frames[pair]
    assert seen[0].png == qk_overview_png(seen[0].frames, L, H)  # the heads not yet drawn are blank
    assert final.png == qk_overview_png(final.frames, L, H)
    assert cache.partial == {} and cache.progress == {}
