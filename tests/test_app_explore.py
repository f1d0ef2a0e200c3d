"""The Explore page and the shared sidebar, in AppTest: figure data against the model's attention."""
import io
import json

import numpy as np
import pytest

from tests.conftest import decode, downloads, figures, heatmaps, shown, tick_text

TOL = 1e-6
COFFEE = "Which do you like better, coffee or tea?"


def grid(at):
    (fig,) = figures(at)
    return fig, [decode(t["z"]) for t in heatmaps(fig)]


def test_default_shows_every_head_of_layer_0(app, hf_model):
    ref = hf_model.attend(COFFEE)
    fig, zs = grid(app)
    assert len(zs) == 12
    for h, z in enumerate(zs):
        np.testing.assert_allclose(z, ref.weights[0, h], atol=TOL)
    assert tick_text(fig) == ref.tokens and tick_text(fig, "yaxis") == ref.tokens
    assert fig["layout"]["title"]["text"] == f"Layer 0 · {COFFEE}"
    assert fig["layout"]["coloraxis"]["cmax"] == pytest.approx(float(ref.weights[0].max()), abs=TOL)
    assert "Running on **cpu** · 6 layers × 12 heads" in [c.value for c in app.sidebar.caption]


def test_new_sentences_layer_and_heads(app, hf_model):
    text = "The cat sat on the mat.\nA second line about dogs."
    app.text_area(key="text").input(text).run()
    app.selectbox(key="sentence").set_value(1).run()
    app.selectbox(key="layer").set_value(3).run()
    app.multiselect(key="heads").set_value([2, 7]).run()
    assert not app.exception
    ref = hf_model.attend("A second line about dogs.")
    fig, zs = grid(app)
    assert tick_text(fig) == ref.tokens == ["[CLS]", "a", "second", "line", "about", "dogs", ".", "[SEP]"]
    assert [t["name"] for t in heatmaps(fig)] == ["head 2", "head 7"]
    np.testing.assert_allclose(zs[0], ref.weights[3, 2], atol=TOL)
    np.testing.assert_allclose(zs[1], ref.weights[3, 7], atol=TOL)


def test_hidden_special_tokens_renormalise_rows(app, hf_model):
    app.toggle(key="hide_special").set_value(True).run()
    ref = hf_model.attend(COFFEE)
    fig, zs = grid(app)
    assert tick_text(fig) == ref.tokens[1:-1]
    for h, z in enumerate(zs):
        inner = ref.weights[0, h][1:-1, 1:-1]
        np.testing.assert_allclose(z, inner / inner.sum(axis=1, keepdims=True), atol=TOL)
        np.testing.assert_allclose(z.sum(axis=1), 1.0, atol=1e-5)


def test_merged_words_match_the_words(app, hf_model):
    text = "Tokenization is unbelievably interesting"
    app.text_area(key="text").input(text).run()
    app.toggle(key="merge_words").set_value(True).run()
    ref = hf_model.attend(text)
    fig, zs = grid(app)
    assert tick_text(fig) == ["[CLS]", "Tokenization", "is", "unbelievably", "interesting", "[SEP]"]
    # pieces per word, from the tokenizer's word ids: [CLS] | token ##ization | is | un ##bel ##ie ##va ##bly | ...
    groups = [[0]]
    for i, w in enumerate(ref.word_ids[1:-1], start=1):
        if groups[-1] and i > 1 and ref.word_ids[groups[-1][-1]] == w:
            groups[-1].append(i)
        else:
            groups.append([i])
    groups.append([len(ref.tokens) - 1])
    w = ref.weights[0, 5]
    want = np.array([[w[np.ix_(qg, kg)].sum(axis=1).mean() for kg in groups] for qg in groups])
    np.testing.assert_allclose(zs[5], want, atol=1e-5)


def test_one_scale_per_head(app, hf_model):
    app.toggle(key="shared_scale").set_value(False).run()
    ref = hf_model.attend(COFFEE)
    fig, _ = grid(app)
    assert "coloraxis" not in fig["layout"] or "cmax" not in fig["layout"]["coloraxis"]
    for h, t in enumerate(heatmaps(fig)):
        assert t["zmax"] == pytest.approx(float(ref.weights[0, h].max()), abs=TOL)


