"""The from-scratch Gemma 3 stack against transformers' eager Gemma3ForCausalLM on tiny random configs:
sliding and global layers with their own rotary bases, QK-norm, a scale that is not 1 / sqrt(head_dim),
one and two key/value heads, norms whose weights are not zero; texts shorter and longer than the window."""
import numpy as np
import pytest
import torch
import transformers as tf

from models import HeadLensError, load_model
from tests.conftest import _bpe_vocab

SHORT = ["Which do you like better, coffee or tea?", "Hi"]
LONG = "The cat sat on the mat because it was warm, and the dog lay by the door because it was cold outside."
WINDOW = 6


def build(folder, kv_heads: int):
    vocab, merges = _bpe_vocab()
    torch.manual_seed(kv_heads)
    config = tf.Gemma3TextConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=kv_heads, head_dim=16, max_position_embeddings=128, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=12,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 5000.0}},
        initializer_range=0.4, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    hf = tf.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # norms away from their zero start, so that 1 + weight matters
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.3)
    hf.save_pretrained(folder)
    tok = tf.GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                               pad_token="<pad>")
    tok.save_pretrained(folder)
    return folder, tf.Gemma3ForCausalLM.from_pretrained(folder, attn_implementation="eager").eval(), tok


@pytest.fixture(scope="module", params=[1, 2])
def gemma(request, tmp_path_factory):
    return build(tmp_path_factory.mktemp(f"gemma3-kv{request.param}"), request.param)


def reference(hf, tok, text):
    ids = tok(text, return_tensors="pt")
    with torch.inference_mode():
        out = hf(**ids, output_attentions=True)
    return torch.stack(out.attentions, dim=1)[0].numpy(), out.logits[0].numpy()


def test_attention_and_logits_equal_transformers_on_short_texts_and_past_the_window(gemma):
    folder, hf, tok = gemma
    ours = load_model(folder, backend="scratch")
    theirs = load_model(folder)
    assert ours.causal and (ours.n_layers, ours.n_heads) == (3, 4)
    for res, via_hf in zip(ours.attend(SHORT + [LONG]), theirs.attend(SHORT + [LONG])):
        weights, logits = reference(hf, tok, res.text)
        np.testing.assert_allclose(res.weights, weights, atol=1e-4)
        np.testing.assert_allclose(via_hf.weights, weights, atol=1e-4)
        ids = tok(res.text, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            got = ours.stack(ids).logits[0].numpy()
        np.testing.assert_allclose(got, logits, atol=1e-3)
    n = len(res.tokens)
    assert n > 2 * WINDOW
    far = np.tril(np.ones((n, n), dtype=bool), -WINDOW)  # keys at least a window behind the query
    assert not res.weights[[0, 2]][..., far].any()        # the sliding layers see none of them
    assert res.weights[1][..., far].any()                 # the global layer does


def test_it_saves_and_opens_again_and_prunes_like_a_head_mask(gemma, tmp_path):
    folder, hf, tok = gemma
    ours = load_model(folder, backend="scratch")
    ours.save(tmp_path / "again")
    again = load_model(tmp_path / "again")  # transformers reads what we wrote
    np.testing.assert_allclose(again.attend(LONG).weights, reference(hf, tok, LONG)[0], atol=1e-4)
    mask = np.ones((3, 4), dtype=np.float32)
    mask[0, 1] = mask[1, 3] = 0
    for a, b in zip(ours.pruned([(0, 1), (1, 3)]).attend(SHORT), ours.attend(SHORT, head_mask=mask)):
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-5)


