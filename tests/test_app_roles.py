"""The Head roles page in AppTest: the grid and table are the profile of the sentences, uploads are checked."""
import numpy as np
import pytest

from analysis import profile_heads
from models.corpus import CORPUS
from tests.conftest import decode, downloads, figures, shown


@pytest.fixture(scope="module")
def corpus_profile(hf_model):
    return profile_heads(hf_model, CORPUS)


def test_grid_and_table_are_the_profile(new_app, corpus_profile):
    at = new_app(page="app_pages/roles.py")
    assert len(CORPUS) >= 300
    grid = figures(at)[0]
    cells = np.array(grid["data"][0]["text"]).ravel()
    # each cell names its head's role, "focus" left out, on two lines
    assert [c.replace("<br>", " ") for c in cells] == [r.removesuffix(" focus") for r in corpus_profile["label"]]
    assert "object focus" in corpus_profile["label"].tolist()
    table = at.dataframe[0].value
    assert table["label"].tolist() == corpus_profile["label"].tolist()
    np.testing.assert_allclose(table["prev_token"], corpus_profile["prev_token"], atol=1e-9)
    np.testing.assert_allclose(table["dep_acc"], corpus_profile["dep_acc"], atol=1e-9)
    np.testing.assert_allclose(table["object_lift_lo"], corpus_profile["object_lift_lo"], atol=1e-9)
    assert table["secondary"].tolist() == corpus_profile["secondary"].tolist()
    profile_csv = downloads(at)["Profile · CSV"].decode().splitlines()
    assert profile_csv[0].startswith("layer,head,label,secondary,prev_token") and len(profile_csv) == 73
    assert set(downloads(at)) >= {"Figure · HTML", "Profile · CSV"} and "Attention · NPZ" not in downloads(at)
    # the role picker lists every label with its count, the most common first
    counts = corpus_profile["label"].value_counts()
    assert at.selectbox(key="role").options[0] == f"{counts.index[0]} ({counts.iloc[0]} heads)"


def test_a_role_lists_its_heads_best_first_with_examples(new_app, corpus_profile, hf_model):
    at = new_app({"role": "previous token"}, page="app_pages/roles.py")
    heads = corpus_profile[corpus_profile["label"] == "previous token"].sort_values("prev_token", ascending=False)
    first = f"L{heads.iloc[0]['layer']} H{heads.iloc[0]['head']}"
    assert at.selectbox(key="role_head").options[0] == first
    layer, head = int(heads.iloc[0]["layer"]), int(heads.iloc[0]["head"])
    examples = figures(at)[1:4]
    assert len(at.tabs) == 3
    for tab, fig in zip(at.tabs, examples):  # the three sentences where this head is most previous-token-like
        sentence = shown(tab.caption[0].value)
        assert sentence in CORPUS and tab.label.startswith("prev_token ")
        assert fig["layout"]["title"]["text"] == f"L{layer} H{head} · {tab.label}"
        np.testing.assert_allclose(decode(fig["data"][0]["z"]), hf_model.attend(sentence).weights[layer, head],
                                   atol=1e-6)
    seed = figures(at)[4]
    z = np.concatenate([decode(line["z"]).ravel() for line in seed["data"]])
    want = hf_model.attend("Which do you like better, coffee or tea?").weights[layer, head].mean(axis=0)
    np.testing.assert_allclose(z, want, atol=1e-6)


def test_profile_of_the_sidebar_sentences(new_app, hf_model):
    text = "The cat sat on the mat.\nDid the dog bark at the mailman?\nClose the door!"
    at = new_app({"corpus": "sidebar", "text": text}, page="app_pages/roles.py")
    assert figures(at)[0]["layout"]["title"]["text"] == "Roles over 3 sentences"
    want = profile_heads(hf_model, text.splitlines())
    assert at.dataframe[0].value["label"].tolist() == want["label"].tolist()


