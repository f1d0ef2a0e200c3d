"""Queries and keys in one picture (analysis.qk_attribution.pictures): the vectors against attend(), the changes that leave every
softmax unchanged, and the faithfulness figure on cases whose answer is known."""
import numpy as np
import pandas as pd
import pytest

from analysis.qk_attribution.pictures import (QK, chance, lifted, misleads, most_attended, nearest_keys, normalised, qk_embedding, qk_heads,
                         qk_vectors)
from models import HeadLensError, load_model
from models.corpus import CORPUS
from models.training import TrainConfig, train
from tests.test_llama import TEXTS, build
from viz.qk import UNTRUSTED_COLOR, qk_tile

SENTENCES = ["Which do you like better, coffee or tea?", "The cat sat on the mat because it was warm.",
             "Did the children enjoy the film?", "Hi"]


def check_against_attend(model, sentences, atol=1e-5, heads=None):
    """Each sentence's softmax of queries times keys equals attend()'s weights, for every head or ``heads``."""
    atts = [model.attend(text) for text in sentences]
    for layer, head in heads or [(l, h) for l in range(model.n_layers) for h in range(model.n_heads)]:
        qk = qk_vectors(model, sentences, layer, head)
        assert qk.queries.shape == qk.keys.shape == (len(qk.tokens), model.head_dim)
        for i, att in enumerate(atts):
            rows = qk.tokens[qk.tokens["sentence"] == i]
            assert rows["position"].tolist() == list(range(len(att.tokens)))
            np.testing.assert_allclose(qk.weights(i), att.weights[layer, head], atol=atol)


@pytest.mark.slow
def test_minilm_vectors_give_attends_weights(scratch_model):
    check_against_attend(scratch_model, SENTENCES)
    qk = qk_vectors(scratch_model, SENTENCES[:1], 0, 0)
    assert qk.tokens["token"].tolist() == ["[CLS]", "which", "do", "you", "like", "better", ",", "coffee", "or",
                                           "tea", "?", "[SEP]"]
    assert qk.tokens["word_class"].tolist() == ["special", "sentence_type", "sentence_type", "object", "relation",
                                                "sentiment", "other", "object", "other", "object", "sentence_type",
                                                "special"]


def test_smollm2_vectors_give_attends_weights(smollm2):
    check_against_attend(smollm2, SENTENCES[:2], heads=[(0, 0), (17, 4), (29, 8)])


def test_tiny_llama_vectors_are_rotated_and_shared_by_groups(tmp_path):
    _, folder, _, _ = build("llama", tmp_path / "llama")
    model = load_model(str(folder), backend="scratch")
    check_against_attend(model, TEXTS)
    a, b = (qk_vectors(model, TEXTS, 0, h) for h in (0, 1))  # heads 0 and 1 share key/value head 0
    np.testing.assert_array_equal(a.keys, b.keys)
    assert not np.allclose(a.queries, b.queries)


def test_trained_decoder_vectors_give_attends_weights():
    run = train(TrainConfig(steps=20, log_every=10, seed=0), device="cpu")
    check_against_attend(run.model, run.held_out[:3])


def test_heads_read_together_equal_heads_read_alone(scratch_model):
    together = qk_heads(scratch_model, SENTENCES, max_bytes=1)  # one layer a pass
    alone = qk_vectors(scratch_model, SENTENCES, 4, 7)
    np.testing.assert_array_equal(together[(4, 7)].queries, alone.queries)
    np.testing.assert_array_equal(together[(4, 7)].keys, alone.keys)
    assert len(together) == 72


def test_the_transformers_engine_and_pruned_heads_get_sentences(hf_model, scratch_model, tiny):
    via_twin, ours = qk_vectors(hf_model, SENTENCES, 3, 5), qk_vectors(scratch_model, SENTENCES, 3, 5)
    np.testing.assert_array_equal(via_twin.queries, ours.queries)
    np.testing.assert_array_equal(via_twin.keys, ours.keys)
    with pytest.raises(HeadLensError, match="the from-scratch engine, which does not implement"):
        qk_vectors(load_model(tiny("bloom")), SENTENCES, 0, 0)
    with pytest.raises(HeadLensError, match="pruned away"):
        qk_vectors(scratch_model.pruned([(2, 3)]), SENTENCES, 2, 3)
    with pytest.raises(HeadLensError, match="no head 12"):
        qk_vectors(scratch_model, SENTENCES, 0, 12)


def test_moving_and_scaling_leave_every_softmax_unchanged(scratch_model):
    qk = qk_vectors(scratch_model, SENTENCES, 3, 11)
    q, k = normalised(qk.queries, qk.keys)
    np.testing.assert_allclose(q.mean(axis=0), k.mean(axis=0), atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1).mean(), np.linalg.norm(k, axis=1).mean(), rtol=1e-6)
    moved = QK(q, k, qk.tokens, qk.sentences, 3, 11, False)
    for i in range(len(SENTENCES)):
        np.testing.assert_allclose(moved.weights(i), qk.weights(i), atol=1e-6)