def test_configs_the_engine_cannot_run_get_a_sentence(tmp_path):
    import json

    from models.stacks.gemma3 import Gemma3Config

    base = {"model_type": "gemma3_text", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    for change, said in [({"hidden_activation": "gelu"}, "hidden_activation"),
                         ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
                         ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0}}}, "linear"),
                         ({"layer_types": ["sliding_attention"]}, "name 2 layers"),
                         ({"num_key_value_heads": 3}, "evenly")]:
        with pytest.raises(HeadLensError, match=said):
            Gemma3Config.from_dict({**base, **change})
    assert Gemma3Config.from_dict({**base, "num_hidden_layers": 12}).layer_types[5] == "full_attention"
    json.dumps(Gemma3Config.from_dict(base).to_dict())


# --- effects on Gemma 3: its norm after the attention frozen at its scale, as the final norm is ------------

TEXT = "The cat sat on the mat because it was warm."


def hooked(hf, tok, text):
    """Each layer's input, o_proj input (z) and output, and post-norm MLP output; the last layer's output; logits."""
    ids = tok(text, return_tensors="pt")["input_ids"]
    got = {"resid": [], "z": [], "o": [], "mlp": []}
    handles = []
    for layer in hf.model.layers:
        handles.append(layer.register_forward_pre_hook(
            lambda m, args, kw: got["resid"].append((args[0] if args else kw["hidden_states"])[0].double()),
            with_kwargs=True))
        def keep(m, args, out):
            got["z"].append(args[0][0].double())
            got["o"].append(out[0].double())

        handles.append(layer.self_attn.o_proj.register_forward_hook(keep))
        handles.append(layer.post_feedforward_layernorm.register_forward_hook(
            lambda m, a, out: got["mlp"].append(out[0].double())))
    handles.append(hf.model.layers[-1].register_forward_hook(
        lambda m, a, out: got.__setitem__("out", (out[0] if isinstance(out, tuple) else out)[0].double())))
    try:
        with torch.inference_mode():
            got["logits"] = hf(ids, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    return got


def frozen(norm, x):
    """A Gemma norm's scale at ``x`` (float64): (1 + weight) / rms(x)."""
    return (1 + norm.weight.double()) / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)


@torch.no_grad()
def test_attribution_vocabulary_and_copying_read_through_the_norm_after_the_attention(gemma):
    from analysis.effects import logit_attribution, parts_total
    from analysis.effects.vocabulary import copy_sample, copying_scores, head_vocabulary, ov_logits

    folder, hf, tok = gemma
    ours = load_model(folder, backend="scratch")
    ref = hooked(hf, tok, TEXT)
    logits = ref["logits"].logits[0, -1]
    answer, distractor = logits.topk(2).indices.tolist()
    frame = logit_attribution(ours, TEXT, answer, distractor)
    direction = (hf.lm_head.weight[answer] - hf.lm_head.weight[distractor]).double()
    final = frozen(hf.model.norm, ref["out"][-1])
    Dh = 16
    for layer, block in enumerate(hf.model.layers):
        post = frozen(block.post_attention_layernorm, ref["o"][layer][-1])
        w = block.self_attn.o_proj.weight.double()
        for head in range(4):
            part = w[:, head * Dh:(head + 1) * Dh] @ ref["z"][layer][-1, head * Dh:(head + 1) * Dh] * post
            got = frame.query("layer == @layer and head == @head")["attribution"].item()
            assert got == pytest.approx(float(part * final @ direction), abs=1e-5)
        assert frame.attrs["mlp"][layer] == pytest.approx(float(ref["mlp"][layer][-1] * final @ direction), abs=1e-5)
    own = float(logits[answer] - logits[distractor])
    assert parts_total(frame) == pytest.approx(own, abs=1e-4) and frame.attrs["logit_diff"] == pytest.approx(own, abs=1e-4)
    words = head_vocabulary(ours, TEXT, 1, 2, k=5)
    post = frozen(hf.model.layers[1].post_attention_layernorm, ref["o"][1][-1])
    result = hf.model.layers[1].self_attn.o_proj.weight.double()[:, 32:48] @ ref["z"][1][-1, 32:48] * post
    want = hf.lm_head.weight.double() @ (result * final)
    np.testing.assert_allclose(words.query("direction == 'up'")["logit"], want.topk(5).values.numpy(), atol=1e-5)
    sample = copy_sample(ours, size=40)
    ids = torch.tensor(sample)
    with torch.no_grad():
        block = hf.model.layers[0]
        v = block.self_attn.v_proj(block.input_layernorm(hf.model.embed_tokens(ids)))    # scaled embeddings
        kv = 3 // (4 // hf.config.num_key_value_heads)
        out = v[:, kv * Dh:(kv + 1) * Dh] @ block.self_attn.o_proj.weight[:, 3 * Dh:4 * Dh].T
        expected = hf.lm_head(hf.model.norm(block.post_attention_layernorm(out)))
    np.testing.assert_allclose(ov_logits(ours, 0, 3, sample).numpy(), expected.numpy(), atol=1e-5)
    own_logit = expected.gather(1, ids.view(-1, 1))
    scores = copying_scores(ours, tokens=sample, k=3)
    assert scores.query("layer == 0 and head == 3")["copying"].item() == float(
        ((expected > own_logit).sum(1) < 3).double().mean())


