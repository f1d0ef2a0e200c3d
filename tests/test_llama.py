"""Our Llama-family decoder against transformers' eager Llama, Qwen2 and Mistral, on tiny random configs
built here (HF's tiny-config style): every attention weight, the logits, saving, and pruning query
heads with their key/value groups."""
import json

import numpy as np
import pytest
import torch
import transformers as tf

from models import HeadLensError, load_model
from models.mha import MultiHeadAttention
from models.run import Edits
from tests.conftest import _bpe_vocab

TEXTS = ["Which do you like better, coffee or tea?", "The cat sat on the mat because it was warm.", "Hi"]
SMALL = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, initializer_range=0.5, bos_token_id=0, eos_token_id=2, pad_token_id=1)
FAMILIES = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(rope_theta=500.0, attention_bias=True)),
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(rope_theta=10000.0, tie_word_embeddings=True)),
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, dict(rope_theta=10000.0, sliding_window=5)),
}


def build(family: str, folder, **config):
    """(family, folder, transformers' model, tokenizer) of a tiny random decoder saved with a byte-level
    BPE tokenizer; ``config`` over the family's sizes."""
    config_class, model_class, extra = FAMILIES[family]
    vocab, merges = _bpe_vocab()
    torch.manual_seed(0)
    hf = model_class(config_class(vocab_size=len(vocab), **{**SMALL, **extra, **config})).eval()
    hf.save_pretrained(folder)
    tok = tf.GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                               pad_token="<pad>")
    tok.save_pretrained(folder)
    return family, folder, model_class.from_pretrained(folder, attn_implementation="eager").eval(), tok


@pytest.fixture(scope="module", params=list(FAMILIES))
def tiny_decoder(request, tmp_path_factory):
    return build(request.param, tmp_path_factory.mktemp(f"tiny-{request.param}"))


def reference(hf, tok, text):
    ids = tok(text, return_tensors="pt")
    with torch.inference_mode():
        out = hf(**ids, output_attentions=True)
    return torch.stack(out.attentions, dim=1)[0].numpy(), out.logits[0].numpy()