def test_lifting_makes_the_nearest_key_the_highest_scoring_one():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(50, 8)), rng.normal(size=(50, 8)) * rng.uniform(0.1, 3, size=(50, 1))
    ql, kl = lifted(q, k)
    nearest = ((ql[:, None] - kl[None]) ** 2).sum(-1).argmin(axis=1)
    np.testing.assert_array_equal(nearest, (q @ k.T).argmax(axis=1))
    assert not np.array_equal(((q[:, None] - k[None]) ** 2).sum(-1).argmin(axis=1), nearest)  # unlifted differs


def hand_made(queries, keys, sizes, causal=False) -> QK:
    tokens = pd.DataFrame({"sentence": np.repeat(np.arange(len(sizes)), sizes),
                           "position": np.concatenate([np.arange(n) for n in sizes]),
                           "token": [f"t{i}" for i in range(sum(sizes))], "word_class": "other"})
    return QK(np.asarray(queries, float), np.asarray(keys, float), tokens, [f"s{i}" for i in range(len(sizes))],
              0, 0, causal)


def test_faithfulness_counts_queries_nearest_their_most_attended_key():
    # sentence 0: keys on the axes; queries 0 and 1 score key 0 and key 1 highest; sentence 1 likewise
    keys = [[1, 0], [0, 1], [1, 0], [0, 1]]
    queries = [[5, 0], [0, 5], [5, 0], [0, 5]]
    qk = hand_made(queries, keys, [2, 2])
    np.testing.assert_array_equal(most_attended(qk), [0, 1, 2, 3])
    xy_q = np.array([[1.0, 0.1], [0.1, 1.0], [1.0, 0.1], [1.0, 0.1]])  # the last query drawn by the wrong key
    xy_k = np.array(keys, float)
    assert (nearest_keys(xy_q, xy_k, qk.spans, False) == most_attended(qk)).tolist() == [True, True, True, False]
    assert chance(qk.spans, False) == 0.5
    assert chance([(0, 4)], True) == pytest.approx(np.mean([1, 1 / 2, 1 / 3, 1 / 4]))


@pytest.mark.parametrize("method", ["pca", "fitted", "tsne"])
def test_a_head_that_attends_to_itself_is_drawn_with_each_query_on_its_key(method):
    # keys evenly on a circle, each query a longer copy of its own key: every query scores its own key highest,
    # and once queries and keys have the same mean length each query lies on its key
    angles = np.linspace(0, 2 * np.pi, 12, endpoint=False)
    keys = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    qk = hand_made(keys * 4, keys, [12])
    frame = qk_embedding(qk, method=method)
    assert frame.attrs["faithfulness"] == 1.0 and frame.attrs["chance"] == pytest.approx(1 / 12)
    xy = frame[["x", "y"]].to_numpy()
    if method != "tsne":  # t-SNE keeps neighbours, not distances
        np.testing.assert_allclose(xy[:12], xy[12:], atol=1e-5)
    assert frame["kind"].tolist() == ["query"] * 12 + ["key"] * 12 and frame["near"].iloc[:12].all()
    assert frame.attrs["word_share"] == frame.attrs["word_faithfulness"] == 1.0


def test_the_fitted_plane_draws_sink_heads_that_pca_cannot(scratch_model):
    # L3 H11 and L5 H11 park most of their weight on [CLS] or [SEP]: the plain projection draws them below
    # chance (0.03 and 0.00 on the built-in corpus); the fitted plane above 0.75
    sentences = list(CORPUS[:80])
    for layer, head in [(3, 11), (5, 11)]:
        qk = qk_vectors(scratch_model, sentences, layer, head)
        fitted, plain = qk_embedding(qk), qk_embedding(qk, method="pca")
        assert plain.attrs["faithfulness"] < plain.attrs["chance"] < 0.15
        assert fitted.attrs["faithfulness"] > 0.7
        assert len(fitted) == 2 * len(qk.tokens)
        near = fitted["near"].iloc[:len(qk.tokens)].to_numpy(bool)
        assert near.mean() == fitted.attrs["faithfulness"]


def test_an_unknown_method_gets_a_sentence(scratch_model):
    with pytest.raises(HeadLensError, match="fitted, pca, tsne"):
        qk_embedding(qk_vectors(scratch_model, SENTENCES[:1], 0, 0), method="umap")


def test_a_picture_says_when_it_misleads_and_its_thumbnail_is_pink():
    assert "40% of queries" in misleads(dict(faithfulness=0.4, word_share=0.3, word_faithfulness=0.9))
    assert misleads(dict(faithfulness=0.9, word_share=0.3, word_faithfulness=0.25)) == (
        "of the 30% of queries that attend most to a word, only 25% lie nearest it")
    assert misleads(dict(faithfulness=0.9, word_share=0.05, word_faithfulness=0.0)) == ""  # too few to judge
    angles = np.linspace(0, 2 * np.pi, 12, endpoint=False)
    keys = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    frame = qk_embedding(hand_made(keys * 4, keys, [12]))
    assert frame.attrs["misleads"] == "" and tuple(qk_tile(frame)[0, 0]) == (255, 255, 255)
    frame.attrs.update(faithfulness=0.3, misleads=misleads({**frame.attrs, "faithfulness": 0.3}))
    assert tuple(qk_tile(frame)[0, 0]) == tuple(int(UNTRUSTED_COLOR[i:i + 2], 16) for i in (1, 3, 5))


