"""What people paste, through the core and the figures: a correct result or a plain sentence.

Every result is checked against the tokenizer (tokens and character offsets), against the other
engine (the same weights from our encoder), and for well-formed weights; then the model is used
again, to show that nothing was left broken.
"""
import numpy as np
import pytest

from analysis import make_view
from analysis.attention.views import token_label
from models import HeadLensError, load_model
from models import limits
from viz.figures import head_grid, head_heatmap, safe, visible

HARD = {
    "one character": "a",
    "emoji sequences and flags": "Family 👨‍👩‍👧‍👦, thumbs 👍🏽 and flags 🇫🇷🇯🇵!",
    "CJK": "我喜欢喝茶。日本語のテキストです。",
    "right-to-left": "مرحبا بالعالم and שלום עולם",
    "zero-width and soft hyphen": "zero\u200bwidth join\u200der soft\u00adhyphen \ufeffmark",
    "control characters": "bell\x07 escape\x1b[31m red\x7f tab\there",
    "bidi override": "abc \u202edcba\u202c xyz",
    "combining marks": "Cafe\u0301 nai\u0308ve",
    "markup": '<script>alert(1)</script> <img src=x onerror=alert(2)> & "quotes"',
}

NOTHING_TO_READ = {
    "empty": ("", "is empty"),
    "whitespace": (" \t\n", "is empty"),
    "wide spaces": ("\u00a0\u3000", "is empty"),
    "zero-width only": ("\u200b\u200d\u00ad", "nothing the model can read"),
    "control only": ("\x00\x01\x02", "nothing the model can read"),
    "lone surrogate": ("half \ud800 pair", "not valid Unicode"),
}


def assert_well_formed(att, text, model):
    enc = model.tokenizer(text, truncation=True, max_length=model.max_tokens, return_offsets_mapping=True)
    assert att.tokens == model.tokenizer.convert_ids_to_tokens(enc["input_ids"])
    assert att.offsets == [tuple(o) for o in enc["offset_mapping"]]
    assert np.isfinite(att.weights).all()
    np.testing.assert_allclose(att.weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("name", list(HARD))
def test_hard_text_is_read_as_the_tokenizer_reads_it(name, hf_model, scratch_model):
    text = HARD[name]
    att = hf_model.attend(text)
    assert_well_formed(att, text, hf_model)
    np.testing.assert_allclose(scratch_model.attend(text).weights, att.weights, atol=1e-5)
    # merged words are the characters of the text behind them; rows still sum to 1
    v = make_view(att, hide_special=True, merge_words=True)
    for label, (first, last) in zip(v.key_labels, v.key_spans):
        start, end = att.offsets[first][0], att.offsets[last - 1][1]
        assert label == (text[start:end] if last - first > 1 else token_label(att.tokens[first]))
    np.testing.assert_allclose(v.weights.sum(-1), 1.0, atol=1e-5)


def test_unknown_characters_keep_their_place_in_the_text(hf_model):
    text = HARD["emoji sequences and flags"]
    att = hf_model.attend(text)
    unknown = [text[a:b] for tok, (a, b) in zip(att.tokens, att.offsets) if tok == "[UNK]"]
    assert unknown and all(s.strip() for s in unknown)
    assert "".join(unknown).replace("\u200d", "") == "".join(
        ch for ch in text if ord(ch) > 0x2000 and ch != "\u200d")


@pytest.mark.parametrize("name", list(NOTHING_TO_READ))
def test_nothing_to_read_gets_a_sentence(name, hf_model):
    text, message = NOTHING_TO_READ[name]
    with pytest.raises(HeadLensError, match=message):
        hf_model.attend(text)
    with pytest.raises(HeadLensError, match=f"Text 2 (is empty|has nothing|holds)"):
        hf_model.attend(["fine", text])
    assert hf_model.attend("still works").tokens[1:3] == ["still", "works"]


@pytest.mark.parametrize("text", ["word " * 2000, " ".join(["tok"] * 600)], ids=["10000 characters", "600 words"])
def test_long_text_is_cut_at_the_model_limit(text, hf_model):
    att = hf_model.attend(text)
    full = hf_model.tokenizer(text, verbose=False)["input_ids"]
    assert att.truncated and att.n_tokens_original == len(full) > 512
    assert len(att.tokens) == 512 and att.tokens[-1] == "[SEP]"
    assert att.tokens[:-1] == hf_model.tokenizer.convert_ids_to_tokens(full[:511])


def test_one_text_attention_is_capped(monkeypatch, minilm_dir):
    # 6 layers x 12 heads x 4 bytes = 288 bytes a token pair: a 100-token budget
    monkeypatch.setattr(limits, "MAX_ATTENTION_BYTES", 288 * 100 * 100)
    model = load_model()
    assert model.max_tokens == 100
    att = model.attend("word " * 300)
    assert len(att.tokens) == 100 and att.truncated and att.weights.nbytes <= limits.MAX_ATTENTION_BYTES


@pytest.mark.slow
def test_batches_stay_within_the_memory_budget(monkeypatch, hf_model):
    texts = ["short one", "word " * 200, "a medium sentence about the cat on the mat", "word " * 60, "x"] * 3
    single = [hf_model.attend(t) for t in texts]
    budget = hf_model.bytes_per_token_pair * 130**2 * 2
    monkeypatch.setattr(limits, "MAX_BATCH_BYTES", budget)
    lengths = hf_model.token_counts(texts)
    groups = limits.batches(lengths, 32, hf_model.bytes_per_token_pair)
    assert sorted(i for g in groups for i in g) == list(range(len(texts)))
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) ** 2 * hf_model.bytes_per_token_pair <= budget
    reports = []
    batched = hf_model.attend(texts, progress=lambda done, total: reports.append(done))
    assert len(reports) == len(groups) > 2 and reports[-1] == len(texts)
    for a, b in zip(batched, single):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-5)


def test_labels_and_titles_show_controls_and_markup_literally(hf_model):
    text = HARD["control characters"] + " " + HARD["bidi override"] + " <b>&"
    att = hf_model.attend(text)
    v = make_view(att)
    fig = head_heatmap(v.head(0, 0), v.query_labels, v.key_labels, title=text)
    title = fig.layout.title.text
    assert title == safe(text) and "\x07" not in title and "\u202e" not in title
    assert "␇" in title and "␛" in title and "&lt;b&gt;&amp;" in title
    assert visible("a\tb\nc") == "a b c" and visible("x\u200dy") == "x\u200dy"
    grid = head_grid(v.weights[0], v.query_labels, v.key_labels, [0, 1], title=text)
    assert grid.layout.title.text == title


def test_many_threads_share_one_model(hf_model):
    """App sessions are threads over one cached model: concurrent calls give each its own answer."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"Sentence {i} has {'many ' * i}words in it." for i in range(16)]
    serial = [hf_model.attend(t) for t in texts]
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(lambda t: hf_model.attend(t), texts * 3))
    for i, att in enumerate(parallel):
        ref = serial[i % len(texts)]
        assert att.tokens == ref.tokens
        np.testing.assert_allclose(att.weights, ref.weights, atol=1e-5)
