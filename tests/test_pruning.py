"""Embeddings, ablation, head importance and pruning, checked against transformers and by hand."""
import io
import json

import numpy as np
import pandas as pd
import pytest
import torch

from analysis.pruning.ablation import ablate, attention_change, cosines, neighbour_agreement
from analysis.pruning.importance import head_importance, proxy_correlations, role_scores
from analysis.pruning import curves as curves_module
from analysis.pruning.curves import curve_work, full_run, proxy_order, prune_counts, pruning_curve, ranking_rows
from models import HeadLensError, MultiHeadAttention, load_model
from tests.conftest import SENTENCES

TEXTS = SENTENCES + ["She gave her brother a book about the stars.", "Please close the door when you leave.",
                     "Birds build nests in tall trees every spring.", "Why did the train stop near the tunnel?"]


def reference_embeddings(folder, texts, max_length=256):
    """What sentence-transformers computes for all-MiniLM-L6-v2: transformers' BertModel, the mean of
    the last hidden state over real tokens, L2-normalised."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(folder)
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    real = enc["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((h * real).sum(1) / real.sum(1), dim=1).numpy()


def mask_without(model, heads):
    m = np.ones((model.n_layers, model.n_heads), dtype=np.float32)
    for l, h in heads:
        m[l, h] = 0
    return m


@pytest.fixture(scope="module")
def tiny_scratch(tiny):
    return load_model(tiny("bert"), backend="scratch", device="cpu")


def test_embeddings_equal_sentence_transformers_pooling_on_both_engines(hf_model, scratch_model, minilm_dir):
    long_text = " ".join(["word"] * 400)  # cut at 256 tokens, as sentence-transformers cuts it
    texts = TEXTS + [long_text]
    ref = reference_embeddings(minilm_dir, texts)
    for model in (hf_model, scratch_model):
        got = model.embed(texts)
        assert got.shape == (len(texts), 384) and got.dtype == np.float32
        np.testing.assert_allclose(got, ref, atol=1e-5)
    assert scratch_model.embed_max_tokens == 256
    np.testing.assert_allclose(np.linalg.norm(ref, axis=1), 1, atol=1e-6)


def test_embed_refuses_what_it_cannot_do(hf_model, scratch_model):
    with pytest.raises(HeadLensError, match="no text"):
        scratch_model.embed([])
    mask = np.ones((6, 12))
    mask[2, 5] = 0
    np.testing.assert_array_equal(hf_model.embed(TEXTS, head_mask=mask), scratch_model.embed(TEXTS, head_mask=mask))
    with pytest.raises(HeadLensError, match="head mask too"):
        scratch_model.embed(TEXTS, head_means=np.zeros((6, 12, 32)))
    with pytest.raises(HeadLensError, match=r"shape \(6, 12, 32\)"):
        scratch_model.embed(TEXTS, head_mask=np.ones((6, 12)), head_means=np.zeros((6, 12)))


def test_head_means_equal_each_heads_output_computed_from_transformers(scratch_model, minilm_dir):
    from transformers import AutoModel, AutoTokenizer

    hf = AutoModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = hf(**enc, output_hidden_states=True, output_attentions=True)
    real = enc["attention_mask"].bool()
    expected = np.zeros((6, 12, 32))
    for layer in range(6):
        value = hf.encoder.layer[layer].attention.self.value
        with torch.no_grad():
            v = value(out.hidden_states[layer]).view(len(TEXTS), -1, 12, 32).transpose(1, 2)  # (B, H, L, Dh)
            ctx = out.attentions[layer] @ v                                                   # (B, H, L, Dh)
        expected[layer] = ctx.transpose(1, 2)[real].mean(0).numpy()                           # over real tokens
    np.testing.assert_allclose(scratch_model.head_means(TEXTS), expected, atol=2e-5)


def test_mean_ablation_puts_the_mean_in_place_of_the_head(tiny_scratch):
    means = tiny_scratch.head_means(TEXTS)
    mask = mask_without(tiny_scratch, [(0, 1)])
    # the head's output at every position is its mean: the attention output moves by W_o[:, head] @ mean
    attn = tiny_scratch.encoder.layers[0].attn
    x = torch.randn(3, 7, 32)
    fill = torch.as_tensor(means[0])
    with torch.no_grad():
        zeroed, w0 = attn(x, head_mask=torch.as_tensor(mask[0]))
        meaned, w1 = attn(x, head_mask=torch.as_tensor(mask[0]), head_fill=fill)
    torch.testing.assert_close(meaned - zeroed, (attn.out_proj.weight[:, 8:16] @ fill[1]).expand(3, 7, 32))
    torch.testing.assert_close(w0, w1)
    # means of zero are zero ablation
    np.testing.assert_allclose(tiny_scratch.embed(TEXTS, head_mask=mask, head_means=np.zeros_like(means)),
                               tiny_scratch.embed(TEXTS, head_mask=mask), atol=1e-7)


@pytest.mark.parametrize("heads", [[(0, 1)], [(0, 0), (1, 3)], [(1, 0), (1, 1), (1, 2), (1, 3)],
                                   [(0, 0), (0, 1), (0, 2), (0, 3), (1, 2)]])
def test_pruned_equals_masked_on_a_tiny_model(tiny_scratch, heads):
    pruned = tiny_scratch.pruned(heads)
    mask = mask_without(tiny_scratch, heads)
    np.testing.assert_allclose(pruned.embed(TEXTS), tiny_scratch.embed(TEXTS, head_mask=mask), atol=1e-5)
    for a, b in zip(pruned.attend(TEXTS), tiny_scratch.attend(TEXTS, head_mask=mask)):
        assert a.weights.shape == b.weights.shape == (2, 4, len(a.tokens), len(a.tokens))
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-5)
        assert a.pruned.tolist() == (mask == 0).tolist()
        for l, h in heads:
            assert not a.weights[l, h].any()
    assert tiny_scratch.attend(TEXTS[0]).pruned is None
    from analysis.attention.export import attention_json, attention_npz

    exported = json.loads(attention_json(pruned.attend(TEXTS[0])))
    assert exported["pruned_heads"] == sorted([list(h) for h in heads])
    with np.load(io.BytesIO(attention_npz(pruned.attend(TEXTS[0])))) as z:
        assert json.loads(str(z["metadata"]))["pruned_heads"] == sorted([list(h) for h in heads])


def test_pruned_equals_masked_on_the_bundled_weights(scratch_model):
    heads = [(0, 3), (2, 0), (2, 7), (4, 11), (5, 5)] + [(3, h) for h in range(12)]
    pruned = scratch_model.pruned(heads)
    mask = mask_without(scratch_model, heads)
    np.testing.assert_allclose(pruned.embed(TEXTS), scratch_model.embed(TEXTS, head_mask=mask), atol=1e-5)
    for a, b in zip(pruned.attend(TEXTS), scratch_model.attend(TEXTS, head_mask=mask)):
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-5)
    means = scratch_model.head_means(TEXTS)
    np.testing.assert_allclose(scratch_model.pruned(heads, head_means=means).embed(TEXTS),
                               scratch_model.embed(TEXTS, head_mask=mask, head_means=means), atol=1e-5)


def test_pruning_removes_exactly_those_weights_and_leaves_the_shared_model_alone(scratch_model):
    before = {k: v.clone() for k, v in scratch_model.encoder.state_dict().items()}
    heads = [(0, 3), (2, 0), (2, 7)]
    pruned = scratch_model.pruned(heads)
    E, Dh = 384, 32
    per_head = 4 * Dh * E + 3 * Dh  # q, k, v rows with their biases, and the output projection's columns
    count = lambda m: sum(p.numel() for p in m.encoder.parameters())
    assert count(scratch_model) - count(pruned) == 3 * per_head
    w = pruned.encoder.layers[2].attn.in_proj_weight
    full = scratch_model.encoder.layers[2].attn.in_proj_weight
    kept = [h for h in range(12) if h not in (0, 7)]
    rows = [part * E + h * Dh + i for part in range(3) for h in kept for i in range(Dh)]
    assert torch.equal(w, full[rows])
    assert torch.equal(pruned.encoder.layers[2].attn.out_proj.weight,
                       scratch_model.encoder.layers[2].attn.out_proj.weight[:, [h * Dh + i for h in kept for i in range(Dh)]])
    assert pruned.pruned_heads.sum() == 3 and pruned.pruned_heads[2, 7]
    # what pruning leaves as it was is shared, not copied: a layer that lost no head, the feed-forwards, the embeddings
    for mine, theirs in ((pruned.encoder.layers[1].attn.in_proj_weight, scratch_model.encoder.layers[1].attn.in_proj_weight),
                         (pruned.encoder.layers[2].ffn_in.weight, scratch_model.encoder.layers[2].ffn_in.weight)):
        assert mine.data_ptr() == theirs.data_ptr()
    assert w.data_ptr() != full.data_ptr()
    assert "pruned: 3 of 72 heads" in pruned.name
    for k, v in scratch_model.encoder.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not scratch_model.pruned_heads.any()
    # pruning a pruned model again equals pruning the union at once
    again = pruned.pruned([(5, 1), (2, 0)])
    once = scratch_model.pruned(heads + [(5, 1)])
    np.testing.assert_allclose(again.embed(TEXTS), once.embed(TEXTS), atol=1e-6)
    assert again.pruned_heads.sum() == 4


def test_every_head_pruned_leaves_skip_connections_and_feed_forward(tiny_scratch):
    every = [(l, h) for l in range(2) for h in range(4)]
    pruned = tiny_scratch.pruned(every)
    got = pruned.embed(TEXTS)
    np.testing.assert_allclose(got, tiny_scratch.embed(TEXTS, head_mask=np.zeros((2, 4))), atol=1e-5)
    assert np.isfinite(got).all()
    att = pruned.attend(TEXTS[0])
    assert not att.weights.any() and att.pruned.all()


def test_a_head_that_does_not_exist_gets_a_sentence(tiny_scratch):
    with pytest.raises(HeadLensError, match="no head 4 in layer 1.*2 layers of 4 heads"):
        tiny_scratch.pruned([(1, 4)])
    with pytest.raises(HeadLensError, match="no head 0 in layer 2"):
        tiny_scratch.pruned([(2, 0)])
    with pytest.raises(HeadLensError, match=r"\(layer, head\)"):
        tiny_scratch.pruned(["L1H2"])


def test_save_and_load_a_pruned_model(tiny_scratch, scratch_model, tmp_path):
    means = scratch_model.head_means(TEXTS)
    pruned = scratch_model.pruned([(1, 2), (4, 0), (4, 5)], head_means=means)
    folder = pruned.save(tmp_path / "pruned")
    config = json.loads((folder / "config.json").read_text())
    assert config["pruned_heads"] == {"1": [2], "4": [0, 5]} and config["model_type"] == "bert"
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert f.get_tensor("encoder.layer.4.attention.self.query.weight").shape == (10 * 32, 384)
        assert f.get_tensor("encoder.layer.4.attention.output.dense.weight").shape == (384, 10 * 32)
    again = load_model(folder, backend="scratch", device="cpu")
    np.testing.assert_allclose(again.embed(TEXTS), pruned.embed(TEXTS), atol=1e-6)
    assert again.pruned_heads.tolist() == pruned.pruned_heads.tolist()
    assert again.embed_max_tokens == 256
    for a, b in zip(again.attend(TEXTS), pruned.attend(TEXTS)):
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-6)
    with pytest.raises(HeadLensError, match="pruned heads.*backend='scratch'"):
        load_model(folder)
    # an unpruned model saves and loads too
    plain = tiny_scratch.save(tmp_path / "plain")
    np.testing.assert_allclose(load_model(plain, backend="scratch").embed(TEXTS), tiny_scratch.embed(TEXTS), atol=1e-6)


def test_a_pruned_config_that_does_not_fit_gets_a_sentence(tiny_scratch, tmp_path):
    folder = tiny_scratch.pruned([(0, 1)]).save(tmp_path / "p")
    config = json.loads((folder / "config.json").read_text())
    config["pruned_heads"] = {"0": [9]}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadLensError, match=r"prunes heads \[9\] of layer 0"):
        load_model(folder, backend="scratch")
    config["pruned_heads"] = {"0": [2]}  # other heads than the weights hold: the same size, loads
    (folder / "config.json").write_text(json.dumps(config))
    load_model(folder, backend="scratch")
    config["pruned_heads"] = {}  # a size the weights do not have
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadLensError, match="do not fit the sizes"):
        load_model(folder, backend="scratch")


def test_mha_with_pruned_heads_and_with_none():
    torch.manual_seed(0)
    full = MultiHeadAttention(16, 4).eval()
    part = MultiHeadAttention(16, 2, head_dim=4).eval()
    with torch.no_grad():
        rows = torch.cat([torch.arange(4, 12) + k * 16 for k in range(3)])  # heads 1 and 2 of q, k and v
        part.in_proj_weight.copy_(full.in_proj_weight[rows])
        part.in_proj_bias.copy_(full.in_proj_bias[rows])
        part.out_proj.weight.copy_(full.out_proj.weight[:, 4:12])
        part.out_proj.bias.copy_(full.out_proj.bias)
    x = torch.randn(2, 5, 16)
    out, w = full(x, head_mask=torch.tensor([0.0, 1, 1, 0]), average_attn_weights=False)
    out2, w2 = part(x, average_attn_weights=False)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(w2, w[:, 1:3])
    none = MultiHeadAttention(16, 0, head_dim=4)
    y, weights = none(x, average_attn_weights=False)
    assert weights.shape == (2, 0, 5, 5)
    torch.testing.assert_close(y, none.out_proj.bias.expand(2, 5, 16))


def test_embed_variants_equal_separate_calls(tiny_scratch):
    masks = [mask_without(tiny_scratch, hs) for hs in ([(0, 0)], [(1, 3)], [(0, 2), (1, 1)], [])]
    means = tiny_scratch.head_means(TEXTS)
    got = tiny_scratch.embed_variants(TEXTS, masks, head_means=means)
    for m, g in zip(masks, got):
        np.testing.assert_allclose(g, tiny_scratch.embed(TEXTS, head_mask=m, head_means=means), atol=1e-6)


def test_importance_is_the_embedding_change_of_removing_each_head(tiny_scratch):
    imp = head_importance(tiny_scratch, TEXTS)
    assert list(imp.columns) == ["layer", "head", "importance", "pruned"] and len(imp) == 8
    full = tiny_scratch.embed(TEXTS)
    for l, h in [(0, 2), (1, 1)]:
        alone = tiny_scratch.embed(TEXTS, head_mask=mask_without(tiny_scratch, [(l, h)]))
        expected = np.mean(1 - np.sum(alone.astype(np.float64) * full, axis=1))
        assert imp.query("layer == @l and head == @h")["importance"].item() == pytest.approx(expected, abs=1e-6)
    # on a pruned model the pruned heads are marked and have no importance
    pruned = head_importance(tiny_scratch.pruned([(0, 1)]), TEXTS)
    row = pruned.query("layer == 0 and head == 1")
    assert row["pruned"].item() and np.isnan(row["importance"].item())
    assert pruned["importance"].notna().sum() == 7


def test_a_head_made_to_matter_ranks_first(tiny_scratch):
    untouched = head_importance(tiny_scratch, TEXTS).sort_values("importance")
    layer, head = int(untouched.iloc[0]["layer"]), int(untouched.iloc[0]["head"])  # the least important head
    boosted = tiny_scratch.pruned([])  # a copy, so the shared fixture stays as it is
    with torch.no_grad():
        boosted.encoder.layers[layer].attn.out_proj.weight[:, head * 8:(head + 1) * 8] *= 20  # 20 times louder
    for ablation in ("zero", "mean"):
        imp = head_importance(boosted, TEXTS, ablation=ablation).sort_values("importance", ascending=False)
        assert (imp.iloc[0]["layer"], imp.iloc[0]["head"]) == (layer, head), ablation


class LossModel:
    """A tiny scratch model with a loss: squared distance of each text's mean hidden state to a target."""

    def __init__(self, model):
        self.model = model.pruned([])
        self.model.encoder.double()
        self.target = torch.linspace(-1, 1, 32, dtype=torch.float64)

    def loss(self, texts, head_mask=None, head_means=None):
        m = self.model
        enc = m.tokenizer(list(texts), padding=True, return_tensors="pt")
        h = m.encoder(enc["input_ids"], enc["attention_mask"], head_mask=head_mask).last_hidden_state
        real = enc["attention_mask"].unsqueeze(-1).double()
        pooled = (h * real).sum(1) / real.sum(1)
        return ((pooled - self.target) ** 2).sum(1).mean()

    def scratch(self, what: str = "This"):
        return self  # it runs on the from-scratch engine, as the model it wraps does

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_gradient_importance_is_michels_normalised_mask_gradient(tiny_scratch):
    model = LossModel(tiny_scratch)
    got = head_importance(model, TEXTS, method="gradient", batch_size=4)
    # |dL/dmask| per batch by central differences, averaged over batches, L2-normalised per layer
    expected = np.zeros((2, 4))
    for start in range(0, len(TEXTS), 4):
        batch = TEXTS[start:start + 4]
        for l in range(2):
            for h in range(4):
                grads = []
                for eps in (1e-5, -1e-5):
                    m = torch.ones(2, 4, dtype=torch.float64)
                    m[l, h] += eps
                    with torch.no_grad():
                        grads.append(float(model.loss(batch, head_mask=m)))
                expected[l, h] += abs(grads[0] - grads[1]) / 2e-5
    expected /= 2
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(got["importance"].to_numpy().reshape(2, 4), expected, rtol=1e-4)
    with pytest.raises(HeadLensError, match="no loss"):
        head_importance(tiny_scratch, TEXTS, method="gradient")