@torch.no_grad()
def test_patching_and_the_routes_on_gemma3(gemma):
    from analysis.effects import patch_heads
    from analysis.effects.routes import prediction_flow
    from tests.test_effects import run_hf

    folder, hf, tok = gemma
    ours = load_model(folder, backend="scratch")
    clean, corrupted = "The cat sat on the mat because it was warm.", "The cat sat on the mat because it was cold."
    a, b = run_hf(hf, tok, clean), run_hf(hf, tok, corrupted)
    answer = int(a["logits"][-1].argmax())
    distractor = int(b["logits"][-1].argmax()) if int(b["logits"][-1].argmax()) != answer else \
        int(b["logits"][-1].topk(2).indices[1])
    ld = lambda got: float(got["logits"][-1, answer] - got["logits"][-1, distractor])  # noqa: E731
    heads = patch_heads(ours, clean, corrupted, answer, distractor)
    for layer, head in ((0, 1), (2, 3)):
        want = (ld(run_hf(hf, tok, corrupted, (layer, head, None, a["z"][layer]))) - ld(b)) / (ld(a) - ld(b))
        assert heads.query("layer == @layer and head == @head")["recovered"].item() == pytest.approx(want, abs=1e-4)
    ref = hooked(hf, tok, clean)
    s = prediction_flow(ours, clean).shares
    np.testing.assert_allclose(s.heads.sum((1, 3)) + s.attn_residual + s.attn_bias, 1, atol=1e-9)
    weights = ref["logits"].attentions
    Dh, H = 16, 4
    for layer, block in enumerate(hf.model.layers):  # the attention's update at the last token, part by part
        x, i = ref["resid"][layer], len(ref["resid"][layer]) - 1
        post = frozen(block.post_attention_layernorm, ref["o"][layer][i])
        mid = x[i] + ref["o"][layer][i] * post
        v = block.self_attn.v_proj(block.input_layernorm(x.float())).double()
        prox = lambda part: max(0.0, float(mid.abs().sum() - (mid - part).abs().sum()))  # noqa: E731
        parts = np.zeros((H, i + 1))
        for h in range(H):
            g = h // (H // hf.config.num_key_value_heads)
            write = block.self_attn.o_proj.weight.double()[:, h * Dh:(h + 1) * Dh] @ v[:, g * Dh:(g + 1) * Dh].T
            for j in range(i + 1):
                parts[h, j] = prox(weights[layer][0, h, i, j].double() * write[:, j] * post)
        total = parts.sum() + prox(x[i])
        np.testing.assert_allclose(s.heads[layer, :, i, :i + 1], parts / total, atol=1e-5)
        assert s.attn_residual[layer, i] == pytest.approx(prox(x[i]) / total, abs=1e-5)


