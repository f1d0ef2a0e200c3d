"""Every head explained, on the default model in AppTest: Head roles' summary, grid, table, exports and replacement
curve; the card's sentence, score and misses on the user's text; Atlas's colour and filter; Explore's hover. The frame
each shows is ``explain_heads`` on the built-in paragraphs' halves (its scores held to transformers' attention in
test_explain_heads.py), with the count on the built-in sentences' halves beside it."""
import io
import json

import numpy as np
import pandas as pd
import pytest

from analysis.cards.card import snippet
from analysis.explanations import (EXPLAINED, corpus_halves, explain_heads, misses, read_on, replace_heads,
                                   replacement_counts)
from analysis.roles.rules import rule_named
from models.corpus import DEFAULT_TEXT, paragraph_halves
from tests.conftest import decode, downloads, figures, shown


@pytest.fixture(scope="module")
def on_paragraphs(scratch_model):
    return explain_heads(scratch_model)  # the built-in paragraphs' halves


@pytest.fixture(scope="module")
def app_explained(on_paragraphs):
    """The default model's programs on the paragraphs as the app shares them, as Head roles' button computes them
    (the page's first test presses it; a server prepares them)."""
    from app_pages.results.explanations import explanations, paragraphs
    from app_pages.results.models import ModelRef

    return explanations(*paragraphs(ModelRef("minilm"), False, ()))


@pytest.fixture(scope="module")
def on_sentences(scratch_model):
    return explain_heads(scratch_model, *corpus_halves())  # the halves the app's first form reads from its profile


def test_head_roles_explains_every_head_and_replaces_the_best_explained(new_app, on_paragraphs, on_sentences,
                                                                      scratch_model):
    explained = on_paragraphs
    at = new_app(page="app_pages/roles.py")
    assert not at.exception and not at.error
    # first the programs on the built-in sentences (seconds, from the profile), the paragraphs' on a button
    short = int(((on_sentences["score"] >= EXPLAINED) & (on_sentences["lift"] >= 3)).sum())
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Heads explained"] == f"{short} of 72" and metrics["On paragraphs"] == "…"
    at.button(key="explain-paragraphs").click().run(timeout=300)
    assert not at.exception and not at.error and not [b for b in at.button if b.key == "explain-paragraphs"]
    n = int(((explained["score"] >= EXPLAINED) & (explained["lift"] >= 3)).sum())
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Heads explained"] == f"{n} of 72" and 1 <= n <= 60
    assert metrics["On short sentences"] == f"{short} of 72" and short < n  # 8-word sentences: few keys, little lift
    assert metrics["Mean IoU of the rows"] == f"{explained['iou'].mean():.2f}"
    grid = next(f for f in figures(at) if f["layout"]["title"]["text"].startswith("Held-out score"))
    z = decode(grid["data"][0]["z"])
    np.testing.assert_allclose(z, explained["score"].to_numpy().reshape(6, 12), atol=1e-4)
    dots = next(t for t in grid["data"] if t.get("name") == "explained")  # the explained heads' dots, lift and all
    told = explained[(explained["score"] >= EXPLAINED) & (explained["lift"] >= 3)]
    assert sorted(zip(decode(dots["y"]), decode(dots["x"]))) == sorted(zip(told["layer"], told["head"])) and n
    table = at.dataframe[0].value  # Head roles' own table, with each head's rule
    assert table["rule"].tolist() == explained["rule"].tolist()
    np.testing.assert_allclose(table["explained"], explained["score"], atol=1e-4)
    mine = next(d.value for d in at.dataframe if "on_your_text" in d.value.columns)  # the sidebar's sentence
    want = read_on(explained, [scratch_model.attend(DEFAULT_TEXT)], replicates=200).set_index(["layer", "head"])
    got = mine.set_index(["layer", "head"]).loc[want.index]
    np.testing.assert_allclose(got["on_your_text"], want["score"], atol=1e-6)
    np.testing.assert_allclose(got["iou_on_your_text"], want["iou"], atol=1e-6)
    assert any(shown(c.value).startswith("On your 1 sentence: ") for c in at.caption)
    files = downloads(at)
    csv = pd.read_csv(io.BytesIO(files["Explanations · CSV"]))
    assert list(csv.columns[:4]) == ["layer", "head", "rule", "family"] and len(csv) == 72
    assert [r["rule"] for r in json.loads(files["Explanations · JSON"])] == explained["rule"].tolist()
    # a quarter of the heads, best explained first, replaced on the first 6 held-out paragraphs
    order = explained.sort_values(["iou_full", "layer", "head"], ascending=[False, True, True])
    heads = list(zip(order["layer"], order["head"]))[:18]
    fit, held = paragraph_halves()
    want = replace_heads(scratch_model, explained, heads, held[:6], means_of=fit[:16])
    assert metrics["Unedited · cosine to the unedited embedding"] == "1.000"
    assert metrics["18 best-explained replaced"] == f"{want['replaced']:.3f}"
    assert metrics["The same 18 mean-ablated"] == f"{want['mean_ablated']:.3f}"
    at.button(key="explained-whole").click().run(timeout=300)
    curve = at.dataframe[-1].value  # the curve's table, last on the page
    assert curve["k"].tolist() == replacement_counts(72) == [1, 2, 4, 7, 18, 36, 72]
    chart = next(f for f in figures(at) if f["layout"]["title"]["text"].startswith("The best-explained heads"))
    np.testing.assert_allclose(decode(chart["data"][0]["y"]), curve["replaced"])
    assert curve["replaced"].iloc[0] > curve["replaced"].iloc[-1]  # replacing more heads costs more


