"""Rollout, flow and token ablation: hand-built attention with answers worked out by hand, and the
ablation against transformers' own model."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from analysis import agreement, flow, make_view, rollout, token_ablation
from models import HeadLensError

# Two layers over two tokens: in layer 0 both tokens attend to token 0, in layer 1 both to token 1.
TO_FIRST = [[1.0, 0.0], [1.0, 0.0]]
TO_SECOND = [[0.0, 1.0], [0.0, 1.0]]
TWO_LAYERS = SimpleNamespace(weights=np.array([[TO_FIRST], [TO_SECOND]], dtype=np.float32))  # (2, 1, 2, 2)


def test_rollout_of_hand_built_layers():
    # no skip connection: after layer 1 everything came through token 1, which had token 0's input
    np.testing.assert_allclose(rollout(TWO_LAYERS, residual=0.0)[1], [[1, 0], [1, 0]], atol=1e-6)
    # half skip connection: A0 = [[1, 0], [.5, .5]], A1 = [[.5, .5], [0, 1]], R1 = A1 @ A0
    r = rollout(TWO_LAYERS, residual=0.5)
    np.testing.assert_allclose(r[0], [[1, 0], [0.5, 0.5]], atol=1e-6)
    np.testing.assert_allclose(r[1], [[0.75, 0.25], [0.5, 0.5]], atol=1e-6)


def test_flow_of_hand_built_layers():
    # With A0 and A1 as above, from output 0: to input 0 through (1,0) 0.5 and (1,1) 0.5 -> 1.0;
    # to input 1 only through (1,1), 0.5 -> rows [1, .5] and [.5, .5] before normalising.
    np.testing.assert_allclose(flow(TWO_LAYERS, residual=0.5), [[2 / 3, 1 / 3], [0.5, 0.5]], atol=1e-5)


def test_rows_sum_to_1_on_a_real_model_and_its_views(hf_model):
    att = hf_model.attend("Which do you like better, coffee or tea?")
    for v in (att, make_view(att, hide_special=True), make_view(att, merge_words=True)):
        n = len(v.weights[0, 0])
        r, f = rollout(v), flow(v)
        assert r.shape == (att.n_layers, n, n) and f.shape == (n, n)
        np.testing.assert_allclose(r.sum(-1), 1, atol=1e-5)
        np.testing.assert_allclose(f.sum(-1), 1, atol=1e-5)
    # one head per layer: the same as rolling out a model whose layers have that head alone
    heads = [3, 1, 4, 1, 5, 9]
    alone = SimpleNamespace(weights=att.weights[np.arange(6), heads][:, None])
    np.testing.assert_allclose(rollout(att, heads=heads), rollout(alone), atol=1e-6)


def test_bad_requests_get_a_sentence(hf_model):
    long = SimpleNamespace(weights=np.full((2, 1, 65, 65), 1 / 65, dtype=np.float32))
    with pytest.raises(HeadLensError, match="limited to 64 tokens; this text has 65"):
        flow(long)
    with pytest.raises(HeadLensError, match="one head per layer"):
        rollout(TWO_LAYERS, heads=[0])
    with pytest.raises(HeadLensError, match="cross-attention"):
        rollout(SimpleNamespace(weights=np.ones((1, 1, 2, 3), dtype=np.float32)))


def test_token_ablation_is_the_change_of_each_output(hf_model, scratch_model):
    text = "The cat sat on the mat."
    truth = token_ablation(hf_model, text)
    enc = hf_model.tokenizer(text, return_tensors="pt").to(hf_model.device)
    with torch.inference_mode():
        full = hf_model.model(**enc).last_hidden_state[0]
        for j in (0, 2, 5):  # [CLS], "cat", "mat", each replaced by [MASK]
            ids = enc["input_ids"].clone()
            ids[0, j] = hf_model.tokenizer.mask_token_id
            moved = (hf_model.model(input_ids=ids, attention_mask=enc["attention_mask"]).last_hidden_state[0] - full)
            np.testing.assert_allclose(truth[:, j], moved.norm(dim=-1).cpu().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(token_ablation(scratch_model, text), truth, rtol=1e-3, atol=1e-3)


def test_agreement_over_sentences(hf_model):
    scores = agreement(hf_model, ["Which do you like better, coffee or tea?", "The cat sat on the mat because it was warm.",
                                  "Hi"])
    assert scores["sentences"] == scores["flow sentences"] == 2  # "Hi" has too few content tokens
    assert all(-1 <= scores[k] <= 1 for k in ("raw attention", "rollout", "flow"))