def test_ablation_changes_only_later_layers_and_says_how_much(tiny_scratch):
    effect = ablate(tiny_scratch, TEXTS, [(0, 1)], ablation="zero")
    mask = mask_without(tiny_scratch, [(0, 1)])
    full, off = tiny_scratch.attend(TEXTS), tiny_scratch.attend(TEXTS, head_mask=mask)
    expected = np.mean([0.5 * np.abs(a.weights - b.weights).sum(-1).mean(-1) for a, b in zip(full, off)], axis=0)
    assert np.isnan(effect.attention_change[0, 1])
    np.testing.assert_array_equal(np.delete(effect.attention_change[0], 1), 0)  # same layer, other heads: unchanged
    np.testing.assert_allclose(effect.attention_change[1], expected[1], atol=1e-6)
    assert (effect.attention_change[1] > 0).all()
    np.testing.assert_allclose(effect.cosine, np.sum(tiny_scratch.embed(TEXTS) * tiny_scratch.embed(TEXTS, head_mask=mask), 1),
                               atol=1e-6)
    assert effect.loss is None
    change = attention_change(full, full)
    assert not change.any()
    with pytest.raises(HeadLensError, match="at least one head"):
        ablate(tiny_scratch, TEXTS, [])
    model = LossModel(tiny_scratch)
    with_loss = ablate(model, TEXTS, [(0, 1)])
    with torch.no_grad():
        assert with_loss.full_loss == pytest.approx(float(model.loss(TEXTS)))
        assert with_loss.loss == pytest.approx(float(model.loss(TEXTS, head_mask=torch.tensor(mask, dtype=torch.float64))))
    assert with_loss.loss != pytest.approx(with_loss.full_loss)


