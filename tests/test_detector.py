"""The decoder head detector: exact answers on attention built to have them, intervals that cover the
truth 95% of the time, and the heads SmolLM2 is known to have."""
import numpy as np
import pytest

from analysis.roles.detector import DETECTORS, head_detector, interval, repeated_sequences, whole_words
from models import HeadLensError
from models.corpus import CORPUS
from models.result import Attention

SENTENCES = ["Which do you like better, coffee or tea?", "The cat sat on the mat because it was warm.",
             "Dogs bark at night."]


class Patterned:
    """A model whose four heads each do one thing exactly, on any text its tokenizer reads: 0 induction,
    1 duplicate token, 2 previous token, 3 the text's first token (a sink; [CLS] for an encoder's tokenizer, as
    <bos> for Gemma 3's)."""

    n_layers, n_heads = 1, 4

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def attend(self, texts, batch_size=32, progress=None):
        out = []
        for start in range(0, len(texts), batch_size):  # a batch at a time, as a model's attend reports it
            out += [self._one(t) for t in texts[start:start + batch_size]]
            if progress is not None:
                progress(len(out), len(texts))
        return out

    def _one(self, text):
        enc = self.tokenizer(text, return_special_tokens_mask=True)
        ids, special = enc["input_ids"], np.array(enc["special_tokens_mask"], bool)
        n = len(ids)
        w = np.zeros((1, 4, n, n), np.float32)
        for i in range(n):
            earlier = [j for j in range(i) if ids[j] == ids[i] and not special[j]]
            j = earlier[-1] if earlier and not special[i] else None
            w[0, 0, i, i if j is None else j + 1] = 1
            w[0, 1, i, i if j is None else j] = 1
            w[0, 2, i, max(i - 1, 0)] = 1
            w[0, 3, i, 0] = 1
        return Attention(self.tokenizer.convert_ids_to_tokens(ids), w, enc.word_ids(), special, [(0, 0)] * n, text,
                         "patterned", "scratch", "cpu", causal=True)


@pytest.fixture(scope="module", params=["minilm", "smollm2"])
def tokenizer(request, hf_model, smollm2):
    return (hf_model if request.param == "minilm" else smollm2).tokenizer


def test_each_score_finds_the_head_built_to_have_it(tokenizer):
    points = []
    df = head_detector(Patterned(tokenizer), sentences=SENTENCES, n_sequences=5, length=12,
                       progress=lambda done, total: points.append((done, total)))
    total = 5 + len(SENTENCES)  # a point after each batch of 8, over the repeated sequences then the sentences
    assert points[0] == (5, total) and points[-1] == (total, total)
    assert [d for d, _ in points] == sorted(d for d, _ in points) and len(points) == 1 + -(-len(SENTENCES) // 8)
    built = {"induction": 0, "duplicate_token": 1, "previous_token": 2, "sink": 3}
    for name, head in built.items():
        assert df.loc[head, name] == pytest.approx(1.0)
        assert df.loc[head, f"{name}_lo"] == df.loc[head, f"{name}_hi"] == pytest.approx(1.0)  # no spread
        others = df[name].drop(index=head)
        assert (others < 0.2).all(), (name, others.tolist())  # the others touch it only by coincidence
    # on the repeated sequences, the previous token is never the earlier occurrence or the one after it
    assert df.loc[2, "induction"] == df.loc[2, "duplicate_token"] == 0


def test_repeated_sequences_come_back_as_two_equal_copies_of_single_tokens(tokenizer):
    texts = repeated_sequences(tokenizer, 4, 20, seed=3)
    assert texts == repeated_sequences(tokenizer, 4, 20, seed=3) and len(set(texts)) == 4
    for text in texts:
        words = text.split()
        assert words[0] == "The" and words[1:21] == words[21:] and len(set(words[1:21])) == 20
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == 41 and ids[1:21] == ids[21:]
    assert len(whole_words(tokenizer)) > 5000


def test_a_tokenizers_whole_words_are_read_once_and_are_its_single_token_words(tokenizer, monkeypatch):
    words = whole_words(tokenizer)
    assert all(len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1 for w in words[::97])
    monkeypatch.setattr(type(tokenizer), "convert_ids_to_tokens",
                        lambda *a, **k: pytest.fail("the vocabulary was read again"))
    again = whole_words(tokenizer)
    assert again == words and again is not words  # a copy: a caller's change stays its own


def test_the_interval_covers_the_mean_about_95_times_in_100():
    rng = np.random.default_rng(7)
    draws = rng.beta(2, 5, size=(60, 400))  # 400 experiments of 60 items each, true mean 2/7
    mean, lo, hi = interval(draws)
    np.testing.assert_allclose(mean, draws.mean(0))
    covered = np.mean((lo <= 2 / 7) & (2 / 7 <= hi))
    assert 0.91 <= covered <= 0.98, covered
    with_nan = draws[:, :3].copy()
    with_nan[0, 0] = np.nan  # an item without the query a score needs is left out of that head only
    m, _, _ = interval(with_nan)
    assert m[0] == pytest.approx(np.mean(draws[1:, 0])) and m[1] == pytest.approx(np.mean(draws[:, 1]))


def test_smollm2_has_the_known_induction_duplicate_previous_and_sink_heads(smollm2):
    df = head_detector(smollm2, sentences=CORPUS[:60], n_sequences=8).set_index(["layer", "head"])
    top = {name: list(df[name].sort_values(ascending=False).index[:5]) for name in DETECTORS}
    assert top["induction"][0] == (18, 6) and {(17, 4), (17, 3)} <= set(top["induction"][:3])
    assert df.loc[(18, 6), "induction_lo"] > 0.85
    assert (14, 3) in top["duplicate_token"] and (16, 0) == top["previous_token"][0]
    assert (1, 2) in top["previous_token"]
    assert (df["sink"] > 0.5).sum() > 180
    assert ((df["induction_lo"] <= df["induction"]) & (df["induction"] <= df["induction_hi"])).all()


def test_too_few_words_or_no_sentences_get_a_sentence(tokenizer):
    with pytest.raises(HeadLensError, match="needs sentences"):
        head_detector(Patterned(tokenizer), sentences=[])
