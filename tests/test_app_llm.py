"""Every page with the bundled SmolLM2, a decoder LLM, in AppTest: a decoder's words (no [CLS] or [SEP]),
the causal upper triangle drawn as not visible, the first token (a sink) left out of content
attention, rollout with causal rows, and Pruning by next-token loss; on both engines."""
import numpy as np
import pytest
import torch

from analysis import flow, head_importance, rollout
from analysis.roles.foci import received
from tests.conftest import COLD_RUN_S, ROOT, decode, figures, heatmaps
from viz.figures import HIDDEN_COLOR

TEXT = "Which do you like better, coffee or tea?"
SENTENCES = [TEXT, "The cat sat on the mat because it was warm.", "Seven kites drifted over the harbour."]
PAGES = sorted(f"app_pages/{p.name}" for p in (ROOT / "app_pages").glob("*.py") if p.name != "__init__.py")


def llm(new_app, page=None, engine="smollm2_scratch", **params):
    return new_app({"model": engine, "text": TEXT, "corpus": "sidebar", "prune_on": "sidebar", "qk_corpus": "sidebar",
                    "task_pairs": "10", "circuit_method": "eap", **params}, page=page, timeout=COLD_RUN_S)


def texts(at) -> str:
    parts = [e.value for kind in ("caption", "markdown", "info", "warning", "subheader", "title") for e in at.get(kind)]
    return " ".join(str(p) for p in parts)


@pytest.mark.parametrize("engine,sizes", [("smollm2", "30 layers × 9 heads"), ("smollm2_scratch", "30 layers × 9 heads"),
                                          ("gemma3", "18 layers × 4 heads"), ("gemma3_scratch", "18 layers × 4 heads")])
def test_every_page_opens_with_the_llm_and_speaks_of_a_decoder(new_app, engine, sizes):
    at = llm(new_app, engine=engine)
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception and not at.error, (page, at.exception, [e.value for e in at.error])
        assert sizes in texts(at)
        if page.endswith(("explore.py", "foci.py", "roles.py", "layers.py", "overview.py", "compare.py")):
            assert "[CLS]" not in texts(at).replace("([CLS], [SEP])", ""), page  # the general rule may name them


def test_explore_draws_the_upper_triangle_as_not_visible_and_the_rest_as_the_weights(new_app, smollm2):
    at = llm(new_app, layer="20")
    grid = figures(at)[0]
    att = smollm2.attend(TEXT)
    n = len(att.tokens)
    upper = np.triu(np.ones((n, n), bool), 1)
    for h, trace in enumerate(heatmaps(grid)):
        z = decode(trace["z"]).astype(float)
        assert np.isnan(z[upper]).all() and not np.isnan(z[~upper]).any()
        np.testing.assert_allclose(z[~upper], att.weights[20, h][~upper], atol=1e-5)
    assert grid["layout"]["plot_bgcolor"] == HIDDEN_COLOR
    assert any("not visible" in c.value for c in at.caption)
    table = at.dataframe[0].value
    assert "to the first token (sink)" in table.columns
    np.testing.assert_allclose(table["to the first token (sink)"], att.weights[20, :, :, 0].mean(-1), atol=1e-5)


def test_hiding_the_sink_drops_the_first_token_and_renormalises(new_app, smollm2):
    at = llm(new_app, layer="20", hide_special="true")
    att = smollm2.attend(TEXT)
    z = decode(heatmaps(figures(at)[0])[0]["z"]).astype(float)
    rows = att.weights[20, 0, 1:, 1:]
    want = rows / rows.sum(-1, keepdims=True)
    assert z.shape == want.shape
    lower = ~np.triu(np.ones(want.shape, bool), 1)
    np.testing.assert_allclose(z[lower], want[lower], atol=1e-5)
    assert at.sidebar.toggle[0].label == "Hide the first token (sink)"


def test_foci_shade_content_attention_without_the_sink(new_app, smollm2):
    at = llm(new_app, page="app_pages/foci.py")
    att = smollm2.attend(TEXT)
    shading = figures(at)[0]
    layer, head = at.selectbox(key="focus_sentence_type").value
    values = received(att.weights[layer, head], np.arange(len(att.tokens)) == 0)
    shown = np.concatenate([decode(t["z"]).ravel() for t in shading["data"]])
    np.testing.assert_allclose(shown, values[1:], atol=1e-5)
    assert any("to the first token (a sink)" in c.value for c in at.caption)