def test_neighbour_agreement_and_cosines_by_hand():
    e = np.eye(4, dtype=np.float32)
    e[1] = [0.8, 0.6, 0, 0]           # 1 is nearest to 0
    e[2] = [0, 0, 0.6, 0.8]           # 2 is nearest to 3
    assert neighbour_agreement(e, e, k=1) == 1
    swapped = e[[0, 2, 1, 3]]         # sentence 1 and 2 trade embeddings
    # nearest under `e`: 0->1, 1->0, 2->3, 3->2; under `swapped`: 0->2, 1->3, 2->0, 3->1: none kept
    assert neighbour_agreement(e, swapped, k=1) == 0
    moved = e.copy()
    moved[3] = [0.9, 0, 0, np.sqrt(0.19)]  # now nearest to 0 (0.9), which now is nearest to it; 1 and 2 keep theirs
    assert neighbour_agreement(e, moved, k=1) == 0.5
    np.testing.assert_allclose(cosines(e, swapped), [1, 0, 0, 1])
    with pytest.raises(HeadLensError):
        neighbour_agreement(e[:1], e[:1])


def test_prune_counts_and_proxy_order():
    assert prune_counts(72) == [0, 7, 14, 22, 29, 36, 43, 50, 58, 65, 72]
    assert prune_counts(8) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    proxies = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "special": [0.1, 0.9, 0.5, 0.5],
                            "entropy_norm": [0.5, 0.5, 0.2, 0.7]})
    assert proxy_order(proxies) == [(0, 1), (1, 1), (1, 0), (0, 0)]


