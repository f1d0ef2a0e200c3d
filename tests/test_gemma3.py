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
