"""The Head and Atlas pages in AppTest: a card from its URL, from the card button of each page that draws heads
and from a head like it; its figures against the card computed directly and the pages' own results; the atlas's
points against the atlas frame and the role grid."""
import re

import numpy as np
import pandas as pd
import pytest

from analysis.cards.atlas import atlas_frame, head_map, metrics_of
from analysis.cards.build import card_parts, head_card
from app_pages.results.messages import plain
from tests.conftest import decode, figures

HEAD, ATLAS = "app_pages/head.py", "app_pages/atlas.py"


@pytest.fixture(scope="module")
def minilm_parts(hf_model):
    """Every head's card parts computed directly; their explanations (on the built-in paragraphs) handed to the app as
    the server's preparation of the default model hands them (``app_pages.ui.preload``), computed once."""
    from app_pages.results.explanations import explanations, paragraphs
    from app_pages.results.models import ModelRef

    parts = card_parts(hf_model)
    explanations.cache.put(explanations.key(*paragraphs(ModelRef("minilm"), False, ())), parts.explanations)
    return parts


def table(at, first: str) -> pd.DataFrame:
    """The Markdown table on the page whose first column is ``first``, its cells as the reader sees them."""
    text = next(m.value for m in at.markdown if m.value.startswith(f"| {plain(first)} |"))
    rows = [[re.sub(r"\\(.)", r"\1", c.strip()) for c in line.strip("|").split(" | ")]
            for line in text.splitlines() if not line.startswith("|---")]
    return pd.DataFrame(rows[1:], columns=rows[0])


def title(at) -> str:
    return at.title[0].value


def test_a_card_from_its_url_is_the_card_computed_directly(new_app, hf_model, minilm_parts):
    from app_pages.results.profiles import profile_similarity

    profile_similarity.cache.clear()
    at = new_app({"head": "2.5"}, page=HEAD)
    assert title(at) == "L2 H5 · all-MiniLM-L6-v2"
    assert not profile_similarity.cache._items  # Head roles' similarity of every pair of heads: not the card's
    card = head_card(hf_model, 2, 5, parts=minilm_parts)
    top = table(at, "weight")
    np.testing.assert_allclose(top["weight"].astype(float), card.top["weight"], atol=5e-4)
    assert top["context"].tolist() == card.top["snippet"].tolist()
    assert card.summary().split(":")[1].strip().split(";")[0] in at.markdown[0].value  # its role, in words
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Entropy"] == f"{card.measures['entropy']:.2f} nats"
    foci = table(at, "seed focus")  # the seed foci's lifts with their intervals
    np.testing.assert_allclose(foci["lift over uniform"].astype(float),
                               [card.measures[f"{f}_lift"] for f in ("sentence_type", "object", "relation", "sentiment")],
                               atol=5e-3)
    # the default encoder's effects: each of its built-in pairs patched, as Effects patches it, and its first task
    from analysis.defaults import ENCODER_PAIRS
    from analysis.effects import patch_heads

    pairs = table(at, "built-in pair")
    assert len(pairs) == len(ENCODER_PAIRS)
    for row in pairs.itertuples(index=False):
        p = ENCODER_PAIRS[row[0]]
        want = patch_heads(hf_model, p.clean, p.corrupted, p.answer, p.distractor).set_index(["layer", "head"])
        assert float(row[3]) == pytest.approx(want.loc[(2, 5), "recovered"], abs=5e-4)
    assert metrics["Objects, 50 pairs: mean recovered"] == f"{card.task['mean']:+.3f}"
    like = [b.label for b in at.button if b.key.startswith("like-")]
    assert like[0].startswith(f"{card.like.iloc[0]['name']} · ")
    at.button(key=next(b.key for b in at.button if b.key.startswith("like-"))).click().run()
    assert title(at) == f"{card.like.iloc[0]['name']} · all-MiniLM-L6-v2"


@pytest.mark.parametrize("page, params, button", [
    ("app_pages/explore.py", {"layer": "3", "head": "7"}, "explore-card"),
    ("app_pages/roles.py", {"role": "object focus", "role_head": "2.5"}, "roles-card"),
    ("app_pages/compare.py", {"p1_layer": "4", "p1_head": "1"}, "p1_card"),
    ("app_pages/overview.py", {}, "overview-card"),
])
def test_each_page_that_draws_heads_opens_a_card(new_app, page, params, button):
    at = new_app(params, page=page)
    label = at.button(key=button).label
    at.button(key=button).click().run()
    assert not at.exception
    name = title(at).split(" · ")[0]
    assert name in label or label == "Open its card"
    if page == "app_pages/overview.py":
        assert name == "L0 H0"
    else:
        assert name == {"explore": "L3 H7", "roles": "L2 H5", "compare": "L4 H1"}[page.split("/")[1][:-3]]


