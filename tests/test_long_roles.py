"""Head roles over a long document (``analysis.roles.long``): a one-sentence document read by an encoder
gives exactly ``measure_heads``'s profile, and a 1,000-token document read by a causal Llama gives, sentence
by sentence, the measures computed directly from every weight of the full attention."""
import itertools

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf

from analysis import measure_heads
from analysis.roles.foci import FOCI, token_classes, word_classes
from analysis.roles.long import _similarity_rows, profile_document
from analysis.roles.measure import RELATIONS, align_to_words, load_spacy, word_matrices
from analysis.attention.views import set_aside, token_label
from models import load_model
from tests.test_long import save_llama, text_of


@pytest.fixture(scope="module")
def nlp():
    return load_spacy()


def test_a_one_sentence_document_in_an_encoder_is_the_sentence_profile(tmp_path, minilm_dir, nlp):
    torch.manual_seed(0)
    wordpiece = tf.AutoTokenizer.from_pretrained(minilm_dir)
    tf.BertModel(tf.BertConfig(vocab_size=wordpiece.vocab_size, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=37, initializer_range=0.5)
                 ).eval().save_pretrained(tmp_path)
    wordpiece.save_pretrained(tmp_path)
    model = load_model(tmp_path, backend="scratch")
    text = "Which do you like better, the strong black coffee that my brother makes or the sweet tea from the shop?"
    assert len(list(nlp(text).sents)) == 1
    doc_profile = profile_document(model.attend_long(text), nlp)
    sentence = measure_heads([model.attend(text)], nlp)
    assert doc_profile.sentences[0][0] == text and doc_profile.measures.n_sentences == 1
    got, want = doc_profile.measures.frame(), sentence.frame()
    for column in want.columns:
        if not pd.api.types.is_numeric_dtype(want[column]):
            assert got[column].tolist() == want[column].tolist(), column
        else:
            np.testing.assert_allclose(got[column].to_numpy(float), want[column].to_numpy(float), atol=2e-5,
                                       err_msg=column)
    for name in ("prev_token", "punct", "noun", "object_lift", "sentiment_lift"):
        np.testing.assert_allclose(doc_profile.measures.per_sentence(name), sentence.per_sentence(name), atol=2e-5)
    assert got["noun"].gt(0).all() and got["object_n"].eq(1).all()
    ours, theirs = doc_profile.measures._totals, sentence._totals
    assert set(ours.relations) == set(theirs.relations) and ours.relation_counts == theirs.relation_counts
    for key, correct in theirs.relations.items():
        np.testing.assert_array_equal(ours.relations[key], correct, err_msg=str(key))


def entropy(rows: np.ndarray) -> np.ndarray:
    return -np.where(rows > 0, rows * np.log(np.where(rows > 0, rows, 1)), 0).sum(-1)


def test_a_causal_document_is_measured_sentence_by_sentence_in_its_context(tmp_path, nlp):
    model = load_model(save_llama(tmp_path), backend="scratch")
    text = text_of(model, 1000)
    long = model.attend_long(text)
    full = model.attend(text)
    assert long.tokens == full.tokens and len(full.tokens) == 1000
    done = []
    profile = profile_document(long, nlp, progress=lambda i, total: done.append((i, total)))
    assert done == [(i, 3) for i in range(1, 4)]
    W = full.weights.astype(np.float64)                                      # (L, H, n, n)
    n = W.shape[-1]
    spans = profile.sentences
    assert len(spans) > 20 and spans[0][1] == 0 and spans[-1][2] == n
    assert all(a[2] == b[1] for a, b in itertools.pairwise(spans))              # every token in one sentence
    assert profile.measures.n_sentences == len(spans)
    aside = set_aside(full)
    assert aside.sum() == aside[0]                                            # at most the first token, a sink
    doc = nlp(text)
    token_words = align_to_words(full, doc)
    members = {f: m & ~aside for f, m in token_classes(token_words, word_classes(doc)).items()}
    labels = [token_label(t) for t in full.tokens]
    position = np.arange(n)
    checked = 0
    for s, (sentence_text, a, b) in enumerate(spans):
        rows = np.arange(a, b)[~aside[a:b]]
        if not len(rows):
            continue
        w = W[:, :, rows]                                                     # (L, H, rows, n)
        want = {"prev_token": w[..., np.arange(len(rows)), rows - 1].mean(-1),
                "self": w[..., np.arange(len(rows)), rows].mean(-1),
                "distance": (w * np.abs(position[None, :] - rows[:, None])).sum(-1).mean(-1),
                "cls": w[..., 0].mean(-1),
                "entropy_norm": (entropy(w) / np.log(np.maximum(rows + 1, 2))).mean(-1)}
        last = b - 1
        got_final = profile.measures.per_sentence("final_mark")[s]
        if labels[last] in (".", "?", "!"):
            np.testing.assert_allclose(got_final, w[..., last].mean(-1), atol=1e-5)
        else:
            assert np.isnan(got_final).all()
        content = w[..., ~aside].sum(-1)
        for f in FOCI:
            if members[f][a:b].any():
                share = (w[..., members[f]].sum(-1) / content).mean(-1)
                base = (np.cumsum(members[f])[rows] / np.cumsum(~aside)[rows]).mean()
                want[f"{f}_lift"] = share / base
                checked += 1
        for name, value in want.items():
            np.testing.assert_allclose(profile.measures.per_sentence(name)[s], value, rtol=1e-5, atol=1e-5, err_msg=f"{name} {s}")
    assert checked > 20

    # each word's most-attended other word, as Clark et al. merge pieces, over the whole document
    Q, K = word_matrices(token_words, len(doc))
    words = Q @ W @ K                                                         # (L, H, words, words)
    present = Q.sum(axis=1) > 0
    index = np.arange(len(doc))
    words[..., index, index] = -1.0
    words[..., ~present] = -1.0
    best = words.argmax(-1)
    top2 = -np.partition(-words, 1, axis=-1)[..., :2]
    best[top2[..., 0] - top2[..., 1] < 1e-6] = -1
    totals = profile.measures._totals
    for word in doc:
        rel, dep, head = word.dep_, word.i, word.head.i
        if rel in RELATIONS and dep != head and present[dep] and present[head]:
            totals.relations[(rel, "dep2head")] -= best[..., dep] == head
            totals.relations[(rel, "head2dep")] -= best[..., head] == dep
    assert totals.relations and all(not v.any() for v in totals.relations.values())

    # head similarity: Jensen-Shannon divergence over the sampled rows, every pair of the 12 heads
    sample = _similarity_rows(~aside)
    assert len(sample) == 32 and sample[0] == int(aside[0]) and sample[-1] == n - 1
    assert np.array_equal(profile.sample, sample)
    P = W.reshape(-1, n, n)[:, sample]                                        # (LH, rows, n)
    own = entropy(P)
    mixed = entropy((P[:, None] + P[None, :]) / 2)                           # (LH, LH, rows)
    js = (mixed - (own[:, None] + own[None, :]) / 2).mean(-1)
    np.testing.assert_allclose(profile.similarity(), np.maximum(js, 0), atol=1e-6)
    np.testing.assert_allclose(profile.divergences(2, 1), np.maximum(js[9], 0), atol=1e-6)
    assert profile.divergences(2, 1)[9] == 0
    frame = profile.measures.frame()
    assert len(frame) == 12 and frame["label"].notna().all()
    assert np.allclose(frame["cls"], W[..., ~aside, 0].mean(-1).ravel(), atol=1e-6)
