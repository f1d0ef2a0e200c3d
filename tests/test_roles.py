"""Head roles on synthetic attention with known patterns, a hand-checked parse, and subword alignment."""
import numpy as np
import pytest

from analysis.roles.measure import align_to_words, load_spacy, profile_heads
from analysis.attention.similarity import head_similarity
from models.result import Attention

SENTENCES = [
    "The old farmer sold his cows at the market.",
    "Did the children finish their homework before dinner?",
    "Please close the heavy door quietly.",
    "What a beautiful garden you have!",
    "My sister reads long novels about distant planets.",
    "The committee approved the new budget yesterday.",
    "Birds build nests in tall trees every spring.",
    "Can you bring some fresh bread from the bakery?",
    "The engineer who designed the bridge received an award.",
    "Our neighbours painted their fence bright green.",
    "A small boat crossed the lake at dawn.",
    "Why did the train stop near the tunnel?",
] * 2


@pytest.fixture(scope="module")
def nlp():
    return load_spacy()


def word_tokens(doc):
    """[CLS] + spaCy's words + [SEP], with character offsets: tokens are words here."""
    tokens = ["[CLS]"] + [w.text for w in doc] + ["[SEP]"]
    offsets = [(0, 0)] + [(w.idx, w.idx + len(w.text)) for w in doc] + [(0, 0)]
    special = np.array([True] + [False] * len(doc) + [True])
    return tokens, offsets, special


PATTERNS = ["previous token", "[CLS]", "[SEP] / no-op", "broad", "object focus", "syntax", "next token",
            "sentence type focus", "relation focus"]


def synthetic(doc) -> Attention:
    """One layer, one head per pattern above, each row a distribution over keys."""
    tokens, offsets, special = word_tokens(doc)
    n = len(tokens)
    w = np.zeros((1, len(PATTERNS), n, n), dtype=np.float32)
    nouns = [i + 1 for i, word in enumerate(doc) if word.pos_ in ("NOUN", "PROPN")]
    last = n - 2  # the sentence-final mark
    for q in range(n):
        w[0, 0, q, max(q - 1, 0)] = 1
        w[0, 1, q, 0] = 1
        w[0, 2, q, n - 1] = 1
        w[0, 3, q, :] = 1 / n
        w[0, 4, q, nouns] = 1 / len(nouns)
        dets = [c.i for c in doc[q - 1].children if c.dep_ == "det"] if 0 < q < n - 1 else []
        w[0, 5, q, dets[0] + 1 if dets else n - 1] = 1  # a noun looks at its determiner, the rest at [SEP]
        if 0 < q < n - 1 and doc[q - 1].head.i != q - 1:
            w[0, 8, q, doc[q - 1].head.i + 1] = 1  # each word looks at its syntactic head, most often a verb
        else:
            w[0, 8, q, n - 1] = 1
        w[0, 6, q, min(q + 1, n - 1)] = 1
        w[0, 7, q, last] = 1
    return Attention(tokens=tokens, weights=w, word_ids=[None] + list(range(len(doc))) + [None], special=special,
                     offsets=offsets, text=doc.text, model_name="synthetic", backend="test", device="cpu")


def test_known_patterns_get_their_labels(nlp):
    docs = list(nlp.pipe(SENTENCES))
    assert all(d[-1].text in "?.!" for d in docs)
    df = profile_heads(None, SENTENCES, attentions=[synthetic(d) for d in docs], nlp=nlp)
    labels = df.label.tolist()
    assert labels[:5] == PATTERNS[:5] and labels[6:] == PATTERNS[6:]
    assert labels[5] == "syntax: det" and df.sep[5] > 0.6  # syntax before special tokens
    # a head that follows every dependency lands on verbs: a relation focus first, its syntax in the columns
    assert df.dep_acc[8] == pytest.approx(1.0) and df.relation_lift_lo[8] > 1.5
    assert df.prev_token[0] == pytest.approx(1.0) and df.cls[1] == pytest.approx(1.0)
    assert df.sep[2] == pytest.approx(1.0) and df.entropy_norm[3] == pytest.approx(1.0)
    assert df.noun[4] == pytest.approx(1.0) and df.dep_acc[5] > 0.9  # "What a …" has two determiners
    assert df.final_mark[7] == pytest.approx(1.0)


