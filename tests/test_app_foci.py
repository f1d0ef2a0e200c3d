"""The Foci page in AppTest: each focus's sentence is shaded by its head's content attention."""
import io

import numpy as np
import pandas as pd
import pytest

from analysis import FOCI, profile_heads
from models.corpus import CORPUS
from tests.conftest import decode, downloads, figures, shown, title_text

PAGE = "app_pages/foci.py"
SEED = "Which do you like better, coffee or tea?"


@pytest.fixture(scope="module")
def corpus_profile(hf_model):
    return profile_heads(hf_model, CORPUS)


def content_received(weights, special):
    """By hand: drop special rows and columns, rescale rows to 1, average over the queries."""
    keep = ~special
    w = weights[keep][:, keep].astype(np.float64)
    return (w / w.sum(1, keepdims=True)).mean(0)


def shading(fig) -> tuple[list[str], np.ndarray]:
    """The cells' texts and values, in reading order, from a text_shading figure."""
    text = [t for line in fig["data"] for t in line["text"][0]]
    return text, np.concatenate([decode(line["z"]).ravel() for line in fig["data"]])


def test_each_focus_is_shaded_by_its_strongest_head(new_app, corpus_profile, hf_model):
    at = new_app(page=PAGE)
    charts = figures(at)
    assert len(charts) == 4
    att = hf_model.attend(SEED)
    for f, fig in zip(FOCI, charts):
        best = corpus_profile.sort_values(f"{f}_lift_lo", ascending=False).iloc[0]
        layer, head = int(best["layer"]), int(best["head"])
        name = f.replace("_", " ").capitalize()
        assert fig["layout"]["title"]["text"] == f"{name} · L{layer} H{head}"
        text, z = shading(fig)
        np.testing.assert_allclose(z, content_received(att.weights[layer, head], att.special), atol=1e-6)
        assert [t.removeprefix("<b>").removesuffix("</b>") for t in text] == att.tokens[1:-1]
    # the object head: coffee and tea darkest, and the object words in bold
    text, z = shading(charts[1])
    assert {text[i] for i in np.argsort(z)[-2:]} == {"<b>coffee</b>", "<b>tea</b>"}
    assert [t for t in text if t.startswith("<b>")] == ["<b>which</b>", "<b>you</b>", "<b>coffee</b>", "<b>tea</b>"]
    # beside each chart: the head's lift and interval, as the profile has them
    for f, md in zip(FOCI, [m.value for m in at.markdown if m.value.startswith("Lift")]):
        best = corpus_profile.sort_values(f"{f}_lift_lo", ascending=False).iloc[0]
        assert md.startswith(f"Lift **{best[f'{f}_lift']:.2f}**, 95% interval {best[f'{f}_lift_lo']:.2f} to "
                             f"{best[f'{f}_lift_hi']:.2f}, over {int(best[f'{f}_n'])} sentences")
    table = pd.read_csv(io.BytesIO(downloads(at)["Shading · CSV"]))
    assert table.columns[:2].tolist() == ["token", "sentence_type L3 H11"]  # the strongest head of the corpus
    assert table["token"].tolist() == att.tokens[1:-1]
    np.testing.assert_allclose(table.iloc[:, 2], shading(charts[1])[1], atol=1e-6)


def test_another_head_for_a_focus(new_app, hf_model):
    at = new_app({"focus_object": "0.2"}, page=PAGE)
    assert at.selectbox(key="focus_object").value == (0, 2)
    fig = figures(at)[1]
    assert fig["layout"]["title"]["text"] == "Object · L0 H2"
    att = hf_model.attend(SEED)
    np.testing.assert_allclose(shading(fig)[1], content_received(att.weights[0, 2], att.special), atol=1e-6)
    assert any("below the bar; labelled previous token" in m.value for m in at.markdown)


def test_merged_words_sum_their_pieces(new_app, hf_model):
    text = "Tokenization is unbelievably good?"
    at = new_app({"text": text, "merge_words": "true"}, page=PAGE)
    att = hf_model.attend(text)
    fig = figures(at)[3]  # sentiment: "good" is in VADER's lexicon
    layer, head = at.selectbox(key="focus_sentiment").value
    per_token = content_received(att.weights[layer, head], att.special)
    cells, z = shading(fig)
    assert [c.removeprefix("<b>").removesuffix("</b>") for c in cells] == ["Tokenization", "is", "unbelievably",
                                                                              "good", "?"]
    pieces = [2, 1, 5, 1, 1]  # token ##ization | is | un ##bel ##ie ##va ##bly | good | ?
    assert len(per_token) == sum(pieces)
    np.testing.assert_allclose(z, np.add.reduceat(per_token, np.cumsum([0] + pieces[:-1])), atol=1e-6)
    assert [c for c in cells if c.startswith("<b>")] == ["<b>good</b>"]