def test_proxy_correlations_and_role_scores_by_hand():
    imp = pd.DataFrame({"layer": [0] * 6, "head": range(6), "importance": [6.0, 5, 4, 3, 2, 1], "pruned": False})
    proxies = pd.DataFrame({"layer": [0] * 6, "head": range(6), "entropy_norm": [1, 2, 3, 4, 5, 6.0],
                            "special": [0.1, 0.3, 0.2, 0.5, 0.4, 0.6], "label": list("aabbcc")})
    corr = proxy_correlations(imp, proxies).set_index("proxy")["spearman"]
    assert corr["entropy (normalised)"] == pytest.approx(-1)
    # ranks of special [1, 3, 2, 5, 4, 6] against importance's reversed [1, ..., 6]: sum d^2 = 4
    assert corr["weight on [CLS]/[SEP]"] == pytest.approx(-(1 - 6 * 4 / (6 * 35)))
    scores = role_scores(imp["importance"], proxies["label"])
    np.testing.assert_allclose(scores, [5, 6, 3, 4, 1, 2])  # the other head of the same role
    lone = role_scores(pd.Series([1.0, 2, 3]), pd.Series(["a", "b", "b"]))
    np.testing.assert_allclose(lone, [2.5, 3, 2])  # a head alone in its role gets the others' mean


