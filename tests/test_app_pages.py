"""Compare, Overview, Tokens and Text in AppTest, each figure checked against the attention it shows."""
import base64
import html
import io

import numpy as np
import plotly.colors as pc
import pytest
from PIL import Image

from models import load_model
from tests.conftest import decode, downloads, figures, heatmaps, tick_text

TOL = 1e-6
COFFEE = "Which do you like better, coffee or tea?"


@pytest.fixture(scope="module")
def untrained():
    return load_model(backend="scratch", untrained=True)


# --- Compare -------------------------------------------------------------------------------------

def test_compare_two_heads_on_one_scale_and_their_difference(new_app, hf_model):
    at = new_app(page="app_pages/compare.py")
    ref = hf_model.attend(COFFEE)
    one, two, diff = figures(at)
    z1, z2 = decode(heatmaps(one)[0]["z"]), decode(heatmaps(two)[0]["z"])
    np.testing.assert_allclose(z1, ref.weights[0, 0], atol=TOL)
    np.testing.assert_allclose(z2, ref.weights[0, 1], atol=TOL)
    top = float(max(ref.weights[0, 0].max(), ref.weights[0, 1].max()))
    assert heatmaps(one)[0]["zmax"] == heatmaps(two)[0]["zmax"] == pytest.approx(top, abs=TOL)
    np.testing.assert_allclose(decode(heatmaps(diff)[0]["z"]), ref.weights[0, 0] - ref.weights[0, 1], atol=TOL)
    assert tick_text(diff) == ref.tokens


def test_compare_trained_with_untrained_and_more_picks(new_app, hf_model, untrained):
    at = new_app(page="app_pages/compare.py")
    at.selectbox(key="p2_model").set_value("untrained").run()
    at.selectbox(key="p2_layer").set_value(3).run()
    at.selectbox(key="p2_head").set_value(0).run()
    assert not at.exception
    z2 = decode(heatmaps(figures(at)[1])[0]["z"])
    np.testing.assert_allclose(z2, untrained.attend(COFFEE).weights[3, 0], atol=TOL)
    at.segmented_control(key="picks").set_value(4).run()
    assert not at.exception
    assert [f["layout"]["title"]["text"].split(":")[0] for f in figures(at)[:4]] == ["1", "2", "3", "4"]
    # each pick computed its own layer only
    from app_pages.results.attention import cached_attention
    from app_pages.results.models import ModelRef

    untrained_key = ModelRef("untrained").cache_key
    held = [a for key, a in cached_attention.cache._items.items() if key[1] == untrained_key and key[2] == COFFEE]
    assert any(a.layers == (3,) and a.weights.shape[0] == 1 for a in held)


def test_compare_one_head_on_two_sentences_has_no_difference(new_app, hf_model):
    at = new_app({"text": "Dogs bark.\nCats purr quietly."}, page="app_pages/compare.py")
    at.selectbox(key="p2_sentence").set_value(1).run()
    at.selectbox(key="p2_head").set_value(0).run()
    figs = figures(at)
    assert len(figs) == 2 and "different tokens" in at.info[0].value
    assert tick_text(figs[1]) == hf_model.attend("Cats purr quietly.").tokens


# --- Overview ------------------------------------------------------------------------------------