def test_uniform_attention_is_no_syntax(nlp):
    docs = list(nlp.pipe(SENTENCES))
    df = profile_heads(None, SENTENCES, attentions=[synthetic(d) for d in docs], nlp=nlp)
    assert df.dep_acc[3] == 0.0  # ties name no word, so a uniform head tracks no relation


def test_dependency_accuracy_on_a_hand_checked_parse(nlp):
    text = "The cat chased the mouse."
    doc = nlp(text)
    # checked by hand: The <-det- cat <-nsubj- chased -dobj-> mouse -det-> the
    assert [(w.text, w.dep_, w.head.text) for w in doc] == [
        ("The", "det", "cat"), ("cat", "nsubj", "chased"), ("chased", "ROOT", "chased"),
        ("the", "det", "mouse"), ("mouse", "dobj", "chased"), (".", "punct", "chased")]
    tokens, offsets, special = word_tokens(doc)
    n = len(tokens)
    w = np.full((1, 1, n, n), 0.01, dtype=np.float32)
    # from each word, its strongest other word: The->cat (right), cat->chased (right),
    # the->cat (wrong, head is mouse), mouse->the (wrong, head is chased)
    for src, dst in [(1, 2), (2, 3), (4, 2), (5, 4), (3, 5), (6, 3)]:
        w[0, 0, src, dst] = 0.9
    w /= w.sum(-1, keepdims=True)
    att = Attention(tokens=tokens, weights=w, word_ids=[None, 0, 1, 2, 3, 4, 5, None], special=special,
                    offsets=offsets, text=text, model_name="t", backend="t", device="cpu")
    from analysis.roles import measure as roles

    totals = roles._Totals((1, 1))
    roles._word_measures(att, doc, totals)
    correct = {k: float(v[0, 0]) for k, v in totals.relations.items()}
    assert totals.relation_counts[("det", "dep2head")] == 2
    assert correct[("det", "dep2head")] == 1  # The->cat right, the->cat wrong
    assert correct[("nsubj", "dep2head")] == 1 and correct[("dobj", "dep2head")] == 0
    assert correct[("dobj", "head2dep")] == 1  # chased's strongest other word is mouse
    assert totals.offsets[("det", "dep2head")] == {1: 2}


def test_subword_pieces_align_to_spacy_words(hf_model, nlp):
    text = "Tokenization isn't unbelievably hard."
    att = hf_model.attend(text)
    doc = nlp(text)
    owners = align_to_words(att, doc)
    words = {}
    for token, owner in zip(att.tokens, owners):
        if owner is not None:
            words.setdefault(doc[owner].text, []).append(token)
    assert words["Tokenization"] == ["token", "##ization"]
    assert words["unbelievably"] == ["un", "##bel", "##ie", "##va", "##bly"]
    assert words["is"] == ["isn"] and words["n't"] == ["'", "t"]  # spaCy splits is|n't, BERT isn|'|t
    assert owners[0] is None and owners[-1] is None


def test_real_model_profile(hf_model, nlp):
    df = profile_heads(hf_model, SENTENCES, nlp=nlp)
    assert len(df) == 72 and set(df.columns) >= {"layer", "head", "prev_token", "next_token", "self", "cls", "sep",
                                                  "punct", "entropy", "dep_relation", "dep_acc", "label",
                                                  "object_lift_lo", "secondary"}
    row = df[(df["layer"] == 0) & (df["head"] == 2)].iloc[0]
    assert row.prev_token > 0.9 and row.label == "previous token"
    sums = df[["prev_token", "next_token", "self"]].sum(axis=1)
    assert (sums <= 1 + 1e-6).all()


def test_head_similarity(nlp):
    docs = list(nlp.pipe(SENTENCES[:4]))
    S = head_similarity([synthetic(d) for d in docs])
    assert S.shape == (9, 9) and np.allclose(np.diag(S), 0) and np.allclose(S, S.T)
    assert S[0, 6] == pytest.approx(np.log(2), abs=1e-6)  # disjoint one-hot patterns: JS is ln 2