def test_every_weight_and_logit_equals_transformers(tiny_decoder):
    family, folder, hf, tok = tiny_decoder
    ours = load_model(folder, backend="scratch")
    theirs = load_model(folder)  # the transformers engine on the same folder
    assert ours.causal and ours.n_heads == 4
    for res, via_hf in zip(ours.attend(TEXTS), theirs.attend(TEXTS)):
        weights, logits = reference(hf, tok, res.text)
        assert res.tokens == tok.convert_ids_to_tokens(tok(res.text)["input_ids"])
        np.testing.assert_allclose(res.weights, weights, atol=1e-4)
        np.testing.assert_allclose(via_hf.weights, weights, atol=1e-4)
        assert not np.triu(res.weights, 1).any()
        ids = tok(res.text, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            got = ours.stack(ids).logits[0].numpy()
        np.testing.assert_allclose(got, logits, atol=1e-3)
    assert weights.max() > 0.5  # sharp enough heads for the comparison to mean something


def test_the_weights_alone_run_nothing_past_the_highest_layers_attention(tiny_decoder):
    """``attend`` forms each layer's weights into one buffer, as transformers gives them, and runs no feed-forward of
    the highest layer asked for (it changes no weight); a layer asked for twice is given twice; a layer below the
    ones asked for forms no weights (its attention takes the fused path)."""
    family, folder, hf, tok = tiny_decoder
    ours = load_model(folder, backend="scratch")
    ran, formed = [], []
    hooks = [layer.down.register_forward_hook(lambda *_, n=n: ran.append(n)) for n, layer in enumerate(ours.stack.layers)]
    hooks += [layer.attn.register_forward_pre_hook(lambda _, args, kwargs, n=n: formed.append(
        (n, kwargs["need_weights"])), with_kwargs=True) for n, layer in enumerate(ours.stack.layers)]
    try:
        every = ours.attend(TEXTS)  # one padded batch
        assert ran == [0] and formed == [(0, True), (1, True)]
        picked = ours.attend(TEXTS, layers=[1, 0, 1])
        assert ran == [0, 0]
        first = ours.attend(TEXTS, layers=[0])
        assert ran == [0, 0]  # layer 0 alone: its attention, and nothing after it
        del formed[:]
        top = ours.attend(TEXTS, layers=[1])
        assert formed == [(0, False), (1, True)]
        del formed[:]
        with torch.inference_mode():
            ours.stack(tok(TEXTS[1], return_tensors="pt")["input_ids"], need_weights=False)
        assert formed == [(0, False), (1, False)]
    finally:
        for hook in hooks:
            hook.remove()
    for res, some, low in zip(every, picked, first):
        weights, _ = reference(hf, tok, res.text)
        np.testing.assert_allclose(res.weights, weights, atol=1e-4)
        np.testing.assert_array_equal(some.weights, res.weights[[1, 0, 1]])
        np.testing.assert_array_equal(low.weights, res.weights[[0]])
    for res, high in zip(every, top):
        np.testing.assert_allclose(high.weights, res.weights[[1]], atol=1e-5)  # layer 0 fused: float32 apart


def test_the_sliding_window_hides_keys_further_back(tmp_path):
    _, folder, hf, tok = build("mistral", tmp_path)
    res = load_model(folder, backend="scratch").attend(TEXTS[1])
    n = len(res.tokens)
    far = np.tril(np.ones((n, n), dtype=bool), -5)  # key at least 5 behind the query
    assert n > 5 and not res.weights[..., far].any()


# what transformers writes into a config.json that the from-scratch engine does not carry: its own bookkeeping, and
# the keys that give no window a layer
NOT_CARRIED = {"dtype", "transformers_version", "use_cache", "initializer_range", "attention_dropout",
               "pretraining_tp", "mlp_bias", "max_window_layers", "use_sliding_window", "layer_types"}


def test_a_decoder_saves_and_opens_again_with_transformers_names(tiny_decoder, tmp_path):
    """Saved, a decoder's config.json holds every key transformers' own holds, with its value (its architecture,
    its rotary parameters under transformers 5's name), and transformers opens it with the same weights."""
    family, folder, hf, tok = tiny_decoder
    ours = load_model(folder, backend="scratch")
    ours.save(tmp_path / "again")
    theirs, written = (json.loads((f / "config.json").read_text()) for f in (folder, tmp_path / "again"))
    assert {k: written.get(k) for k in theirs.keys() - NOT_CARRIED} == {k: theirs[k] for k in theirs.keys() - NOT_CARRIED}
    assert written["architectures"] == [type(hf).__name__] and written["rope_parameters"]["rope_type"] == "default"
    assert written.keys() - theirs.keys() <= {"pruned_heads", "dropout", "attention_bias"}  # and nothing of its own
    again = load_model(tmp_path / "again")  # transformers reads what we wrote
    np.testing.assert_allclose(again.attend(TEXTS[0]).weights, reference(hf, tok, TEXTS[0])[0], atol=1e-4)


def qwen2(folder, written: dict | None = None, **window):
    """(transformers' Qwen2, tokenizer) of a tiny random Qwen2 with ``window`` in its config, its config.json then
    changed by ``written`` (a key given None is left out), as another version of transformers may have written it."""
    *_, tok = build("qwen2", folder, **window)
    config = json.loads((folder / "config.json").read_text())
    for key, value in (written or {}).items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return tf.Qwen2ForCausalLM.from_pretrained(folder, attn_implementation="eager").eval(), tok


def test_a_mistral_windows_every_layer_whatever_layer_types_its_file_gives(tmp_path):
    """transformers' Mistral (like its Llama) has no layer types: a config.json that names some all the same gives
    every layer the window, in transformers' run and in ours."""
    _, folder, _, tok = build("mistral", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "layer_types": ["full_attention", "sliding_attention"]}))
    hf = tf.MistralForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ours = load_model(folder, backend="scratch")
    assert ours.stack.windows == (5, 5)
    np.testing.assert_allclose(ours.attend(TEXTS[1]).weights, reference(hf, tok, TEXTS[1])[0], atol=1e-5)


