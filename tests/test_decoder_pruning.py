"""Pruning a decoder LLM by its next-token loss, against transformers' own Llama with heads removed by
hand (their columns of the output projection zeroed): the loss, each head's ablation importance, the
curves' losses and top-1 agreement, and the gradient of the loss; and what content attention sets
aside in a decoder (its first token, when that is a sink)."""
import numpy as np
import pandas as pd
import pytest
import torch

from analysis import head_importance, pruning_curve
from analysis.attention.views import SINK_SHARE, first_token_sink, make_view, set_aside
from models import HeadLensError, load_model
from models.result import Attention
from tests.test_llama import build

TEXTS = ["Which do you like better, coffee or tea?", "The cat sat on the mat because it was warm.",
         "Seven kites drifted over the harbour.", "Hi there"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(our model, transformers' model, tokenizer) of a tiny random Llama: 2 layers x 4 heads, 2 key/value heads."""
    _, folder, hf, tok = build("llama", tmp_path_factory.mktemp("tiny-llama"))
    return load_model(folder, backend="scratch"), hf, tok


def hf_loss(hf, tok, texts, off=()) -> tuple[float, list[np.ndarray]]:
    """transformers' mean next-token loss over every predicted token of ``texts`` and its top-1 predictions,
    with the heads in ``off`` removed by zeroing their columns of o_proj (on a copy of the weights)."""
    saved = {}
    dh = hf.config.hidden_size // hf.config.num_attention_heads
    for layer, head in off:
        weight = hf.model.layers[layer].self_attn.o_proj.weight
        saved.setdefault(layer, weight.detach().clone())
        with torch.no_grad():
            weight[:, head * dh:(head + 1) * dh] = 0
    try:
        total, count, tops = 0.0, 0, []
        for text in texts:
            ids = tok(text, return_tensors="pt")["input_ids"]
            with torch.inference_mode():
                logits = hf(ids).logits[0, :-1]
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
            tops.append(logits.argmax(-1).numpy())
        return total / count, tops
    finally:
        for layer, weight in saved.items():
            with torch.no_grad():
                hf.model.layers[layer].self_attn.o_proj.weight.copy_(weight)


@pytest.fixture(params=[None, 3], ids=["logits at once", "logits 3 positions and 7 tokens at a time"])
def blocks(request, monkeypatch, tiny):
    """The vocabulary's logits made for every predicted position at once, or a few positions at a time and, outside
    autograd, a few tokens of the vocabulary at a time (the last slice shorter)."""
    from models import language

    if request.param is not None:
        vocab = tiny[0].stack.unembedding().shape[0]
        assert vocab % 7
        monkeypatch.setattr(language, "LOGIT_ELEMENTS", request.param * vocab)
        monkeypatch.setattr(language, "VOCABULARY_SLICE", 7)
    return request.param


def test_the_loss_and_predictions_equal_transformers(tiny, blocks):
    ours, hf, tok = tiny
    loss, top = ours.predictions(TEXTS)
    want, tops = hf_loss(hf, tok, TEXTS)
    assert loss == pytest.approx(want, rel=1e-5)
    assert np.array_equal(top, np.concatenate(tops))
    with torch.inference_mode():
        assert float(ours.loss(TEXTS)) == pytest.approx(want, rel=1e-5)  # one padded batch


def test_ablation_importance_is_the_rise_of_transformers_loss_with_the_head_removed(tiny):
    ours, hf, tok = tiny
    imp = head_importance(ours, TEXTS, measure="loss", batch_size=3)  # two batches of different lengths
    full, _ = hf_loss(hf, tok, TEXTS)
    for row in imp.itertuples():
        off, _ = hf_loss(hf, tok, TEXTS, [(row.layer, row.head)])
        assert row.importance == pytest.approx(off - full, abs=1e-5), (row.layer, row.head)
    assert imp["importance"].abs().max() > 1e-3  # the heads do something


def test_gradient_importance_is_the_gradient_of_the_loss_by_each_heads_gate(tiny, blocks):
    """|dL/d(gate)| itself, not normalised per layer as for an embedding's importance; the reference gates
    each head of transformers' model by scaling its slice of o_proj's input, and differentiates its loss."""
    ours, hf, tok = tiny
    imp = head_importance(ours, TEXTS, method="gradient", measure="loss", batch_size=len(TEXTS))
    heads, dh = hf.config.num_attention_heads, hf.config.hidden_size // hf.config.num_attention_heads
    gate = torch.ones(hf.config.num_hidden_layers, heads, requires_grad=True)

    def gated(layer):
        def hook(module, args):
            x = args[0]
            return (x * gate[layer].repeat_interleave(dh),)
        return hook

    handles = [block.self_attn.o_proj.register_forward_pre_hook(gated(i)) for i, block in enumerate(hf.model.layers)]
    try:
        enc = tok(TEXTS, return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        (grad,) = torch.autograd.grad(hf(**enc, labels=labels).loss, gate)
    finally:
        for handle in handles:
            handle.remove()
    np.testing.assert_allclose(imp["importance"].to_numpy().reshape(grad.shape), grad.abs().numpy(), rtol=1e-4,
                               atol=1e-6)


def test_the_loss_keeps_no_logits_for_its_gradient(tiny, blocks):
    """Under autograd each block of logits is gone once the forward pass has moved on: nothing as wide as the
    vocabulary is kept for the backward pass (Gemma 3's 262,144 logits a position held 0.9 GB for 24 sentences)."""
    import gc
    import weakref

    ours, _, _ = tiny
    vocab = ours.stack.unembedding().shape[0]
    mask = torch.ones(ours.n_layers, ours.n_heads, requires_grad=True)
    wide = []

    def pack(t):
        if t.dim() and t.shape[-1] == vocab:
            wide.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = ours.loss(TEXTS, head_mask=mask)
    gc.collect()
    assert not [r for r in wide if r() is not None]
    (grad,) = torch.autograd.grad(loss, mask)
    assert grad.abs().sum() > 0


def test_a_pruned_copy_takes_gradients_where_its_model_does(tiny):
    """An opened model takes no weight gradients, and neither does its pruned copy: the importance of a pruned
    Gemma 3 made the gradient of its 262,144 x 640 embedding (670 MB) at every step of a curve."""
    ours, _, _ = tiny
    pruned = ours.pruned([(0, 1), (1, 2)])
    assert not any(w.requires_grad for w in ours.stack.parameters())
    assert not any(w.requires_grad for w in pruned.stack.parameters())
    mask = torch.ones(ours.n_layers, ours.n_heads, requires_grad=True)
    pruned.loss(TEXTS, head_mask=mask).backward()
    assert mask.grad.abs().sum() > 0 and all(w.grad is None for w in pruned.stack.parameters())
    learning = ours.stack.pruned_copy([(0, 0)]).requires_grad_(True).pruned_copy([(1, 0)])  # a model in training
    assert all(w.requires_grad for w in learning.parameters())


def test_curves_measure_each_pruned_model_as_transformers_with_those_heads_removed(tiny):
    ours, hf, tok = tiny
    full, tops = hf_loss(hf, tok, TEXTS)
    for order in ("importance", "random"):
        curve = pruning_curve(ours, TEXTS, order=order, step=0.25, measure="loss")
        assert curve["n_pruned"].tolist() == [0, 2, 4, 6, 8]
        assert curve["loss"].iloc[0] == pytest.approx(full, rel=1e-5) and curve["agreement"].iloc[0] == 1
        for row in curve.itertuples():
            loss, pruned_tops = hf_loss(hf, tok, TEXTS, row.heads)
            assert row.loss == pytest.approx(loss, rel=1e-4), (order, row.n_pruned)
            assert row.agreement == pytest.approx(np.mean(np.concatenate(pruned_tops) == np.concatenate(tops)))
        assert "fidelity" not in curve
    # Pruning's importance by gradient, as the server prepares it, stands for the curve's first step
    imp = head_importance(ours, TEXTS, method="gradient", measure="loss", reference=ours.predictions(TEXTS)[0])
    given = pruning_curve(ours, TEXTS, order="importance", step=0.25, measure="loss", importance=imp)
    want = pruning_curve(ours, TEXTS, order="importance", step=0.25, measure="loss")
    pd.testing.assert_frame_equal(given.drop(columns="forward_s"), want.drop(columns="forward_s"))


def test_the_loss_measure_needs_a_language_model(scratch_model):
    with pytest.raises(HeadLensError, match="not a language model"):
        head_importance(scratch_model, TEXTS, measure="loss")


def _attention(weights: np.ndarray, causal: bool, special=None) -> Attention:
    n = weights.shape[-1]
    return Attention(tokens=[f"t{i}" for i in range(n)], weights=weights.astype(np.float32), word_ids=list(range(n)),
                     special=np.zeros(n, bool) if special is None else np.asarray(special),
                     offsets=[(i, i + 1) for i in range(n)], text="x" * n, model_name="m", backend="scratch",
                     device="cpu", causal=causal)


def test_a_first_token_is_set_aside_when_later_queries_give_it_half_their_weight_or_more():
    n = 5
    uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]  # a causal head with no habit
    sink = np.tril(np.full((n, n), 0.1))
    sink[:, 0] = 0
    sink = sink * (1 - SINK_SHARE) / sink.sum(-1, keepdims=True).clip(1e-9)
    sink[:, 0] = SINK_SHARE + 0.01
    sink[0] = [1, 0, 0, 0, 0]
    sink = sink / sink.sum(-1, keepdims=True)
    assert not first_token_sink(_attention(uniform[None, None], causal=True))
    assert first_token_sink(_attention(sink[None, None], causal=True))
    assert not first_token_sink(_attention(sink[None, None], causal=False))  # an encoder's first token is [CLS]
    assert set_aside(_attention(sink[None, None], causal=True)).tolist() == [True, False, False, False, False]
    special = [True, False, False, False, True]  # a BOS token is set aside as special, and no more
    assert set_aside(_attention(sink[None, None], causal=True, special=special)).tolist() == special
    view = make_view(_attention(sink[None, None], causal=True), hide_special=True)
    assert view.query_labels == view.key_labels == ["t1", "t2", "t3", "t4"]
    np.testing.assert_allclose(view.weights.sum(-1), 1, atol=1e-6)
    assert view.visible().tolist() == np.tril(np.ones((4, 4), bool)).tolist()