def test_foci_of_the_sidebar_sentences_leave_out_a_missing_class(new_app, hf_model):
    text = "The cat sat on the mat.\nDid the dog bark at the mailman?"
    at = new_app({"text": text, "corpus": "sidebar"}, page=PAGE)
    # neither sentence has a word in VADER's lexicon: that focus says so, the others are drawn
    assert "None of the profiled sentences has a sentiment word" in at.info[0].value
    assert len(figures(at)) == 3
    assert any("sentence type 2, object 2, relation 2, sentiment 0" in c.value for c in at.caption)
    want = profile_heads(hf_model, text.splitlines())
    best = want.sort_values("object_lift_lo", ascending=False).iloc[0]
    assert figures(at)[1]["layout"]["title"]["text"] == f"Object · L{best['layer']} H{best['head']}"


def test_a_sentence_without_a_class_word_says_so(new_app):
    at = new_app({"text": "Hello there."}, page=PAGE)
    assert not at.exception
    assert any("This sentence has no relation word" in c.value for c in at.caption)


def test_text_the_model_cannot_read_gets_a_sentence(new_app):
    at = new_app({"text": "\ufffd"}, page=PAGE)
    assert not at.exception and not figures(at)
    assert "nothing the model can read" in shown(at.error[0].value)


def test_a_profile_not_computed_yet_shows_its_first_sentences_then_the_whole(new_app, monkeypatch):
    """With the corpus's profile not there (the causal mask on: a profile of its own), the page draws Head roles over
    the first eighth of the corpus at once and says so, then this session computes the whole corpus's and the page
    runs again with it: the profile computed twice, on 41 then 335 sentences, the foci read over all of them."""
    from app_pages.results import profiles

    computed = []
    compute = profiles.corpus_profile.compute
    monkeypatch.setattr(profiles.corpus_profile, "compute",
                        lambda ref, causal, heads_off, sentences: computed.append(len(sentences))
                        or compute(ref, causal, heads_off, sentences))
    at = new_app({"model": "scratch", "causal": "true"}, page=PAGE)
    assert not at.error, [e.value for e in at.error]
    assert computed == [len(CORPUS) // 8, len(CORPUS)] == [41, 335], computed
    assert any(f"Foci found over {len(CORPUS):,} sentences" in c.value for c in at.caption)
    assert not any("first answer" in i.value.lower() for i in at.info)  # the first form's note gone with it
    at.run()
    assert computed == [41, 335]  # the whole profile is there at once now


def test_the_strongest_head_of_a_first_form_is_not_kept_once_the_whole_profile_is_in(new_app, hf_model,
                                                                                    corpus_profile, monkeypatch):
    """The pickers a first form drew default to its own strongest heads: once the whole profile takes its place, each
    focus's picker opens on the whole profile's strongest head, and nothing of the first form is in the URL."""
    from app_pages.results import shared

    first = profile_heads(hf_model, list(CORPUS)[:len(CORPUS) // 8])  # the first form: the first 41 sentences

    def strongest(frame, f):
        return tuple(int(x) for x in frame.sort_values([f"{f}_lift_lo", f"{f}_lift"], ascending=False)
                     [["layer", "head"]].iloc[0])

    assert strongest(corpus_profile, "object") != strongest(first, "object")  # it would have opened on another head
    monkeypatch.setattr(shared, "_caches", {})  # no profile computed yet, in this test alone
    at = new_app(page=PAGE)
    assert not at.error, [e.value for e in at.error]
    titles = [title_text(fig) for fig in figures(at)]
    for f, name in zip(FOCI, ("Sentence type", "Object", "Relation", "Sentiment")):
        layer, head = strongest(corpus_profile, f)
        assert f"{name} · L{layer} H{head}" in titles, (f, titles)
    assert not [k for k in at.query_params if k.endswith("_first")]
