"""The seed's four foci: word classes checked by hand, content attention, labels on synthetic heads,
the bootstrap interval's coverage, and models without special tokens."""
import numpy as np
import pytest

from analysis import FOCI, focus_shares, profile_heads, received, sentiment_lexicon, strongest_head, word_classes
from analysis.stats import LiftBootstrap
from analysis.roles.measure import load_spacy
from models.result import Attention


@pytest.fixture(scope="module")
def nlp():
    return load_spacy()


def members(nlp, text):
    doc = nlp(text)
    return {f: [w.text for w, m in zip(doc, member) if m] for f, member in word_classes(doc).items()}


def test_word_classes_of_hand_checked_sentences(nlp):
    seed = members(nlp, "Which do you like better, coffee or tea?")
    assert seed["sentence_type"] == ["Which", "do", "?"]  # question word, inverted auxiliary, final mark
    assert seed["object"] == ["Which", "you", "coffee", "tea"]  # spaCy: "Which" is a pronoun here
    assert seed["relation"] == ["like"]
    assert seed["sentiment"] == ["like", "better"]
    assert members(nlp, "Did the children finish their homework before dinner?")["sentence_type"] == ["Did", "?"]
    assert members(nlp, "Why did the train stop near the tunnel?")["sentence_type"] == ["Why", "did", "?"]
    # a statement's auxiliary is no mark of its type; a quoted question keeps its mark
    assert members(nlp, "The cat is sleeping.")["sentence_type"] == ["."]
    assert members(nlp, '"Can you come?" she asked.')["sentence_type"] == ["Can", "?", "."]
    assert members(nlp, "Whose umbrella is this?")["sentence_type"][0] == "Whose"  # WP$
    assert members(nlp, "I love this terrible weather!")["sentiment"] == ["love", "terrible"]
    assert members(nlp, "The committee approved the budget.")["sentiment"] == ["approved"]


def test_vader_lexicon_ratings():
    lex = sentiment_lexicon()
    assert len(lex) > 7000 and lex["like"] == 1.5 and lex["better"] == 1.9 and lex["terrible"] < -2


def word_attention(doc, heads) -> Attention:
    """[CLS] + spaCy's words + [SEP] as tokens, with one head per ``heads[i](q, n) -> weights row``."""
    tokens = ["[CLS]"] + [w.text for w in doc] + ["[SEP]"]
    offsets = [(0, 0)] + [(w.idx, w.idx + len(w.text)) for w in doc] + [(0, 0)]
    special = np.array([True] + [False] * len(doc) + [True])
    n = len(tokens)
    w = np.zeros((1, len(heads), n, n), dtype=np.float32)
    for h, row in enumerate(heads):
        for q in range(n):
            w[0, h, q] = row(q, n)
    w /= w.sum(-1, keepdims=True)
    return Attention(tokens=tokens, weights=w, word_ids=[None] + list(range(len(doc))) + [None], special=special,
                     offsets=offsets, text=doc.text, model_name="synthetic", backend="test", device="cpu")


SENTENCES = [
    "Which do you like better, coffee or tea?", "The old farmer sold his cows at the market.",
    "Did the children finish their homework before dinner?", "What a beautiful garden you have!",
    "My sister loves long novels about distant planets.", "Why did the train stop near the tunnel?",
    "The happy committee approved the new budget yesterday.", "Birds build nests in tall trees every spring.",
    "Can you bring some fresh bread from the bakery?", "Our kind neighbours painted their fence bright green.",
]


def synthetic_foci(doc) -> Attention:
    classes = word_classes(doc)
    at = {f: np.flatnonzero(m) + 1 for f, m in classes.items()}  # token positions of each class

    def on(positions, cls_share=0.0):
        def row(q, n):
            r = np.zeros(n)
            r[0] = cls_share
            r[positions] = (1 - cls_share) / len(positions) if len(positions) else 0
            if not len(positions):
                r[n - 1] = 1 - cls_share
            return r
        return row

    both = np.concatenate([at["object"], at["relation"]])
    return word_attention(doc, [
        on(at["sentence_type"]), on(at["object"]), on(at["relation"]), on(at["sentiment"]),
        on(at["object"], cls_share=0.8),  # parks 80% on [CLS], the rest on objects
        lambda q, n: np.ones(n),  # uniform
        on(both),  # objects and verbs alike
    ])