# --- the sliding window, drawn: keys a window or more back are not visible, as later ones are ------------------

@pytest.mark.slow
def test_a_sliding_layers_keys_beyond_its_window_are_not_visible_in_every_view(gemma):
    from analysis import make_view
    from analysis.attention.long import long_view

    folder, hf, tok = gemma
    for model in (load_model(folder, backend="scratch"), load_model(folder)):
        assert model.windows == (WINDOW, None, WINDOW)
        att = model.attend(LONG)
        assert att.windows == (WINDOW, None, WINDOW)
        n = len(att.tokens)
        q, k = np.indices((n, n))
        for layer in range(3):
            visible = make_view(att).visible(layer)
            want = (k <= q) & ((q - k < WINDOW) if layer != 1 else True)
            np.testing.assert_array_equal(visible, want)
            assert not att.weights[layer][:, ~visible].any()       # nothing there to draw
            assert (att.weights[layer][:, visible] > 0).all()        # and every visible key has some weight
        merged = make_view(att, merge_words=True)                    # a word sees a word when a token of it does
        for layer in (0, 1):
            token_level = make_view(att).visible(layer)
            brute = np.array([[token_level[a:b, c:d].any() for c, d in merged.key_spans] for a, b in merged.query_spans])
            np.testing.assert_array_equal(merged.visible(layer), brute)
    long = load_model(folder, backend="scratch").attend_long(LONG)
    for layer in range(3):  # a sliding layer scores only its window's keys; the weights are the same
        np.testing.assert_allclose(long.weights(layer), att.weights[layer], atol=1e-5)
        for start, stop, w, entropy, _ in long.blocks(layer, rows=(10, n), step=1, with_entropy=True):
            assert start >= 10  # blocks that start past the window: the keys before it are not scored
            np.testing.assert_allclose(w.numpy(), att.weights[layer][:, start:stop, :stop], atol=1e-5)
            p = att.weights[layer][:, start:stop, :stop]
            want = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0)).sum(-1)
            np.testing.assert_allclose(entropy.numpy(), want, atol=1e-4)
    lv = long_view(long)
    m = len(lv.labels)
    np.testing.assert_array_equal(lv.visible((0, m), (0, m), 0), (k <= q) & (q - k < WINDOW))
    starts = np.arange(0, m, 4)
    hidden = lv.hidden_blocks(starts, starts, layer=0)
    for a, qs in enumerate(starts):                                  # a block is hidden when no cell of it is seen
        for b, ks in enumerate(starts):
            cells = ((k <= q) & (q - k < WINDOW))[qs:qs + 4, ks:ks + 4]
            assert hidden[a, b] == (not cells.any())


def test_explore_greys_the_keys_beyond_a_sliding_layers_window_and_names_the_global_layers(gemma, new_app):
    from tests.conftest import decode, figures, heatmaps

    folder, hf, tok = gemma
    at = new_app({"model": "custom", "custom_model": str(folder), "text": LONG, "layer": "0"},
                 page="app_pages/explore.py")
    assert not at.error, [e.value for e in at.error]
    picker = at.selectbox(key="layer")
    assert [picker.format_func(i) for i in range(3)] == ["0 local", "1 global", "2 local"]
    att = load_model(folder).attend(LONG)
    n = len(att.tokens)
    q, k = np.indices((n, n))
    z = decode(heatmaps(figures(at)[0])[0]["z"]).astype(float)
    hidden = (k > q) | (q - k >= WINDOW)
    assert np.isnan(z[hidden]).all() and not np.isnan(z[~hidden]).any()
    assert any("sees only the last 6 tokens" in c.value for c in at.caption)
    picker.set_value(1).run()
    z = decode(heatmaps(figures(at)[0])[0]["z"]).astype(float)
    assert not np.isnan(z[(k <= q) & (q - k >= WINDOW)]).any()     # the global layer sees them
