"""A rule's score for each head (``analysis.explanations.rule_scores``) recomputed query by query from
transformers' own attention: all-MiniLM-L6-v2 (an encoder: special tokens never query, the weights as they are) and
a tiny GPT-2 (a decoder: the first token set aside, each query's weights on keys 1 … q renormalised)."""
import functools

import numpy as np
import pytest
import torch
from transformers import AutoModel

from analysis.explanations import rule_scores
from analysis.rules import rule_named
from models import HeadLensError, load_model

TEXTS = ["Which do you like better, coffee or tea?", "The cat sat on the mat.", "The dog chased the cat."]


@functools.lru_cache(maxsize=2)
def _transformers(folder: str):
    return AutoModel.from_pretrained(folder, attn_implementation="eager").eval()


def transformers_weights(folder, model, text: str) -> np.ndarray:
    """(layers, heads, n, n) from transformers' eager attention, the text tokenized by the model's tokenizer."""
    hf = _transformers(str(folder))
    ids = model.tokenize(text, truncation=True, max_length=model.max_tokens, return_tensors="pt")
    with torch.no_grad():
        out = hf(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"], output_attentions=True)
    return torch.stack(out.attentions)[:, 0].double().numpy()


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
    parts = [by_hand(transformers_weights(minilm_dir, scratch_model, t), rule.keys(scratch_model, t),
                     list(scratch_model.attend(t).special), False) for t in TEXTS]
    queries = sum(p["queries"] for p in parts)
    L, H = parts[0]["score"].shape
    score = (sum(p["score"] for p in parts) / queries).ravel()
    np.testing.assert_allclose(frame["score"], score, atol=1e-5)  # float32 attention, float64 sums
    np.testing.assert_allclose(frame["sink_share"], (sum(p["sink"] for p in parts) / queries).ravel(), atol=1e-5)
    assert frame["coverage"].iloc[0] == pytest.approx(sum(p["covered"] for p in parts) / queries)
    np.testing.assert_allclose(frame["lift"], score / (sum(p["uniform"] for p in parts) / queries), rtol=1e-5)
    assert (frame[["layer", "head"]].to_numpy() == [(l, h) for l in range(L) for h in range(H)]).all()
    assert ((frame["lo"] <= frame["score"] + 1e-12) & (frame["score"] <= frame["hi"] + 1e-12)).mean() > 0.95


@pytest.mark.parametrize("name", ["previous token", "duplicate", "induction or itself"])
def test_a_decoders_scores_set_the_first_token_aside(tiny, name):
    folder = tiny("gpt2")
    model = load_model(folder)
    texts = ["The cat sat on the mat. The cat sat on the rug.", "A dog and a dog and a cat."]
    rule = rule_named(name)
    frame = rule_scores(model.attend(texts), rule, replicates=200)
    parts = [by_hand(transformers_weights(folder, model, t), rule.keys(model, t), None, True) for t in texts]
    queries = sum(p["queries"] for p in parts)
    score = (sum(p["score"] for p in parts) / queries).ravel()
    np.testing.assert_allclose(frame["score"], score, atol=1e-5)
    np.testing.assert_allclose(frame["sink_share"], (sum(p["sink"] for p in parts) / queries).ravel(), atol=1e-5)
    assert frame["coverage"].iloc[0] == pytest.approx(sum(p["covered"] for p in parts) / queries)
    np.testing.assert_allclose(frame["lift"], score / (sum(p["uniform"] for p in parts) / queries), rtol=1e-5)


def test_a_rule_that_names_every_key_scores_one_and_nothing_to_score_gets_a_sentence(scratch_model):
    """An encoder's rows sum to 1 over all its keys: on "Hi" ([CLS] hi [SEP]) the word's rule naming all three scores
    1 for every head."""
    every = rule_named("itself or first token") | rule_named("last token")
    frame = rule_scores(scratch_model.attend(["Hi"]), every)
    np.testing.assert_allclose(frame["score"], 1.0, atol=1e-5)
    assert frame["coverage"].iloc[0] == 1.0 and frame["lift"].iloc[0] == pytest.approx(frame["score"].iloc[0])
    with pytest.raises(HeadLensError, match="at least one text"):
        rule_scores([], every)