def test_synthetic_foci_are_labelled_exactly(nlp):
    docs = list(nlp.pipe(SENTENCES * 2))
    df = profile_heads(None, [d.text for d in docs], attentions=[synthetic_foci(d) for d in docs], nlp=nlp)
    assert df.label.tolist()[:5] == ["sentence type focus", "object focus", "relation focus", "sentiment focus",
                                     "object focus"]
    assert df.label[5] == "broad" and df.secondary[5] == ""
    # content attention: the [CLS]-parking head gives all its content attention to objects, as head 1 does
    assert df.cls[4] == pytest.approx(0.8, abs=1e-6) and df.object[4] == pytest.approx(1.0)
    assert df.object_lift[4] == pytest.approx(df.object_lift[1])
    for h, f in enumerate(FOCI):
        assert df[f][h] == pytest.approx(1.0) and strongest_head(df, f) in (h, 4)
        base = np.mean([word_classes(d)[f].mean() for d in docs if word_classes(d)[f].any()])
        assert df[f"{f}_base"][h] == pytest.approx(base) and df[f"{f}_lift"][h] == pytest.approx(1 / base)
        assert df[f"{f}_lift_lo"][h] <= df[f"{f}_lift"][h] <= df[f"{f}_lift_hi"][h]
    # the uniform head's lift is 1 for every focus
    assert all(df[f"{f}_lift"][5] == pytest.approx(1.0) for f in FOCI)
    # sentiment words are in 8 of the 10 sentences (twice over); the others are left out of that class
    with_sentiment = sum(word_classes(d)["sentiment"].any() for d in docs)
    assert df.sentiment_n[0] == with_sentiment and 0 < with_sentiment < len(docs)
    # half on objects, half on verbs: one primary focus, the other listed
    primary, other = df.label[6], df.secondary[6]
    assert {primary, other + " focus"} == {"object focus", "relation focus"}


def test_content_attention_drops_special_tokens_and_renormalises():
    w = np.array([[0.5, 0.25, 0.25, 0.0],
                  [0.6, 0.1, 0.3, 0.0],
                  [0.0, 0.2, 0.2, 0.6],
                  [1.0, 0.0, 0.0, 0.0]])
    special = np.array([True, False, False, True])
    # content rows: token 1 -> (0.25, 0.75), token 2 -> (0.5, 0.5); mean over the two queries
    np.testing.assert_allclose(received(w, special), [0, 0.375, 0.625, 0])
    shares = focus_shares(w[None, None], special, {"object": np.array([False, False, True, False]),
                                                   "relation": np.zeros(4, bool)})
    assert set(shares) == {"object"}  # no relation word: left out, not NaN
    share, base = shares["object"]
    assert share[0, 0] == pytest.approx(0.625) and base == pytest.approx(0.5)
    # nothing but special tokens: no content attention, no value
    assert focus_shares(w[None, None], np.ones(4, bool), {"object": np.ones(4, bool)}) == {}
    np.testing.assert_array_equal(received(w, np.ones(4, bool)), np.zeros(4))


def test_bootstrap_interval_covers_the_truth():
    """200 samples of 80 sentences from a known distribution: the 95% interval holds the true lift
    in about 95% of them (binomial 95% range over 200 draws: 184 to 196)."""
    rng = np.random.default_rng(7)
    truth = (3 / (3 + 5)) / 0.25  # E[share] over E[base]: Beta(3, 5) over Uniform(0.1, 0.4)
    covered = 0
    for rep in range(200):
        boot = LiftBootstrap((1,))
        shares, bases = rng.beta(3, 5, 80), rng.uniform(0.1, 0.4, 80)
        for i, (s, b) in enumerate(zip(shares, bases)):
            boot.add(rep * 1000 + i, np.array([s]), b)
        lo, hi = boot.interval()
        covered += lo[0] <= truth <= hi[0]
        assert lo[0] < shares.sum() / bases.sum() < hi[0]
    assert 180 <= covered <= 198


def test_bootstrap_sums_merge_exactly_in_any_order():
    rng = np.random.default_rng(1)
    shares, bases = rng.random((30, 2, 3)), rng.uniform(0.1, 0.5, 30)
    whole = LiftBootstrap((2, 3))
    for i in range(30):
        whole.add(i, shares[i], bases[i])
    parts = [LiftBootstrap((2, 3)) for _ in range(3)]
    for i in rng.permutation(30):  # three shards, sentences in another order
        parts[i % 3].add(int(i), shares[i], bases[i])
    parts[0].merge(parts[1])
    parts[0].merge(parts[2])
    for a, b in zip(whole.interval(), parts[0].interval()):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_a_model_without_special_tokens_keeps_every_token(tiny, nlp):
    """GPT-2 has no [CLS] or [SEP]: content attention is its attention, with nothing dropped."""
    from models import load_model

    model = load_model(tiny("gpt2"))
    texts = ["Which do you like better, coffee or tea?", "The cat sat on the mat.", "I love rain!"]
    atts = model.attend(texts)
    assert not any(a.special.any() for a in atts)
    df = profile_heads(model, texts, attentions=atts, nlp=nlp)
    from analysis.roles.measure import focus_tokens

    for f in FOCI:
        rows = [(a.weights[..., focus_tokens(a, nlp)[f]].sum(-1).mean(-1), focus_tokens(a, nlp)[f].mean())
                for a in atts if focus_tokens(a, nlp)[f].any()]
        want = np.mean([r[0] for r in rows], axis=0).ravel()
        np.testing.assert_allclose(df[f], want, atol=1e-6)
        np.testing.assert_allclose(df[f"{f}_base"], np.mean([r[1] for r in rows]), atol=1e-12)
        assert df[f"{f}_n"][0] == len(rows) and np.isfinite(df[f"{f}_lift"]).all()