@pytest.mark.parametrize("window, written, windows", [
    # the window's size written without use_sliding_window (as transformers 4 wrote Qwen2.5's): no window at all
    ({}, {"sliding_window": 3, "use_sliding_window": False, "max_window_layers": 0, "layer_types": None}, None),
    # with it, a window only from max_window_layers up, as layer_types says or, where the file has none, worked out
    ({"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}, {}, (None, 3)),
    ({"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}, {"layer_types": None}, (None, 3)),
    ({"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 0}, {"layer_types": None}, (3, 3)),
    # a file that leaves out the layers' count and max_window_layers: transformers' 32 layers, a window from 28 up
    # (weights drawn small: 32 layers of SMALL's drift apart by 6e-5 in float32)
    ({"use_sliding_window": True, "sliding_window": 3, "num_hidden_layers": 32, "initializer_range": 0.05},
     {"layer_types": None, "max_window_layers": None, "num_hidden_layers": None}, (None,) * 28 + (3,) * 4),
])
def test_qwen2_slides_its_window_in_the_layers_transformers_does(tmp_path, window, written, windows):
    """Qwen2's window as transformers reads it, layer by layer: every weight equals transformers' (a layer given a
    window it does not have loses every key further back, a weight of up to 1), and saved, transformers opens it
    with the same windows."""
    hf, tok = qwen2(tmp_path / "qwen2", written, **window)
    ours = load_model(tmp_path / "qwen2", backend="scratch")
    assert ours.stack.windows == windows
    weights, _ = reference(hf, tok, TEXTS[1])
    far = np.tril(np.ones(weights.shape[-2:], dtype=bool), -3)  # a key 3 or more behind its query
    assert [bool(w[:, far].any()) for w in weights] == [w is None for w in windows or (None,) * len(weights)]
    np.testing.assert_allclose(ours.attend(TEXTS[1]).weights, weights, atol=1e-5)
    ours.save(tmp_path / "again")
    again = tf.Qwen2ForCausalLM.from_pretrained(tmp_path / "again", attn_implementation="eager").eval()
    np.testing.assert_allclose(reference(again, tok, TEXTS[1])[0], weights, atol=1e-5)
    assert load_model(tmp_path / "again", backend="scratch").stack.windows == windows


def test_pruning_query_heads_drops_a_key_value_head_with_its_whole_group(tiny_decoder):
    family, folder, hf, tok = tiny_decoder
    model = load_model(folder, backend="scratch")
    heads = [(0, 0), (0, 1), (1, 2)]          # layer 0 loses group 0 whole; layer 1 keeps both groups
    pruned = model.pruned(heads)
    attn0, attn1 = pruned.stack.layers[0].attn, pruned.stack.layers[1].attn
    assert (attn0.num_heads, attn0.num_kv_heads, attn0.kv_heads) == (2, 1, [0, 0])
    assert (attn1.num_heads, attn1.num_kv_heads, attn1.kv_heads) == (3, 2, [0, 0, 1])  # heads 0, 1, 3
    assert pruned.stack.pruned_mask().tolist() == [[True, True, False, False], [False, False, True, False]]
    mask = np.ones((2, 4), dtype=np.float32)
    for layer, head in heads:
        mask[layer, head] = 0
    for a, b in zip(pruned.attend(TEXTS), model.attend(TEXTS, head_mask=mask)):
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-5)


def test_grouped_query_attention_equals_repeating_the_key_value_heads():
    torch.manual_seed(0)
    gqa = MultiHeadAttention(24, 6, num_kv_heads=2, bias=True).eval()
    full = MultiHeadAttention(24, 6, bias=True).eval()
    wq, wk, wv = gqa.in_proj_weight.split(gqa.sizes)
    bq, bk, bv = gqa.in_proj_bias.split(gqa.sizes)
    with torch.no_grad():  # each key/value head copied to the three query heads of its group
        full.in_proj_weight.copy_(torch.cat([wq, wk.view(2, 4, 24).repeat_interleave(3, 0).reshape(24, 24),
                                             wv.view(2, 4, 24).repeat_interleave(3, 0).reshape(24, 24)]))
        full.in_proj_bias.copy_(torch.cat([bq, bk.view(2, 4).repeat_interleave(3, 0).reshape(-1),
                                           bv.view(2, 4).repeat_interleave(3, 0).reshape(-1)]))
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 7, 24)
    with torch.inference_mode():
        a, wa = gqa(x, causal=True, average_attn_weights=False)
        b, wb = full(x, causal=True, average_attn_weights=False)
        fused, _ = gqa(x, causal=True, need_weights=False)
    torch.testing.assert_close(wa, wb)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(fused, a, atol=1e-5, rtol=0)


def test_configs_the_engine_cannot_run_get_a_sentence(tmp_path):
    for change, message in [({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "scales them"),
                            ({"hidden_act": "gelu"}, "SiLU"), ({"num_key_value_heads": 3}, "evenly")]:
        config = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1,
                  "intermediate_size": 8, "vocab_size": 10, **change}
        (tmp_path / "config.json").write_text(json.dumps(config))
        (tmp_path / "model.safetensors").write_bytes(b"")
        with pytest.raises(HeadLensError, match=message):
            load_model(tmp_path, backend="scratch")


def test_a_head_mean_ablated_by_a_mask_or_by_edits_is_transformers_with_its_o_proj_slice_set(tiny_decoder):
    """Head 1 of layer 0 given a constant output (its mean, as Pruning's mean ablation gives it), by a mask and fill in
    float64 on the float32 model or by the same edits: the logits and each layer's weights equal transformers' with
    that head's slice of o_proj's input set to it (the head's own weights returned as zero under a mask, as they
    are); the weights of the top layer asked for read its own edits; a run asked for neither weights nor logits
    gives neither."""
    family, folder, hf, tok = tiny_decoder
    stack = load_model(folder, backend="scratch").stack
    ids = tok(TEXTS[1], return_tensors="pt")["input_ids"]
    H = hf.config.num_attention_heads
    Dh = hf.config.hidden_size // H
    layer, head = 0, 1
    fill = torch.linspace(-1, 1, Dh, dtype=torch.float64)

    def put(module, args):
        z = args[0].clone()
        z[..., head * Dh:(head + 1) * Dh] = fill.to(z.dtype)
        return (z,)

    def halve(module, args, kwargs):
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] * 0.5}

    def theirs(hooks):
        handles = [hook(module) for module, hook in hooks]
        try:
            with torch.inference_mode():
                return hf(input_ids=ids, output_attentions=True)
        finally:
            for handle in handles:
                handle.remove()

    o_proj, attn1 = hf.model.layers[layer].self_attn.o_proj, hf.model.layers[1].self_attn
    ablated = theirs([(o_proj, lambda m: m.register_forward_pre_hook(put))])
    halved = theirs([(attn1, lambda m: m.register_forward_pre_hook(halve, with_kwargs=True))])
    plain = theirs([])
    mask = torch.ones(2, H, dtype=torch.float64)
    mask[layer, head] = 0
    fills = torch.zeros(2, H, Dh, dtype=torch.float64)
    fills[layer, head] = fill
    with torch.inference_mode():
        out = stack(ids, head_mask=mask, head_fill=fills)
        weights = stack.attention_weights(ids, head_mask=mask, head_fill=fills)[0]
        by_edits = stack.attention_weights(ids, edits=stack.switched_off(mask, fills))[0]
        top = stack.attention_weights(ids, layers=[1], edits=Edits({("attn_in", 1): lambda h: h * 0.5}))[0, 0]
        bare = stack(ids, need_weights=False, need_logits=False)
    assert out.attentions[0].dtype == weights.dtype == torch.float32
    torch.testing.assert_close(out.logits, ablated.logits, atol=1e-4, rtol=0)
    for i in range(2):
        masked = ablated.attentions[i][0] * mask[i].float().view(-1, 1, 1)
        torch.testing.assert_close(out.attentions[i][0], masked, atol=1e-5, rtol=0)
        torch.testing.assert_close(weights[i], masked, atol=1e-5, rtol=0)
        torch.testing.assert_close(by_edits[i], ablated.attentions[i][0], atol=1e-5, rtol=0)
    assert (weights[0, head] == 0).all() and ablated.attentions[0][0, head].sum() > 1
    torch.testing.assert_close(top, halved.attentions[1][0], atol=1e-5, rtol=0)
    assert (top - plain.attentions[1][0]).abs().max() > 1e-2  # halving the input moves the weights
    assert bare.attentions is None and bare.logits is None