def test_head_statistics_table(app, hf_model):
    ref = hf_model.attend(COFFEE)
    app.selectbox(key="layer").set_value(2).run()
    table = app.dataframe[0].value
    w = ref.weights[2].astype(np.float64)
    entropy = -(w * np.log(np.where(w > 0, w, 1))).sum(-1).mean(-1)
    np.testing.assert_allclose(table["entropy (nats)"], entropy, atol=1e-4)
    np.testing.assert_allclose(table["largest weight"], w.max(axis=(1, 2)), atol=TOL)
    np.testing.assert_allclose(table["to special tokens"], w[:, :, [0, -1]].sum(-1).mean(-1), atol=1e-5)


def test_causal_mask_and_heads_off_on_the_scratch_engine(app):
    from models import load_model

    app.selectbox(key="model").set_value("scratch").run()
    app.toggle(key="causal").set_value(True).run()
    app.multiselect(key="heads_off").set_value([(0, 3)]).run()
    assert not app.exception
    ref = load_model(backend="scratch").attend(COFFEE, causal=True, head_mask=np.where(np.arange(72) == 3, 0, 1).reshape(6, 12))
    _, zs = grid(app)
    upper = np.triu(np.ones(zs[3].shape, bool), 1)  # keys after the query: not visible, drawn empty (grey)
    assert np.all(zs[3][~upper] == 0) and np.isnan(zs[3][upper]).all()
    for h in (0, 5, 11):
        assert np.isnan(zs[h][upper]).all()
        np.testing.assert_allclose(zs[h][~upper], ref.weights[0, h][~upper], atol=TOL)


def test_causal_is_ignored_for_transformers_models(new_app, hf_model):
    at = new_app({"causal": "true"})
    assert at.toggle(key="causal").disabled
    _, zs = grid(at)
    np.testing.assert_allclose(zs[0], hf_model.attend(COFFEE).weights[0, 0], atol=TOL)


def test_state_comes_from_the_url(new_app, hf_model):
    at = new_app({"text": "Dogs bark loudly.", "layer": "4", "heads": ["1", "9"], "hide_special": "true"})
    ref = hf_model.attend("Dogs bark loudly.")
    fig, zs = grid(at)
    assert at.selectbox(key="layer").value == 4 and tick_text(fig) == ["dogs", "bark", "loudly", "."]
    inner = ref.weights[4, 9][1:-1, 1:-1]
    np.testing.assert_allclose(zs[1], inner / inner.sum(1, keepdims=True), atol=TOL)


def test_and_goes_back_to_the_url(app):
    app.selectbox(key="layer").set_value(5).run()
    app.toggle(key="merge_words").set_value(True).run()
    app.multiselect(key="heads").set_value([1, 3]).run()
    assert app.query_params["layer"] == "5" and app.query_params["merge_words"] == "true"
    assert app.query_params["heads"] == ["1", "3"]
    app.selectbox(key="layer").set_value(0).run()  # back to the default: left out of the link
    assert "layer" not in app.query_params


def test_a_choice_survives_a_page_switch(app, hf_model):
    app.selectbox(key="layer").set_value(3).run()
    app.switch_page("app_pages/tokens.py").run()
    assert app.selectbox(key="layer").value == 3
    assert figures(app)[0]["layout"]["title"]["text"].startswith("Layer 3 ·")
    assert app.query_params["layer"] == "3"


def test_examples_fill_the_text(app, hf_model):
    app.selectbox(key="example").set_value("What does 'it' refer to?").run()
    assert app.text_area(key="text").value.startswith("The animal didn't cross the street")
    assert len(app.selectbox(key="sentence").options) == 2


def test_errors_are_sentences_and_the_session_goes_on(app):
    app.text_area(key="text").input("   \n  ").run()
    assert not app.exception and "Type a sentence" in app.info[0].value
    app.selectbox(key="model").set_value("custom").run()
    app.text_input(key="custom_model").input("nobody/no-such-model").run()
    assert not app.exception
    assert "No model 'nobody/no-such-model' was found" in shown(app.error[0].value)
    assert "downloads nothing unless asked" in shown(app.error[0].value)
    app.selectbox(key="model").set_value("minilm").run()
    app.text_area(key="text").input("Back to work.").run()
    assert not app.exception and not app.error and tick_text(figures(app)[0])[1:3] == ["back", "to"]