def test_a_card_says_its_head_in_a_sentence_with_its_held_out_score(new_app, on_paragraphs, app_explained, scratch_model):
    explained = on_paragraphs
    at = new_app({"head": "0.2"}, page="app_pages/head.py")
    assert not at.exception
    row = explained.set_index(["layer", "head"]).loc[(0, 2)]
    assert row["rule"].startswith("previous token")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Held-out score"] == f"{row['score']:.2f}" and metrics["IoU of its rows"] == f"{row['iou']:.2f}"
    texts = [shown(m.value) for m in at.markdown]
    assert f"L0 H2 {row['sentence']}." in texts
    assert row["sentence"].startswith("attends to the previous token (0.")  # its share of a row, in words
    assert "attends to the previous token (" in texts[0]  # the card's summary
    mine = read_on(explained[(explained["layer"] == 0) & (explained["head"] == 2)],
                   [scratch_model.attend(DEFAULT_TEXT)], replicates=200).iloc[0]  # the sidebar's sentence
    said = [shown(c.value) for c in (*at.caption, *at.warning) if shown(c.value).startswith("On your text: ")]
    assert said and said[0].startswith(f"On your text: {mine['score']:.2f} (IoU {mine['iou']:.2f}); on the held-out "
                                       f"paragraphs: {row['score']:.2f} [{row['lo']:.2f}, {row['hi']:.2f}]")
    # where a program fails most on the sidebar's sentence, as misses finds it on transformers' attention: none for
    # the previous-token head, some for the first head (in the frame's order) with any
    att = scratch_model.attend(DEFAULT_TEXT)
    assert misses([att], rule_named(row["rule"]), 0, 2).empty
    assert not any(shown(c.value).startswith("Where its rules fail most on your text") for c in at.caption)
    layer, head, missed = next((r.layer, r.head, m) for r in explained.itertuples()
                               if not (m := misses([att], rule_named(r.rule), r.layer, r.head)).empty)
    at = new_app({"head": f"{layer}.{head}"}, page="app_pages/head.py")
    assert any(shown(c.value).startswith("Where its rules fail most on your text") for c in at.caption)
    table = next(shown(m.value) for m in at.markdown if shown(m.value).startswith("| context | weight | on its "
                                                                                  "rules' keys |")
                 and snippet(att, int(missed.iloc[0].query), int(missed.iloc[0].key)) in shown(m.value))
    assert table.count("\n") == 1 + len(missed)  # a header, its rule and a row for each miss
    for r in missed.itertuples():
        assert f"| {snippet(att, r.query, r.key)} | {r.weight:.2f} | {r.on_rule:.2f} |" in table


def test_atlas_colours_by_rule_family_and_filters_the_explained(new_app, on_paragraphs, app_explained):
    explained = on_paragraphs
    at = new_app({"atlas_colour": "rule_family", "atlas_explained": "0.8"}, page="app_pages/atlas.py")
    assert not at.exception
    fig = figures(at)[0]
    points = sum(len(decode(t["x"])) for t in fig["data"])
    assert points == int((explained["score"] >= 0.8 - 1e-9).sum())
    families = {t["name"] for t in fig["data"]}
    assert families == set(explained.loc[explained["score"] >= 0.8, "family"])


def test_explores_hover_names_each_heads_explanation(new_app, on_paragraphs, app_explained, scratch_model):
    explained = on_paragraphs
    at = new_app({"layer": "0"}, page="app_pages/explore.py")
    assert not at.exception
    hovers = {t["name"]: t["hovertemplate"] for t in figures(at)[0]["data"] if t.get("type") == "heatmap"}
    assert len(hovers) >= 4
    for r in explained[explained["layer"] == 0].itertuples():
        if f"head {r.head}" in hovers:
            mine = read_on(explained[(explained["layer"] == 0) & (explained["head"] == r.head)],
                           [scratch_model.attend(DEFAULT_TEXT)], replicates=1).iloc[0]
            assert (f"<br>explained: {r.rule} ({r.score:.2f} held out, IoU {r.iou:.2f}; on this text "
                    f"{mine['score']:.2f})<extra>" in hovers[f"head {r.head}"])