def test_the_atlas_points_are_the_atlas_frame_and_its_map(new_app, minilm_parts):
    frame = atlas_frame(minilm_parts)
    assert frame.attrs["effect"] == "Objects, 50 pairs: mean recovered"  # the default encoder's first task
    at = new_app({"atlas_x": "prev_token", "atlas_y": "effect"}, page=ATLAS)
    fig = figures(at)[0]
    xs = np.concatenate([decode(t["x"]) for t in fig["data"]])
    ys = np.concatenate([decode(t["y"]) for t in fig["data"]])
    heads = np.concatenate([decode(t["customdata"]).reshape(-1, 2).astype(int) for t in fig["data"]])
    order = np.lexsort((heads[:, 1], heads[:, 0]))
    np.testing.assert_allclose(xs[order], frame["prev_token"], atol=1e-9)
    np.testing.assert_allclose(ys[order], frame["effect"], atol=1e-9)
    roles = {t["name"]: {tuple(h) for h in decode(t["customdata"]).reshape(-1, 2).astype(int)} for t in fig["data"]}
    for r in frame.itertuples():
        assert (r.layer, r.head) in roles[r.role]  # coloured by the role grid's label
    at.segmented_control(key="atlas_plot").set_value("map").run()
    fig = figures(at)[0]
    mapped = head_map(frame, metrics_of(frame))
    xs = np.concatenate([decode(t["x"]) for t in fig["data"]])
    ys = np.concatenate([decode(t["y"]) for t in fig["data"]])
    np.testing.assert_allclose(xs[order], mapped["x"], atol=1e-9)
    np.testing.assert_allclose(ys[order], mapped["y"], atol=1e-9)


def test_a_decoders_card_reads_the_effects_pages_own_results(new_app, smollm2):
    """SmolLM2's L23 H3 opened from Effects' card button: each pair's patching and attribution on the card are the
    Effects page's shared results for that pair (the first also against patching computed here), and the task's
    mean is the task table's."""
    from analysis.defaults import PAIRS
    from analysis.effects import patch_heads
    from app_pages.results.card import task_heads
    from app_pages.results.effects import effects
    from app_pages.results.models import ModelRef

    at = new_app({"model": "smollm2"}, page="app_pages/effects.py")
    at.button(key="effects-card").click().run()
    assert not at.exception and title(at) == "L23 H3 · SmolLM2-135M-Instruct"
    pairs = table(at, "built-in pair")
    ref = ModelRef("smollm2").editable()
    for row in pairs.itertuples():
        found = effects.peek(ref, PAIRS[row[1]], "exact").heads.set_index(["layer", "head"]).loc[(23, 3)]
        assert float(row[4]) == pytest.approx(found["recovered"], abs=5e-4)
    first = next(iter(PAIRS.values()))
    direct = patch_heads(smollm2, first.clean, first.corrupted, first.answer, first.distractor)
    assert float(pairs.iloc[0, 3]) == pytest.approx(direct.set_index(["layer", "head"]).loc[(23, 3), "recovered"],
                                                    abs=5e-4)
    task = task_heads.peek(ModelRef("smollm2")).set_index(["layer", "head"]).loc[(23, 3)]
    shown = next(m for m in at.metric if m.label.endswith("mean recovered"))
    assert shown.value == f"{task['mean']:+.3f}"
    assert any(b.key.startswith("like-SmolLM2") for b in at.button)


@pytest.mark.parametrize("page, what", [(HEAD, "A head's card"), (ATLAS, "The atlas")])
def test_an_encoder_decoder_gets_a_sentence_on_the_card_and_the_atlas(new_app, tiny, page, what):
    """BART has an encoder and a decoder, and a card or the atlas does not say which part a head is in: the page says
    so and which pages do show its heads, and draws nothing."""
    folder = str(tiny("bart"))
    at = new_app({"model": "custom", "custom_model": folder, "text": "The cat sat."}, page=page)
    assert not at.exception and not at.error
    assert any(i.value.startswith(f"{what} reads an encoder or a decoder; ") and "has both" in i.value
               and "Explore or Compare" in i.value for i in at.info), [i.value for i in at.info]
    assert not figures(at)


def test_the_default_encoder_says_why_a_head_attends_on_the_card_and_in_explore(new_app, scratch_model):
    """On all-MiniLM-L6-v2 the card's "why" section and Explore's (its button, then a click on a cell) split the
    head's score as ``qk_attribution`` does; a query sees the keys after it too."""
    from analysis import qk_attribution as QA

    text = "Which do you like better, coffee or tea?"
    at = new_app({"head": "3.11", "text": text}, page=HEAD)
    assert not at.exception and not at.error
    assert "Why it attends here" in [h.value for h in at.subheader]
    split = QA.qk_attribution(scratch_model, text, 3, 11)
    assert at.selectbox(key="why_key").value == split.key
    assert len(at.selectbox(key="why_key").options) == len(split.tokens)  # every key, after the query too
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Score"] == f"{split.scores[split.key]:+.2f}"
    assert metrics["Weight"] == f"{split.weights[split.key]:.2f}"
    at.selectbox(key="why_query").set_value(1).run()
    early = QA.qk_attribution(scratch_model, text, 3, 11, query=1)
    assert early.key > 1 and at.selectbox(key="why_key").value == early.key  # "which" looks ahead
    assert {m.label: m.value for m in at.metric}["Score"] == f"{early.scores[early.key]:+.2f}"

    at = new_app({"text": text, "layer": "3", "head": "11"}, page="app_pages/explore.py")
    assert not at.exception and not at.error
    cells = [t for t in figures(at)[0]["data"] if t.get("name") == "cells"]
    assert cells and len(cells[0]["customdata"]) == len(cells[0]["x"])  # every cell takes a click
    at.button(key="explore-why-open").click().run()
    assert "Why it attends here" in [h.value for h in at.subheader]
    assert {m.label: m.value for m in at.metric}["Score"] == f"{split.scores[split.key]:+.2f}"