def test_long_text_is_cut_with_a_note_drawn_in_blocks_and_one_click_from_every_weight(app, hf_model):
    app.text_area(key="text").input("word " * 600).run()
    assert "the model reads at most 512" in app.warning[0].value
    ref = hf_model.attend("word " * 600)
    fig, zs = grid(app)
    for h in (0, 7):  # 4 x 4 tokens a cell, each its largest weight
        np.testing.assert_allclose(zs[h], ref.weights[0, h].reshape(128, 4, 128, 4).max(axis=(1, 3)), atol=TOL)
    assert heatmaps(fig)[0]["x"][1] == "4–7: word … word"
    assert app.get("segmented_control")[0].label == "Head at full resolution"
    app.get("segmented_control")[0].set_value(7).run()
    full = figures(app)[1]
    assert full["layout"]["title"]["text"].startswith("L0 H7, every weight")
    np.testing.assert_allclose(decode(heatmaps(full)[0]["z"]), ref.weights[0, 7], atol=TOL)
    assert app.query_params["full"] == "7"


def test_exports_hold_the_attention(app, hf_model):
    app.selectbox(key="head").set_value(4).run()
    ref = hf_model.attend(COFFEE)
    files = downloads(app)
    npz = np.load(io.BytesIO(files["Attention · NPZ"]))
    np.testing.assert_allclose(npz["weights"], ref.weights, atol=TOL)
    assert npz["tokens"].tolist() == ref.tokens
    assert json.loads(str(npz["metadata"]))["text"] == COFFEE
    data = json.loads(files["Attention · JSON"])
    assert data["tokens"] == ref.tokens and data["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    np.testing.assert_allclose(np.array(data["weights"]), ref.weights, atol=1e-6)
    rows = files["L0 H4 · CSV"].decode().splitlines()
    assert rows[0].split(",")[1:4] == ["[CLS]", "which", "do"]
    first = [float(x) for x in rows[1].split(",")[1:]]
    np.testing.assert_allclose(first, ref.weights[0, 4, 0], rtol=1e-5)
    page = files["Figure · HTML"].decode()
    assert "plotly" in page.lower() and COFFEE in page


def test_markup_in_a_sentence_stays_text(app):
    app.text_area(key="text").input("<b>bold</b> & <script>alert(1)</script>").run()
    fig = figures(app)[0]
    labels = tick_text(fig)
    assert "&lt;" in "".join(labels) and not any("<" in t for t in labels)
    assert "<script>" not in fig["layout"]["title"]["text"]
    html = downloads(app)["Figure · HTML"].decode()
    assert "<script>alert(1)</script>" not in html


def test_a_custom_folder_opens_on_either_engine_and_a_family_it_does_not_know_gets_a_sentence(new_app, tiny):
    """GPT-2 from a folder on the from-scratch engine draws its own weights (transformers' to 1e-6); BLOOM, which
    that engine does not implement, gets a sentence naming the families it does, and shows on the transformers
    engine."""
    from models import load_model

    folder = str(tiny("gpt2"))
    at = new_app({"model": "custom_scratch", "custom_model": folder})
    assert not at.exception and not at.error
    ours, theirs = load_model(folder, backend="scratch").attend(COFFEE), load_model(folder).attend(COFFEE)
    fig, zs = grid(at)
    for h, z in enumerate(zs):  # a later key is not drawn (NaN): a decoder's query never sees it
        assert np.isnan(z[np.triu_indices(len(z), 1)]).all()
        np.testing.assert_allclose(np.nan_to_num(z), ours.weights[0, h], atol=TOL)
        np.testing.assert_allclose(np.nan_to_num(z), theirs.weights[0, h], atol=1e-5)
    assert "Running on **cpu** · 2 layers × 4 heads" in [c.value for c in at.sidebar.caption]
    bloom = str(tiny("bloom"))
    at = new_app({"model": "custom_scratch", "custom_model": bloom})
    said = at.error[0].value.replace("\\", "")  # shown as plain text: markdown's characters escaped
    assert not at.exception and "implements BERT encoders, RoBERTa encoders" in said and "GPT-2 decoders" in said \
        and "this model is 'bloom'" in said
    at = new_app({"model": "custom", "custom_model": bloom})
    assert not at.exception and not at.error and len(grid(at)[1]) == 4