def test_pruning_curves_measure_each_pruned_model(tiny_scratch):
    curve = pruning_curve(tiny_scratch, TEXTS, order="importance")
    assert curve["n_pruned"].tolist() == prune_counts(8)
    first = curve.iloc[0]
    assert first.fidelity == pytest.approx(1) and first.agreement == 1 and first.heads == []
    imp = head_importance(tiny_scratch, TEXTS).sort_values("importance", kind="stable")
    assert curve.iloc[1].heads == [(imp.iloc[0]['layer'], imp.iloc[0]['head'])]  # the least important goes first
    full = tiny_scratch.embed(TEXTS)
    for row in curve.iloc[[3, -1]].itertuples():
        heads = row.heads
        emb = tiny_scratch.embed(TEXTS, head_mask=mask_without(tiny_scratch, heads))
        assert row.fidelity == pytest.approx(np.mean(np.sum(emb * full, 1)), abs=1e-5)
        assert row.agreement == neighbour_agreement(full, emb)
        assert len(heads) == row.n_pruned and row.forward_s > 0
    # each step keeps the heads the step before removed
    for before, after in zip(curve["heads"], curve["heads"][1:]):
        assert set(before) <= set(after)
    a = pruning_curve(tiny_scratch, TEXTS, order="random", seed=4)
    assert a["heads"].tolist() == pruning_curve(tiny_scratch, TEXTS, order="random", seed=4)["heads"].tolist()
    assert a["heads"].tolist() != pruning_curve(tiny_scratch, TEXTS, order="random", seed=5)["heads"].tolist()
    # the full model's run shared by several curves: the same curve, and the progress counts only what is run
    shared, ticks = full_run(tiny_scratch, TEXTS), []
    np.testing.assert_array_equal(shared[0], full)
    for order in ("random", "importance"):
        again = pruning_curve(tiny_scratch, TEXTS, order=order, seed=4, full=shared, progress=lambda *t: ticks.append(t))
        want = a if order == "random" else curve
        pd.testing.assert_frame_equal(again.drop(columns="forward_s"), want.drop(columns="forward_s"))
        work = curve_work(tiny_scratch, len(TEXTS), prune_counts(8), order, shared_full=True)
        assert ticks[-1] == (work, work) and again["forward_s"].iloc[0] == shared[1]
    # curves sharing their runs: the same curves, and the set both reach (every head) run once
    measured, ticks = {}, []
    counted = [pruning_curve(tiny_scratch, TEXTS, order=order, seed=4, full=shared, runs=measured,
                             progress=lambda *t: ticks.append(t)) for order in ("random", "importance")]
    for got, want in zip(counted, (a, curve)):
        pd.testing.assert_frame_equal(got.drop(columns="forward_s"), want.drop(columns="forward_s"))
    assert counted[1]["forward_s"].iloc[-1] == counted[0]["forward_s"].iloc[-1]
    sets = {frozenset(h) for got in counted for h in got["heads"] if h}
    assert set(measured) == sets and len(sets) < 2 * (len(prune_counts(8)) - 1)  # run once each
    # the full model's importance already measured (Pruning's own): the same curve, and the progress all counted
    ticks = []
    given = pruning_curve(tiny_scratch, TEXTS, order="importance", full=shared, importance=head_importance(
        tiny_scratch, TEXTS, reference=full), progress=lambda *t: ticks.append(t))
    pd.testing.assert_frame_equal(given.drop(columns="forward_s"), curve.drop(columns="forward_s"))
    work = curve_work(tiny_scratch, len(TEXTS), prune_counts(8), "importance", shared_full=True)
    assert ticks[-1] == (work, work)
    # half the heads at a time (the curves' first form): at random the same sets as a tenth at a time; by
    # importance, the full model's least important half at once
    coarse = pruning_curve(tiny_scratch, TEXTS, order="random", seed=4, step=0.5)
    assert coarse["n_pruned"].tolist() == [0, 4, 8]
    pd.testing.assert_frame_equal(coarse.drop(columns="forward_s"),
                                  a[a["n_pruned"].isin([0, 4, 8])].drop(columns="forward_s").reset_index(drop=True))
    half = pruning_curve(tiny_scratch, TEXTS, order="importance", step=0.5)
    assert half["heads"][1] == sorted((int(r.layer), int(r.head)) for r in imp.head(4).itertuples())
    means = tiny_scratch.head_means(TEXTS)
    mean_curve = pruning_curve(tiny_scratch, TEXTS, order="proxy", ablation="mean", head_means=means)
    last = mean_curve.iloc[-1]
    expected = tiny_scratch.embed(TEXTS, head_mask=np.zeros((2, 4)), head_means=means)
    assert last.fidelity == pytest.approx(np.mean(np.sum(expected * full, 1)), abs=1e-5)
    with pytest.raises(HeadLensError, match="at least two"):
        pruning_curve(tiny_scratch, TEXTS[:1])
    with pytest.raises(HeadLensError, match="without pruned heads"):
        pruning_curve(tiny_scratch.pruned([(0, 0)]), TEXTS)