@pytest.mark.parametrize("content,message", [
    (b"\x89PNG\r\n\x1a\n\x00\x00binary", "binary, not text"),
    ("Caf\u00e9 au lait.".encode("latin-1"), "not UTF-8"),
    (b"   \n\n  ", "no sentences"),
    ("\u200b\n\u00ad\n".encode(), "no sentences"),
    (b"A sentence.\n" * 83_334, "has 1,000,008 bytes; the limit is 1,000,000"),
])
def test_bad_uploads_get_a_sentence(new_app, content, message):
    at = new_app({"corpus": "upload"}, page="app_pages/roles.py")
    assert "Upload a text file" in at.info[0].value
    at.get("file_uploader")[0].upload("sentences.txt", content, "text/plain").run()
    assert not at.exception and message in shown(at.error[0].value)


def test_an_uploaded_file_is_profiled(new_app, hf_model):
    lines = ["A red kite flew over the hill.", "Who baked this bread?"]
    at = new_app({"corpus": "upload"}, page="app_pages/roles.py")
    at.get("file_uploader")[0].upload("mine.txt", "\n".join(lines).encode(), "text/plain").run()
    assert not at.exception and figures(at)[0]["layout"]["title"]["text"] == "Roles over 2 sentences"
    assert at.dataframe[0].value["label"].tolist() == profile_heads(hf_model, lines)["label"].tolist()


def test_similar_heads_are_ranked_by_divergence(new_app, hf_model):
    from analysis import head_similarity

    text = "The cat sat on the mat.\nDid the dog bark at the mailman?"
    at = new_app({"corpus": "sidebar", "text": text, "role": "previous token", "role_head": "0.2"},
                 page="app_pages/roles.py")
    assert at.selectbox(key="role_head").value == (0, 2)
    table = next(d.value for d in at.dataframe if "Jensen-Shannon divergence (nats)" in d.value.columns)
    S = head_similarity(hf_model.attend(text.splitlines()))
    row = S[layer_head := 0 * 12 + 2]
    want = [i for i in np.argsort(row) if i != layer_head][:6]
    assert (table["layer"] * 12 + table["head"]).tolist() == want
    np.testing.assert_allclose(table["Jensen-Shannon divergence (nats)"], row[want], atol=1e-9)


def test_a_focus_role_ranks_heads_and_sentences_by_lift(new_app, corpus_profile, hf_model):
    from analysis import focus_tokens

    at = new_app({"role": "object focus"}, page="app_pages/roles.py")
    heads = corpus_profile[corpus_profile["label"] == "object focus"].sort_values("object_lift", ascending=False)
    layer, head = int(heads.iloc[0]["layer"]), int(heads.iloc[0]["head"])
    assert at.selectbox(key="role_head").options[0] == f"L{layer} H{head}"
    members = at.dataframe[1].value
    assert members.columns[2:5].tolist() == ["object_lift", "object_lift_lo", "object_lift_hi"]
    np.testing.assert_allclose(members["object_lift"], heads["object_lift"], atol=1e-9)
    # the strongest sentence: its own lift, by hand: content attention on its object tokens over their share
    sentence = shown(at.tabs[0].caption[0].value)
    att = hf_model.attend(sentence)
    keep = ~att.special
    w = att.weights[layer, head][keep][:, keep].astype(np.float64)
    w /= w.sum(1, keepdims=True)
    objects = focus_tokens(att)["object"][keep]
    lift = w[:, objects].sum(1).mean() / objects.mean()
    assert at.tabs[0].label == f"object_lift {lift:.2f}"


def test_the_long_text_source_says_what_it_needs(new_app):
    """MiniLM reads 512 tokens at most: a long text needs a decoder; SmolLM2 with a short text asks for a long one."""
    at = new_app({"corpus": "document"}, page="app_pages/roles.py")
    assert not at.exception and not at.get("plotly_chart")
    assert "reads at most 512 tokens" in at.info[0].value and "SmolLM2" in at.info[0].value
    at = new_app({"corpus": "document", "model": "smollm2_scratch"}, page="app_pages/roles.py")
    assert not at.exception and not at.get("plotly_chart")
    assert "longer than 705 tokens" in at.info[0].value and "up to 4,096" in at.info[0].value