def test_head_similarity_of_long_sentences_is_computed_in_small_steps(monkeypatch, hf_model):
    """A 512-token sentence once needed 11 GB here; in steps the divergences are the same numbers."""
    from analysis.attention import similarity

    atts = hf_model.attend(["The cat sat on the mat because it was warm.", "Did the dog bark?"])
    full = head_similarity(atts)
    monkeypatch.setattr(similarity, "SIMILARITY_CHUNK_BYTES", 8 * 13 * 100)  # at most 100 pairs of heads a step
    np.testing.assert_allclose(head_similarity(atts), full, atol=1e-12)
    # against the definition, for heads 5 and 40: JS of each query row, averaged over all rows
    def js_rows(att, i, j):
        w = att.weights.reshape(72, *att.weights.shape[2:]).astype(np.float64)
        m = (w[i] + w[j]) / 2
        kl = [np.where(p > 0, p * np.log(p / m), 0.0).sum(-1) for p in (w[i], w[j])]
        return (kl[0] + kl[1]) / 2

    rows = np.concatenate([js_rows(att, 5, 40) for att in atts])
    assert len(rows) == 13 + 7 and full[5, 40] == pytest.approx(rows.mean(), abs=1e-9)


def test_head_similarity_samples_the_rows_of_long_sentences(monkeypatch, hf_model):
    from analysis.attention import similarity

    att = hf_model.attend("The cat sat on the mat because it was warm.")  # 13 tokens
    monkeypatch.setattr(similarity, "SIMILARITY_ROW_KEYS", 13 * 4)  # so 4 evenly spaced query rows of 13
    S = head_similarity([att])
    w = att.weights.reshape(72, 13, 13).astype(np.float64)[:, [0, 4, 8, 12]]
    m = (w[3] + w[60]) / 2
    js = sum(np.where(p > 0, p * np.log(p / m), 0.0).sum(-1) for p in (w[3], w[60])) / 2
    assert S[3, 60] == pytest.approx(js.mean(), abs=1e-9)


@pytest.mark.slow
def test_a_truncated_text_is_measured_on_the_words_the_model_read(hf_model, nlp):
    """spaCy parses all 2,000 words; the model read 510. Word measures use those 510 (a 2,000-word
    matrix per head took 2.3 GB and 30 s)."""
    from analysis import measure_heads

    long = hf_model.attend("The cat sat. " * 700)
    assert long.truncated
    cut = hf_model.attend(long.text[: long.offsets[-2][1]])
    assert cut.tokens == long.tokens
    a, b = measure_heads([long], nlp), measure_heads([cut], nlp)
    for name in ("noun", "verb", "entropy", "prev_token"):
        np.testing.assert_allclose(a.per_sentence(name), b.per_sentence(name), atol=1e-9)


def test_the_shared_pipelines_parses_are_kept_and_equal_a_fresh_parse(monkeypatch, nlp):
    """Every model's profile of the built-in corpus reads the same sentences: the shared pipeline parses each once
    (the last ``PARSED_KEEP``), and what it keeps is what a fresh parse gives; another pipeline's are not kept."""
    import analysis.roles.measure as roles

    monkeypatch.setattr(roles, "_parsed", roles.OrderedDict())
    monkeypatch.setattr(roles, "PARSED_KEEP", 3)
    texts = ["The cat sat on the mat.", "Did the dog bark?", "The cat sat on the mat."]
    docs = roles.parse(texts)
    assert docs[0] is docs[2] and list(roles._parsed) == texts[1:]  # the last read last
    for doc, text in zip(docs, texts):
        fresh = load_spacy()(text)
        assert [(t.text, t.pos_, t.dep_, t.head.i) for t in doc] == [(t.text, t.pos_, t.dep_, t.head.i) for t in fresh]
    assert roles.parse(["Did the dog bark?"])[0] is docs[1]  # kept: not parsed again
    roles.parse(["One.", "Two."])
    assert list(roles._parsed) == ["Did the dog bark?", "One.", "Two."]  # the oldest went

    class Other:
        def pipe(self, texts, batch_size):
            return [load_spacy()(t) for t in texts]

    assert roles.parse(["Three."], Other())[0].text == "Three." and "Three." not in roles._parsed