def test_transformers_models_are_ablated_through_their_twin(hf_model, scratch_model, tiny):
    got = ablate(hf_model, TEXTS, [(1, 2), (3, 4)])
    want = ablate(scratch_model, TEXTS, [(1, 2), (3, 4)])
    np.testing.assert_array_equal(got.cosine, want.cosine)
    assert got.cosine.min() < 1 - 1e-4
    with pytest.raises(HeadLensError, match="Head importance switches heads off .* the from-scratch engine, which does not implement"):
        head_importance(load_model(tiny("bloom")), TEXTS)


def test_the_curve_re_ranks_on_the_rows_it_is_given_and_measures_on_every_sentence(tiny_scratch, monkeypatch):
    assert ranking_rows(10, 4) == [0, 3, 6, 9]
    assert ranking_rows(10) == ranking_rows(10, 10) == ranking_rows(10, 12) == list(range(10))
    with pytest.raises(HeadLensError, match="at least two"):
        ranking_rows(10, 1)
    rows = ranking_rows(len(TEXTS), 3)
    full = tiny_scratch.embed(TEXTS)
    measured = []  # each step's importance: the texts and reference it was given, and what it found

    def recorded(model, sentences, **options):
        frame = head_importance(model, sentences, **options)
        measured.append((list(sentences), options["reference"], model.pruned_heads.copy(), frame))
        return frame

    monkeypatch.setattr(curves_module, "head_importance", recorded)
    ticks = []
    curve = pruning_curve(tiny_scratch, TEXTS, order="importance", rank_on=3, progress=lambda *t: ticks.append(t))
    assert len(measured) == len(curve) - 2  # a step to each size but the last, which takes what is left
    first, *later = measured
    assert first[0] == TEXTS and np.array_equal(first[1], full)  # the first step: every text, as the page's grid
    for (texts, reference, pruned, frame), row in zip(later, curve.iloc[1:].itertuples()):
        assert texts == [TEXTS[i] for i in rows] and np.array_equal(reference, full[rows])
        assert {(int(l), int(h)) for l, h in zip(*np.nonzero(pruned))} == set(row.heads)  # on the model pruned so far
    for (*_, frame), (before, after) in zip(measured, zip(curve["heads"], curve["heads"][1:])):
        least = frame[~frame["pruned"]].sort_values("importance", kind="stable").iloc[0]
        assert set(after) - set(before) == {(int(least["layer"]), int(least["head"]))}
    for row in curve.iloc[[2, 5]].itertuples():  # each pruned model measured on every text
        emb = tiny_scratch.embed(TEXTS, head_mask=mask_without(tiny_scratch, row.heads))
        assert row.fidelity == pytest.approx(np.mean(np.sum(emb * full, 1)), abs=1e-5)
    work = curve_work(tiny_scratch, len(TEXTS), prune_counts(8), "importance", n_ranked=len(rows))
    assert ticks[-1] == (work, work)