def test_a_decoders_card_opens_on_its_induction_head_shown_on_the_sentence_twice(new_app, smollm2):
    """SmolLM2's Head page with the sidebar untouched opens on its induction head, L18 H6, shown on the founding
    sentence twice with the first token set aside: the heatmap is the head's attention on that text, each row
    renormalised without the first token, and on the second copy it puts most of its weight on the token that
    followed the earlier occurrence (on the sentence once, it shows almost only its sink)."""
    from models.corpus import DEFAULT_TEXT

    at = new_app({"model": "smollm2"}, page=HEAD)
    assert not at.exception and title(at) == "L18 H6 · SmolLM2-135M-Instruct"
    assert any(h.value == "Its habit, on a text that shows it" for h in at.subheader)
    assert any(c.value.startswith("Your sentence twice. An induction head shows its habit") for c in at.caption)
    heat = next(f for f in figures(at) if f["layout"]["title"]["text"].startswith("L18 H6 on a text"))
    z = decode(heat["data"][0]["z"]).astype(float)
    att = smollm2.attend(f"{DEFAULT_TEXT} {DEFAULT_TEXT}")
    w = att.weights[18, 6][1:, 1:].astype(float)
    w = w / w.sum(1, keepdims=True)
    lower = ~np.triu(np.ones(w.shape, bool), 1)
    np.testing.assert_allclose(z[lower], w[lower], atol=1e-5)
    tokens, n = att.tokens[1:], len(att.tokens[1:])
    after = [(q, max(j for j in range(q - 1) if tokens[j] == tokens[q]) + 1) for q in range(n)
             if any(tokens[j] == tokens[q] for j in range(q - 1))]
    assert len(after) >= 8 and np.mean([z[q, k] for q, k in after]) > 0.8


def before_the_card(monkeypatch, **params):
    """The Head page with ``params`` in its URL, its card's parts never gathered: what it drew before them."""
    from streamlit.testing.v1 import AppTest

    from app_pages.results import card as results
    from tests.conftest import ROOT, components_scanned_once

    def not_gathered(*args, **kwargs):
        raise RuntimeError("the card's parts are not gathered yet")

    monkeypatch.setattr(results, "card_parts", not_gathered)
    components_scanned_once()
    at = AppTest.from_file(ROOT / "headlens.py", default_timeout=300)
    at.switch_page(HEAD)
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    assert at.exception and not any(h.value == "Over the built-in corpus" for h in at.subheader)
    return at


def test_an_encoders_head_is_drawn_on_the_sentence_before_its_card_is_gathered(hf_model, monkeypatch):
    """MiniLM's Head page draws the head's attention on the sidebar's sentence before it gathers the card over the
    corpus (two seconds and more on a cold server): with the gathering failing, the heatmap is already there, and
    it is the head's attention on the sentence."""
    from models.corpus import DEFAULT_TEXT

    at = before_the_card(monkeypatch, head="2.5")
    heat = next(f for f in figures(at) if f["layout"]["title"]["text"] == "L2 H5 on your sentence")
    z = decode(heat["data"][0]["z"]).astype(float)
    np.testing.assert_allclose(z, hf_model.attend(DEFAULT_TEXT).weights[2, 5], atol=1e-5)


def test_a_decoders_induction_head_is_drawn_on_the_repeat_before_its_card_is_gathered(smollm2, monkeypatch):
    """SmolLM2's opening head, L18 H6, which its detector labels induction, is drawn on the founding sentence twice
    before its card is gathered over the corpus (a minute on a cold server): the heatmap is there with the gathering
    failing, and it is the head's attention on that text, the first token set aside."""
    from models.corpus import DEFAULT_TEXT

    at = before_the_card(monkeypatch, model="smollm2")
    heat = next(f for f in figures(at) if f["layout"]["title"]["text"].startswith("L18 H6 on a text"))
    z = decode(heat["data"][0]["z"]).astype(float)
    w = smollm2.attend(f"{DEFAULT_TEXT} {DEFAULT_TEXT}").weights[18, 6][1:, 1:].astype(float)
    w = w / w.sum(1, keepdims=True)
    lower = ~np.triu(np.ones(w.shape, bool), 1)
    np.testing.assert_allclose(z[lower], w[lower], atol=1e-5)
    assert any(c.value.startswith("Your sentence twice. An induction head") for c in at.caption)
