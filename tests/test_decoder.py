"""The decoder built on our MultiHeadAttention: one block against PyTorch's, pruning, saving."""
import numpy as np
import pytest
import torch
from torch import nn

from models import HeadLensError, load_model
from models.stacks.decoder import Decoder, DecoderBlock, DecoderConfig


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padded", [False, True])
def test_one_block_equals_torch_pre_layernorm_layer_under_a_causal_mask(activation, padded):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(48, 4, dim_feedforward=96, dropout=0.0, activation=activation,
                                     norm_first=True, batch_first=True).eval()
    with torch.no_grad():  # non-zero biases and LayerNorm parameters, so a mix-up cannot hide
        for name, p in ref.named_parameters():
            if "bias" in name or "norm" in name:
                p.normal_()
    ours = DecoderBlock.from_torch(ref).eval()
    x = torch.randn(3, 9, 48)
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)  # bool, like the padding mask
    kpm = torch.arange(9)[None, :] >= torch.tensor([9, 6, 4])[:, None] if padded else None
    with torch.no_grad():
        want = ref(x, src_mask=causal, src_key_padding_mask=kpm, is_causal=True)
        got, weights = ours(x, key_padding_mask=kpm, need_weights=True)
    real = torch.ones(3, 9, dtype=torch.bool) if kpm is None else ~kpm
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
    assert weights.shape == (3, 4, 9, 9) and not weights.triu(1).any()  # causal: no weight on a later token
    with torch.no_grad():
        fused, none = ours(x, key_padding_mask=kpm, need_weights=False)
    assert none is None
    torch.testing.assert_close(fused[real], got[real], atol=1e-5, rtol=0)


def test_from_torch_needs_a_pre_layernorm_layer():
    with pytest.raises(ValueError, match="norm_first"):
        DecoderBlock.from_torch(nn.TransformerEncoderLayer(16, 2, batch_first=True))


def test_attention_only_blocks_have_no_feed_forward():
    model = Decoder.untrained(DecoderConfig(attention_only=True), seed=0)
    assert not any("mlp" in name for name, _ in model.named_parameters())
    full = Decoder.untrained(DecoderConfig(attention_only=False), seed=0)
    assert any("mlp_in" in name for name, _ in full.named_parameters())


def test_training_gradients_flow_through_the_fused_path():
    torch.manual_seed(0)
    model = Decoder.untrained(DecoderConfig(n_layers=2, n_heads=2, d_model=16, vocab_size=10, max_len=8), seed=1)
    ids = torch.randint(10, (4, 8))
    model.train()
    a = model(ids, need_weights=False).logits.square().sum()
    ga = torch.autograd.grad(a, list(model.parameters()))
    b = model(ids, need_weights=True).logits.square().sum()
    gb = torch.autograd.grad(b, list(model.parameters()))
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_a_decoder_prunes_saves_and_loads(tmp_path):
    from models.vocab import token_tokenizer
    from models.language import DecoderModel

    config = DecoderConfig(n_layers=2, n_heads=4, d_model=32, vocab_size=22, max_len=16, attention_only=False)
    tok = token_tokenizer(20, 16)
    model = DecoderModel(Decoder.untrained(config, seed=3).eval(), tok, "tiny decoder", torch.device("cpu"))
    text = "t1 t5 t7 t1 t5 t7 t2 t9"
    att = model.attend(text)
    assert att.tokens == text.split() and att.causal and not att.special.any()
    assert not np.triu(att.weights, 1).any()
    pruned = model.pruned([(0, 1), (1, 0), (1, 3)])
    mask = np.ones((2, 4), dtype=np.float32)
    mask[0, 1] = mask[1, 0] = mask[1, 3] = 0
    np.testing.assert_allclose(pruned.attend(text).weights, model.attend(text, head_mask=mask).weights, atol=1e-6)
    np.testing.assert_allclose(pruned.embed([text]), model.embed([text], head_mask=mask), atol=1e-6)
    folder = pruned.save(tmp_path / "d")
    again = load_model(folder, backend="scratch")
    np.testing.assert_allclose(again.attend(text).weights, pruned.attend(text).weights, atol=1e-6)
    assert again.pruned_heads.sum() == 3
    with pytest.raises(HeadLensError, match="trained in HeadLens"):
        load_model(folder)
    with torch.no_grad():
        loss = float(model.loss([text]))
    assert np.isfinite(loss) and loss == pytest.approx(np.log(22), abs=0.2)  # untrained: about uniform