def test_queries_and_keys_are_the_callers_own_while_other_threads_use_the_model(scratch_model):
    """The model is shared by every session: another thread's forward passes, of other lengths, run while
    queries and keys are read, and none of theirs is taken for the caller's."""
    import threading

    alone = scratch_model.queries_keys(SENTENCES, [0, 3])
    stop = threading.Event()

    def others():
        while not stop.is_set():
            scratch_model.attend(["A much longer sentence about the weather, the sea and the mountains today.", "Hi"])

    worker = threading.Thread(target=others)
    worker.start()
    try:
        for _ in range(5):
            for (att, q, k), (att0, q0, k0) in zip(scratch_model.queries_keys(SENTENCES, [0, 3]), alone):
                assert att.tokens == att0.tokens
                np.testing.assert_array_equal(q, q0)
                np.testing.assert_array_equal(k, k0)
    finally:
        stop.set()
        worker.join()


def test_a_picture_names_its_method_and_model_kind_and_a_large_corpus_fits_on_a_seeded_sample(monkeypatch):
    """Past ``FIT_PAIRS`` (query, key) pairs the fitted plane reads a sample of the queries: as many as the pairs
    allow, each once, drawn by the seed, so that the same seed draws the same picture."""
    from analysis.qk_attribution import pictures

    angles = np.linspace(0, 2 * np.pi, 12, endpoint=False)
    keys = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    for causal in (False, True):
        frame = qk_embedding(hand_made(keys * 4, keys, [12], causal=causal), method="pca")
        assert (frame.attrs["method"], frame.attrs["causal"], frame.attrs["layer"]) == ("pca", causal, 0)
    rows = []
    seen = pictures._visible_pairs

    def visible_pairs(spans, causal, chosen=None):
        rows.append(chosen)
        return seen(spans, causal, chosen)

    monkeypatch.setattr(pictures, "_visible_pairs", visible_pairs)
    monkeypatch.setattr(pictures, "FIT_PAIRS", 100)
    monkeypatch.setattr(pictures, "FIT_STEPS", 3)
    rng = np.random.default_rng(1)
    qk = hand_made(rng.normal(size=(40, 4)), rng.normal(size=(40, 4)), [10, 10, 10, 10])  # 400 pairs: a quarter
    a, b, other = qk_embedding(qk, seed=3), qk_embedding(qk, seed=3), qk_embedding(qk, seed=4)
    sampled = [r for r in rows if r is not None]
    assert len(sampled) == 3 and all(len(r) == 10 and len(set(r.tolist())) == 10 for r in sampled)
    assert (np.diff(sampled[0]) > 0).all()
    np.testing.assert_array_equal(sampled[0], sampled[1])
    assert not np.array_equal(sampled[0], sampled[2])
    np.testing.assert_array_equal(a[["x", "y"]], b[["x", "y"]])
    assert a.attrs["method"] == "fitted"
    monkeypatch.setattr(pictures, "FIT_PAIRS", 1)  # a pair's share of one query: still one query read
    qk_embedding(qk)
    assert len(rows[-1]) == 1


def test_layers_are_read_in_groups_within_the_bytes_given_and_word_classes_from_the_pipeline_given(scratch_model):
    import spacy

    sentences = SENTENCES[:2]
    n_tokens = sum(scratch_model.token_counts(sentences))
    per_layer = 2 * 4 * n_tokens * scratch_model.n_heads * scratch_model.head_dim  # float32 queries and keys
    groups = []
    read = scratch_model.queries_keys_groups

    class Watched:  # the model as it is, its groups of layers recorded
        def __getattr__(self, name):
            return getattr(scratch_model, name)

        def queries_keys_groups(self, items, asked, progress=None):
            groups.extend(asked)
            return read(items, asked, progress=progress)

    seen = []
    blank = spacy.blank("en")  # no tagger: no word is told a noun (an object)
    blank.add_pipe("sentencizer")
    qk_heads(Watched(), sentences, max_bytes=2 * per_layer, nlp=blank)
    assert groups == [[0], [1, 2], [3, 4], [5]]  # the first alone, then two a pass
    qk = qk_vectors(scratch_model, sentences, 1, 2, nlp=blank, progress=lambda done, total: seen.append((done, total)))
    assert "object" not in set(qk.tokens.word_class)
    assert "object" in set(qk_vectors(scratch_model, sentences, 1, 2).tokens.word_class)  # coffee, tea, cat, mat
    assert seen and seen[-1] == (len(sentences), len(sentences))