def overview_pixels(fig):
    image = next(t for t in fig["data"] if t["type"] == "image")
    png = base64.b64decode(image["source"].split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_overview_thumbnails_are_the_weights(new_app, hf_model):
    at = new_app(page="app_pages/overview.py")
    ref = hf_model.attend(COFFEE)
    fig, reach = figures(at)
    pixels = overview_pixels(fig)
    n = len(ref.tokens)
    f = 96 // n                       # each token is an f x f block
    pitch = n * f + 6
    assert pixels.shape == (6 * pitch - 6, 12 * pitch - 6, 3)
    lut = (np.array(pc.sample_colorscale("Blues", np.linspace(0, 1, 256), colortype="tuple")) * 255).round()
    top = ref.weights.max()
    for layer, head in [(0, 2), (3, 7), (5, 11)]:
        tile = pixels[layer * pitch:layer * pitch + n * f:f, head * pitch:head * pitch + n * f:f]
        want = lut[np.clip(ref.weights[layer, head] / top * 255, 0, 255).astype(int)]
        np.testing.assert_array_equal(tile, want)
    hover = next(t for t in fig["data"] if t["type"] == "scatter")
    custom = decode(hover["customdata"]).reshape(6, 12, 5)  # layer, head, entropy, max, to special
    w = ref.weights.astype(np.float64)
    entropy = -(w * np.log(np.where(w > 0, w, 1))).sum(-1).mean(-1)
    np.testing.assert_array_equal(custom[..., 0], np.arange(6)[:, None].repeat(12, 1))
    np.testing.assert_array_equal(custom[..., 1], np.arange(12)[None, :].repeat(6, 0))
    np.testing.assert_allclose(custom[..., 2], entropy, atol=1e-4)
    np.testing.assert_allclose(custom[..., 3], w.max(axis=(2, 3)), atol=TOL)
    # each marker sits on the centre of its thumbnail
    xs, ys = decode(hover["x"]).reshape(6, 12), decode(hover["y"]).reshape(6, 12)
    np.testing.assert_allclose(xs[0], np.arange(12) * pitch + (pitch - 1) / 2)
    np.testing.assert_allclose(ys[:, 0], np.arange(6) * pitch + (pitch - 1) / 2)
    # every head's reach: its mean attention distance, and its weight on the first token ([CLS])
    distance, first = (decode(t["z"]).astype(float) for t in reach["data"])
    gap = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    np.testing.assert_allclose(distance, (w * gap).sum(-1).mean(-1), rtol=1e-4)
    np.testing.assert_allclose(first, w[..., 1:, 0].mean(-1), atol=TOL)


def test_overview_opens_a_head_in_explore(new_app, hf_model):
    at = new_app(page="app_pages/overview.py")
    at.selectbox(key="open_layer").set_value(4).run()
    at.selectbox(key="open_head").set_value(9).run()
    at.button[0].click().run()
    assert not at.exception
    assert at.title[0].value == "Explore"
    assert at.selectbox(key="layer").value == 4 and at.selectbox(key="head").value == 9
    z = decode(heatmaps(figures(at)[0])[9]["z"])
    np.testing.assert_allclose(z, hf_model.attend(COFFEE).weights[4, 9], atol=TOL)


def test_overview_at_512_tokens_is_small(new_app):
    at = new_app({"text": "attention " * 600}, page="app_pages/overview.py")
    fig = figures(at)[0]
    spec = at.get("plotly_chart")[0].proto.spec
    assert len(spec) < 5_000_000
    assert overview_pixels(fig).shape == (6 * 102 - 6, 12 * 102 - 6, 3)  # max-pooled to 96 px a head


# --- Tokens --------------------------------------------------------------------------------------

def line_ends(fig, head):
    """key index -> opacity of the line drawn to it for ``head``."""
    ends = {}
    for t in fig["data"]:
        if t["type"] == "scatter" and t.get("mode") == "lines" and t["name"] == f"head {head}":
            alpha = float(t["line"]["color"].rsplit(",", 1)[1].rstrip(")"))
            ys = [y for y in t["y"] if y is not None]
            for y_query, y_key in zip(ys[::2], ys[1::2]):
                ends[-int(y_key)] = alpha
    return ends


def test_tokens_lines_follow_the_weights(new_app, hf_model):
    at = new_app({"query": "8", "heads": ["3", "6"], "layer": "2"}, page="app_pages/tokens.py")
    ref = hf_model.attend(COFFEE)
    (fig,) = figures(at)
    texts = {t["name"]: t["text"] for t in fig["data"] if t.get("mode") == "text"}
    assert texts["queries"] == ref.tokens and texts["keys"] == ref.tokens
    for head in (3, 6):
        row = ref.weights[2, head, 8]
        ends = line_ends(fig, head)
        assert set(ends) == set(np.flatnonzero(row / row.max() > 0.02))
        assert ends[int(row.argmax())] == 1.0
        for k, alpha in ends.items():  # opacity is the weight relative to the largest, in eighths
            assert alpha - 0.125 < row[k] / row.max() <= alpha + 1e-6
    assert not line_ends(fig, 0)


def test_tokens_merged_words_and_default_query(new_app):
    at = new_app({"text": "Tokenization is unbelievable", "merge_words": "true"}, page="app_pages/tokens.py")
    (fig,) = figures(at)
    assert at.selectbox(key="query").value == 1  # the first word, not [CLS]
    texts = {t["name"]: t["text"] for t in fig["data"] if t.get("mode") == "text"}
    assert texts["queries"] == ["[CLS]", "Tokenization", "is", "unbelievable", "[SEP]"]


# --- Text ----------------------------------------------------------------------------------------

def test_text_shading_is_the_row_of_the_query(new_app, hf_model):
    at = new_app({"layer": "1", "head": "4", "query": "7"}, page="app_pages/text.py")
    ref = hf_model.attend(COFFEE)
    (fig,) = figures(at)
    lines = heatmaps(fig)  # one heatmap a line of text
    z = np.concatenate([decode(t["z"]).ravel() for t in lines])
    labels = [label for t in lines for label in t["text"][0]]
    np.testing.assert_allclose(z, ref.weights[1, 4, 7], atol=TOL)
    assert [t.replace("<b>", "").replace("</b>", "") for t in labels] == ref.tokens
    assert labels[7] == "<b>coffee</b>"  # the query itself is in bold
    assert "“coffee”" in fig["layout"]["title"]["text"]


def test_text_mean_over_queries_and_exports(new_app, hf_model):
    at = new_app({"layer": "0", "head": "2", "query": "-1"}, page="app_pages/text.py")
    ref = hf_model.attend(COFFEE)
    z = np.concatenate([decode(t["z"]).ravel() for t in heatmaps(figures(at)[0])])
    np.testing.assert_allclose(z, ref.weights[0, 2].mean(axis=0), atol=TOL)
    csv_rows = downloads(at)["L0 H2 · CSV"].decode().splitlines()
    assert len(csv_rows) == len(ref.tokens) + 1


def test_encoder_decoder_parts_in_the_app(new_app, tiny):
    folder = str(tiny("bart"))
    at = new_app({"model": "custom", "custom_model": folder, "text": "The cat sat."})
    assert not at.exception and not at.error
    ref = load_model(folder).attend("The cat sat.")
    np.testing.assert_allclose(decode(heatmaps(figures(at)[0])[0]["z"]), ref.weights[0, 0], atol=TOL)
    at.selectbox(key="component").set_value("cross").run()
    fig = figures(at)[0]
    np.testing.assert_allclose(decode(heatmaps(fig)[1]["z"]), ref.cross.weights[0, 1], atol=TOL)
    shown = lambda tokens: [html.escape(t[1:] if t.startswith("Ġ") else t, quote=False) for t in tokens]  # noqa: E731
    assert tick_text(fig, "yaxis") == shown(ref.cross.tokens) and tick_text(fig) == shown(ref.tokens)
    assert tick_text(fig)[0] == "&lt;s&gt;"