def test_head_roles_name_the_sink_not_cls(new_app):
    at = llm(new_app, page="app_pages/roles.py")
    labels = set(at.dataframe[0].value["label"])
    assert "first token (sink)" in labels and not labels & {"[CLS]", "[SEP] / no-op"}


def test_rollout_rows_are_causal(new_app, smollm2):
    at = llm(new_app, page="app_pages/layers.py", layer="29")
    att = smollm2.attend(TEXT)
    rolled = decode(heatmaps(figures(at)[1])[0]["z"]).astype(float)
    n = len(att.tokens)
    upper = np.triu(np.ones((n, n), bool), 1)
    assert np.isnan(rolled[upper]).all()
    want = rollout(att)[29]
    np.testing.assert_allclose(rolled[~upper], want[~upper], atol=1e-5)
    assert not np.triu(want, 1).any() and np.allclose(want.sum(-1), 1, atol=1e-5)
    flowed = decode(heatmaps(figures(at)[2])[0]["z"]).astype(float)  # flow from the last layer
    want = flow(att)
    assert np.isnan(flowed[upper]).all() and not np.triu(want, 1).any()
    np.testing.assert_allclose(flowed[~upper], want[~upper], atol=1e-5)


def test_pruning_measures_heads_by_the_gradient_of_the_next_token_loss(new_app, smollm2):
    at = llm(new_app, page="app_pages/pruning.py", text="\n".join(SENTENCES))
    grid, curves = figures(at)[:2]
    assert grid["layout"]["title"]["text"].startswith("Importance · 3 sentences · gradient of the loss")
    want = head_importance(smollm2, SENTENCES, method="gradient", measure="loss")["importance"].to_numpy()
    np.testing.assert_allclose(decode(heatmaps(grid)[0]["z"]).ravel(), want, atol=1e-4)
    titles = [a["text"] for a in curves["layout"]["annotations"]]
    assert titles[:2] == ["Next-token loss", "Top-1 agreement"]
    line = next(t for t in curves["data"] if t["name"] == "by importance" and t["xaxis"] == "x")
    assert decode(line["y"])[0] == pytest.approx(smollm2.predictions(SENTENCES)[0], rel=1e-5)
    assert [m.label for m in at.metric] == ["Next-token loss", "Top-1 agreement", "Forward time"]
    # the heads switched off together: each sentence's loss with and without them
    off = at.multiselect(key="ablate").value
    table = next(d.value for d in at.dataframe if "loss, these heads off" in d.value.columns)
    mask = torch.ones(30, 9)
    for layer, head in off:
        mask[layer, head] = 0
    with torch.inference_mode():
        for i, text in enumerate(SENTENCES):
            assert table["loss, every head"][i] == pytest.approx(float(smollm2.loss([text])), abs=1e-4)
            assert table["loss, these heads off"][i] == pytest.approx(float(smollm2.loss([text], head_mask=mask)),
                                                                     abs=1e-4)


def test_head_roles_detect_the_induction_heads_and_show_one_on_a_repeated_sequence(new_app, smollm2):
    from analysis.roles.detector import repeated_sequences

    at = llm(new_app, page="app_pages/roles.py")
    table = next(d.value for d in at.dataframe if "induction_lo" in d.value.columns)
    top = table.sort_values("induction", ascending=False).iloc[0]
    assert (top["layer"], top["head"], top["label"]) == (18, 6, "induction") and top["induction_lo"] > 0.85
    assert (table["label"] == "sink").sum() > 100
    grid = next(f for f in figures(at) if f["layout"]["title"]["text"].startswith("Decoder heads"))
    assert "induction" in str(heatmaps(grid)[0]["text"])
    example = next(f for f in figures(at) if "repeated twice" in f["layout"]["title"]["text"])
    assert example["layout"]["title"]["text"].startswith("L18 H6")
    att = smollm2.attend(repeated_sequences(smollm2.tokenizer, 1, 30)[0])
    z = decode(heatmaps(example)[0]["z"]).astype(float)
    lower = ~np.triu(np.ones(z.shape, bool), 1)
    np.testing.assert_allclose(z[lower], att.weights[18, 6][lower], atol=1e-5)
