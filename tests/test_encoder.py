"""BertEncoder against transformers' BertModel, on the bundled weights and on a tiny random config."""
import json

import pytest
import torch
import transformers as tf

from models import BertEncoder, EncoderConfig, HeadLensError
from tests.conftest import SENTENCES

TOL = dict(atol=1e-5, rtol=0)


def compare_with_bert(folder, texts, second=None):
    """Our encoder of ``folder`` against BertModel on ``texts`` (each paired with ``second``'s, when given)."""
    ref = tf.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    tok = tf.AutoTokenizer.from_pretrained(folder)
    ours = BertEncoder.from_pretrained(folder)
    enc = tok(texts, second, padding=True, return_tensors="pt")
    with torch.inference_mode():
        want = ref(**enc, output_attentions=True)
        got = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        alone = ours.attention_weights(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    real = enc["attention_mask"].bool()  # padded positions carry no meaning and are never shown
    torch.testing.assert_close(got.last_hidden_state[real], want.last_hidden_state[real], **TOL)
    assert len(got.attentions) == len(want.attentions) == alone.shape[1]
    for a, w, b in zip(got.attentions, alone.unbind(1), want.attentions):
        assert a.shape == w.shape == b.shape
        torch.testing.assert_close(a.transpose(1, 2)[real], b.transpose(1, 2)[real], **TOL)  # (N, H, L)
        torch.testing.assert_close(w.transpose(1, 2)[real], b.transpose(1, 2)[real], **TOL)  # the weights alone
    return ours


def test_bundled_minilm_matches_transformers(minilm_dir):
    ours = compare_with_bert(minilm_dir, SENTENCES)
    assert (ours.config.num_hidden_layers, ours.config.num_attention_heads) == (6, 12)


def test_tiny_random_bert_matches_transformers(tiny):
    compare_with_bert(tiny("bert"), SENTENCES)


def test_a_sentence_pair_reads_its_second_segment_as_transformers_does(tiny):
    """Two sentences in one input, the second's token type 1 (its own segment embedding): every hidden state and
    weight as BertModel's."""
    assert tf.AutoTokenizer.from_pretrained(tiny("bert"))(SENTENCES[0], SENTENCES[1])["token_type_ids"][-1] == 1
    compare_with_bert(tiny("bert"), SENTENCES[:2], SENTENCES[1::-1])


def test_the_layers_run_alone_see_every_token(tiny):
    """``run_layers`` told nothing of causality, as a trace or a patching run calls it, runs an encoder both ways:
    what it leaves is BertModel's last hidden state."""
    folder = tiny("bert")
    ref = tf.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = tf.AutoTokenizer.from_pretrained(folder)(SENTENCES[0], return_tensors="pt")["input_ids"]
    ours = BertEncoder.from_pretrained(folder)
    with torch.inference_mode():
        x, _ = ours.run_layers(ours.embed(ids), need_weights=False)
        torch.testing.assert_close(ours.finish(x), ref(ids).last_hidden_state, **TOL)


def test_checkpoint_with_task_head_loads(tmp_path, minilm_dir):
    """A BertForMaskedLM checkpoint prefixes its encoder weights with 'bert.'."""
    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=32)
    mlm = tf.BertForMaskedLM(config).eval()
    mlm.save_pretrained(tmp_path)
    ours = BertEncoder.from_pretrained(tmp_path)
    ids = torch.tensor([[2, 5, 9, 3]])
    with torch.inference_mode():
        want = mlm.bert(ids, output_attentions=True)
        got = ours(ids)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, **TOL)


def test_untrained_is_seeded_and_bert_initialised(minilm_dir):
    config = EncoderConfig.from_dict(json.loads((minilm_dir / "config.json").read_text()))
    a, b, c = BertEncoder.untrained(config, 0), BertEncoder.untrained(config, 0), BertEncoder.untrained(config, 1)
    wa = a.layers[0].attn.in_proj_weight
    assert torch.equal(wa, b.layers[0].attn.in_proj_weight)
    assert not torch.equal(wa, c.layers[0].attn.in_proj_weight)
    assert abs(wa.std().item() - config.initializer_range) < 2e-3
    assert abs(wa.mean().item()) < 2e-3  # drawn around zero
    assert torch.all(a.layers[0].ln_attn.weight == 1) and torch.all(a.layers[0].attn.in_proj_bias == 0)
    assert torch.all(a.layers[0].ln_attn.bias == 0) and torch.all(a.layers[-1].ln_ffn.bias == 0)
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    with torch.inference_mode():
        w = a(ids).attentions[0]
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 12, 6))
    # untrained heads are close to uniform: no weight far from 1/6
    assert w.max() < 0.5


def test_head_mask_silences_a_layer(minilm_dir):
    ours = BertEncoder.from_pretrained(minilm_dir)
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    mask = torch.ones(6, 12)
    mask[0] = 0
    with torch.inference_mode():
        out = ours(ids, head_mask=mask)
        x = ours.embeddings(ids, None)
        block = ours.layers[0]
        # with every head off, attention adds only the output projection's bias
        want = block.ln_attn(x + block.attn.out_proj.bias)
        want = block.ln_ffn(want + block.ffn_out(block.act(block.ffn_in(want))))
        x1, _ = block(x, head_mask=mask[0])
    assert torch.all(out.attentions[0] == 0)
    torch.testing.assert_close(x1, want, **TOL)


def test_causal_encoder_sees_no_later_token(minilm_dir):
    ours = BertEncoder.from_pretrained(minilm_dir)
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    with torch.inference_mode():
        out = ours(ids, causal=True)
        full = out.last_hidden_state
        prefix = ours(ids[:, :4], causal=True).last_hidden_state
        alone = ours.attention_weights(ids, causal=True)
    torch.testing.assert_close(full[:, :4], prefix, **TOL)
    assert not torch.triu(alone, 1).any() and alone[..., 0, 0].eq(1).all()  # the weights alone: causal too
    torch.testing.assert_close(alone[0], torch.stack(out.attentions, 1)[0], **TOL)


@pytest.mark.parametrize("change,message", [
    ({"model_type": "gpt2"}, "implements BERT encoders"),
    ({"position_embedding_type": "relative_key"}, "absolute position"),
    ({"hidden_act": "swish_custom"}, "no activation"),
])
def test_config_the_encoder_cannot_run(change, message):
    with pytest.raises(HeadLensError, match=message):
        EncoderConfig.from_dict({"model_type": "bert", **change})


def test_weights_that_are_not_bert(tmp_path, minilm_dir):
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text((minilm_dir / "config.json").read_text())
    save_file({"foo.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadLensError, match="not BERT encoder weights: missing embeddings"):
        BertEncoder.from_pretrained(tmp_path)
