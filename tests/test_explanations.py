"""A rule's score for each head (``analysis.explanations.rule_scores``) recomputed query by query from
transformers' own attention: all-MiniLM-L6-v2 (an encoder: special tokens never query, the weights as they are) and
a tiny GPT-2 (a decoder: the first token set aside, each query's weights on keys 1 … q renormalised). The keys each
rule names are worked out here from the tokenizer's ids and spaCy's parse, and each interval is checked against the
Poisson bootstrap's own distribution, enumerated."""
import functools
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import poisson
from transformers import AutoModel

from analysis.explanations import rule_scores
from analysis.roles.measure import load_spacy
from analysis.roles.rules import rule_named
from models import HeadLensError, load_model

TEXTS = ["Which do you like better, coffee or tea?", "The cat sat on the mat.", "The dog chased the cat."]


@functools.lru_cache(maxsize=2)
def _transformers(folder: str):
    return AutoModel.from_pretrained(folder, attn_implementation="eager").eval()


@functools.lru_cache(maxsize=256)
def transformers_weights(folder, model, text: str) -> np.ndarray:
    """(layers, heads, n, n) from transformers' eager attention, the text tokenized by the model's tokenizer; a text
    run once however many rules are scored on it (read only)."""
    hf = _transformers(str(folder))
    ids = model.tokenize(text, truncation=True, max_length=model.max_tokens, return_tensors="pt")
    with torch.no_grad():
        out = hf(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"], output_attentions=True)
    return torch.stack(out.attentions)[:, 0].double().numpy()


def hand_keys(name: str, tokenizer, text: str) -> tuple[list[list[int]], list[bool]]:
    """The keys rule ``name`` names for each token of ``text`` (a union's: both rules'), from the tokenizer's ids and
    offsets and spaCy's parse alone, and which tokens are special (the tokenizer's mask)."""
    enc = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    ids, special = enc["input_ids"], [bool(s) for s in enc["special_tokens_mask"]]
    n = len(ids)
    doc = load_spacy()(text)
    owner = {c: w.i for w in doc for c in range(w.idx, w.idx + len(w.text))}  # a character's word
    word = [None if special[t] else next((owner[c] for c in range(b, e) if c in owner), None)
            for t, (b, e) in enumerate(enc["offset_mapping"])]  # the word of a token's first character in one

    def tokens_of(words) -> list[int]:
        return [t for t in range(n) if word[t] is not None and word[t] in words]

    def one(rule: str, q: int) -> list[int]:
        if rule == "previous token":
            return [q - 1] if q >= 1 else []
        if rule == "itself":
            return [q]
        if rule == "first token":
            return [0]
        if rule == "duplicate":
            return [k for k in range(q) if ids[k] == ids[q]]
        if rule == "induction":  # a key whose previous token is the query's, both before the query
            return [k for k in range(1, q) if ids[k - 1] == ids[q]]
        if word[q] is None:
            return []
        w = doc[word[q]]
        if rule == "dependency head":
            return tokens_of({w.head.i} - {w.i})
        if rule == "focus: object":
            return tokens_of({v.i for v in doc if v.pos_ in ("NOUN", "PROPN", "PRON")})
        raise KeyError(rule)

    return [sorted({k for part in name.split(" or ") for k in one(part, q)}) for q in range(n)], special


def exact_interval(parts: list[dict], most: int = 16) -> tuple:
    """The Poisson bootstrap of ``sum(score) / sum(queries)`` over the texts ``parts``, enumerated: every draw of each
    text's count (0 … ``most``) with its probability, resamples with no query dropped; ``(values (draws, heads),
    probabilities (draws,))`` for the quantiles below."""
    scores = np.stack([p["score"].ravel() for p in parts])                     # (texts, heads)
    queries = np.array([p["queries"] for p in parts], dtype=float)
    counts = np.array(list(itertools.product(range(most + 1), repeat=len(parts))), dtype=float)
    prob = poisson.pmf(counts, 1.0).prod(1)
    base = counts @ queries
    kept = base > 0
    return (counts[kept] @ scores) / base[kept, None], prob[kept] / prob[kept].sum()


def quantile(values: np.ndarray, prob: np.ndarray, at: float) -> np.ndarray:
    """Each column's smallest value whose cumulative probability reaches ``at``."""
    order = np.argsort(values, axis=0, kind="stable")
    cum = np.cumsum(prob[order], axis=0)
    first = (cum >= at).argmax(axis=0)
    return np.take_along_axis(values, order, 0)[first, np.arange(values.shape[1])]


def check_interval(lo, hi, values: np.ndarray, prob: np.ndarray, tol: float = 1e-5) -> None:
    """A 95% percentile interval of a bootstrap drawn from ``(values, prob)``: its ends lie near the 2.5% and 97.5%
    quantiles (within the sampling error of a few hundred resamples), so a collapsed or shifted one fails; ``tol``:
    float32 attention against transformers'."""
    lo, hi = np.asarray(lo), np.asarray(hi)
    assert (quantile(values, prob, 0.003) - tol <= lo).all() and (lo <= quantile(values, prob, 0.06) + tol).all()
    assert (quantile(values, prob, 0.94) - tol <= hi).all() and (hi <= quantile(values, prob, 0.997) + tol).all()
    spread = quantile(values, prob, 0.94) - quantile(values, prob, 0.06)
    assert (hi - lo >= spread - 2 * tol).all() and spread.max() > 10 * tol  # as wide as the draws spread


def by_hand(weights: np.ndarray, keys: list[list[int]], special: list[bool] | None, causal: bool) -> dict:
    """Sums over one text's queries, one query and one head at a time."""
    L, H, n, _ = weights.shape
    queries = list(range(1, n)) if causal else [q for q in range(n) if not special[q]]
    score, sink = np.zeros((L, H)), np.zeros((L, H))
    for layer in range(L):
        for head in range(H):
            for q in queries:
                row = weights[layer, head, q]
                sink[layer, head] += row[0]
                if causal:
                    named = [k for k in keys[q] if 1 <= k <= q]
                    score[layer, head] += sum(row[k] for k in named) / sum(row[1:q + 1])
                else:
                    score[layer, head] += sum(row[k] for k in keys[q])
    seen = [(q if causal else n) for q in queries]  # the keys a query sees (a decoder's first token set aside)
    uniform = sum(len([k for k in keys[q] if not causal or 1 <= k <= q]) / s for q, s in zip(queries, seen))
    covered = sum(bool([k for k in keys[q] if not causal or 1 <= k <= q]) for q in queries)
    return {"score": score, "sink": sink, "queries": len(queries), "uniform": uniform, "covered": covered}


@pytest.mark.parametrize("name", ["previous token", "focus: object", "dependency head", "first token"])
def test_an_encoders_scores_are_transformers_attention_on_the_rules_keys(scratch_model, minilm_dir, name):
    rule = rule_named(name)
    frame = rule_scores(scratch_model.attend(TEXTS), rule, replicates=200)
    parts = [by_hand(transformers_weights(minilm_dir, scratch_model, t), *hand_keys(name, scratch_model.tokenizer, t),
                     False) for t in TEXTS]
    queries = sum(p["queries"] for p in parts)
    L, H = parts[0]["score"].shape
    score = (sum(p["score"] for p in parts) / queries).ravel()
    np.testing.assert_allclose(frame["score"], score, atol=1e-5)  # float32 attention, float64 sums
    np.testing.assert_allclose(frame["sink_share"], (sum(p["sink"] for p in parts) / queries).ravel(), atol=1e-5)
    assert frame["coverage"].iloc[0] == pytest.approx(sum(p["covered"] for p in parts) / queries)
    np.testing.assert_allclose(frame["lift"], score / (sum(p["uniform"] for p in parts) / queries), rtol=1e-5)
    assert (frame[["layer", "head"]].to_numpy() == [(l, h) for l in range(L) for h in range(H)]).all()
    check_interval(frame["lo"], frame["hi"], *exact_interval(parts))


@pytest.mark.parametrize("name", ["previous token", "duplicate", "induction", "induction or itself"])
def test_a_decoders_scores_set_the_first_token_aside(tiny, name):
    folder = tiny("gpt2")
    model = load_model(folder)
    texts = ["The cat sat on the mat. The cat sat on the rug.", "A dog and a dog and a a cat."]  # " a" " a" adjacent
    rule = rule_named(name)
    frame = rule_scores(model.attend(texts), rule, replicates=200)
    parts = [by_hand(transformers_weights(folder, model, t), hand_keys(name, model.tokenizer, t)[0], None, True)
             for t in texts]
    queries = sum(p["queries"] for p in parts)
    score = (sum(p["score"] for p in parts) / queries).ravel()
    np.testing.assert_allclose(frame["score"], score, atol=1e-5)
    np.testing.assert_allclose(frame["sink_share"], (sum(p["sink"] for p in parts) / queries).ravel(), atol=1e-5)
    assert frame["coverage"].iloc[0] == pytest.approx(sum(p["covered"] for p in parts) / queries)
    np.testing.assert_allclose(frame["lift"], score / (sum(p["uniform"] for p in parts) / queries), rtol=1e-5)
    check_interval(frame["lo"], frame["hi"], *exact_interval(parts))


def test_a_rule_that_names_every_key_scores_one_and_nothing_to_score_gets_a_sentence(scratch_model):
    """An encoder's rows sum to 1 over all its keys: on "Hi" ([CLS] hi [SEP]) the word's rule naming all three scores
    1 for every head."""
    every = rule_named("itself or first token") | rule_named("last token")
    frame = rule_scores(scratch_model.attend(["Hi"]), every)
    np.testing.assert_allclose(frame["score"], 1.0, atol=1e-5)
    assert frame["coverage"].iloc[0] == 1.0 and frame["lift"].iloc[0] == pytest.approx(frame["score"].iloc[0])
    with pytest.raises(HeadLensError, match="at least one text"):
        rule_scores([], every)


def test_one_heads_content_is_that_heads_transformers_weights_and_a_programs_rows_are_float32(scratch_model,
                                                                                             minilm_dir):
    """``Content.of`` for one head holds that head's rows alone (the special tokens' queries left out), and a
    program's whole rows are float32 as the model gave them."""
    from analysis.explanations.scores import Content

    text = TEXTS[0]
    want = transformers_weights(minilm_dir, scratch_model, text)
    att = scratch_model.attend(text)
    queries = [i for i, s in enumerate(att.special) if not s]
    one = Content.of(att, head=(2, 5))
    assert one.shape == (1, 1) and one.weights.shape == (1, len(queries), len(att.tokens))
    np.testing.assert_allclose(one.weights[0], want[2, 5][queries], atol=1e-5)
    whole = Content.of(att, whole=True)
    assert whole.weights is None and whole.whole.dtype == np.float32 and whole.shape == (6, 12)
    np.testing.assert_allclose(whole.whole[2 * 12 + 5], want[2, 5][queries], atol=1e-5)
