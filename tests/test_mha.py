"""MultiHeadAttention against three references: a per-head loop, torch.nn.MultiheadAttention, and SDPA."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.reference import per_head_loop
from models import MultiHeadAttention

TOL = dict(atol=1e-5, rtol=0)


def torch_mha(E=32, H=4, kdim=None, vdim=None, seed=0):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(E, H, batch_first=True, kdim=kdim, vdim=vdim).eval()
    with torch.no_grad():  # non-zero biases, so a bias mix-up cannot hide
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    return ref


def padding_mask(lengths, L):
    return torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None]  # (B, L), True = pad


@pytest.mark.parametrize("case", ["self", "cross", "cross_kvdim", "padded", "causal", "padded_causal"])
def test_from_torch_matches_pytorch(case):
    B, Lq, Lk, E, H = 3, 7, 7, 32, 4
    kdim = vdim = None
    if case.startswith("cross"):
        Lk = 5
    if case == "cross_kvdim":
        kdim, vdim = 24, 40
    ref = torch_mha(E, H, kdim, vdim)
    ours = MultiHeadAttention.from_torch(ref).eval()
    torch.manual_seed(1)
    x = torch.randn(B, Lq, E)
    key = x if Lk == Lq else torch.randn(B, Lk, kdim or E)
    value = x if Lk == Lq else torch.randn(B, Lk, vdim or E)
    kpm = padding_mask([7, 4, 2], Lk) if "padded" in case else None
    causal = "causal" in case
    attn_mask = torch.ones(Lq, Lk, dtype=torch.bool).triu(1) if causal else None
    with torch.no_grad():
        want_out, want_w = ref(x, key, value, key_padding_mask=kpm, attn_mask=attn_mask,
                               need_weights=True, average_attn_weights=False)
        out, w = ours(x, key, value, key_padding_mask=kpm, causal=causal, average_attn_weights=False)
    assert w.shape == (B, H, Lq, Lk)
    torch.testing.assert_close(w, want_w, **TOL)
    torch.testing.assert_close(out, want_out, **TOL)


def test_from_torch_copies_device_dtype_and_refuses_bias_kv():
    ref = torch_mha().double()
    ours = MultiHeadAttention.from_torch(ref)
    assert ours.in_proj_weight.dtype == torch.float64
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    out, w = ours(x, average_attn_weights=False)
    assert out.dtype == w.dtype == torch.float64
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(32, 4, add_bias_kv=True))


@pytest.mark.parametrize("kdim,vdim,Lk", [(None, None, 6), (24, 40, 9)])
def test_batched_heads_equal_per_head_loop(kdim, vdim, Lk):
    torch.manual_seed(0)
    m = MultiHeadAttention(48, 6, kdim=kdim, vdim=vdim).eval()
    with torch.no_grad():
        m.in_proj_bias.normal_()
        m.out_proj.bias.normal_()
    x = torch.randn(2, 6, 48)
    key = x if kdim is None else torch.randn(2, Lk, kdim)
    value = x if vdim is None else torch.randn(2, Lk, vdim)
    kpm = padding_mask([Lk, 3], Lk)
    with torch.no_grad():
        out, w = m(x, key, value, key_padding_mask=kpm, average_attn_weights=False)
        want_out, want_w = per_head_loop(m, x, key, value, kpm[:, None, :])
    torch.testing.assert_close(w, want_w, **TOL)
    torch.testing.assert_close(out, want_out, **TOL)


@pytest.mark.parametrize("masking", ["none", "padded", "causal"])
def test_output_equals_scaled_dot_product_attention(masking):
    torch.manual_seed(0)
    B, L, E, H = 2, 8, 32, 4
    m = MultiHeadAttention(E, H).eval()
    x = torch.randn(B, L, E)
    kpm = padding_mask([8, 5], L) if masking == "padded" else None
    with torch.no_grad():
        out, _ = m(x, key_padding_mask=kpm, causal=masking == "causal", average_attn_weights=False)
        q, k, v = (t.view(B, L, H, E // H).transpose(1, 2) for t in F.linear(x, m.in_proj_weight, m.in_proj_bias).split(E, -1))
        allowed = None if kpm is None else ~kpm[:, None, None, :]
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=masking == "causal")
        want = m.out_proj(sdpa.transpose(1, 2).reshape(B, L, E))
    torch.testing.assert_close(out, want, **TOL)


def test_weights_are_distributions_with_masks_respected():
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4).eval()
    x = torch.randn(3, 9, 32)
    kpm = padding_mask([9, 6, 1], 9)
    with torch.no_grad():
        _, w = m(x, key_padding_mask=kpm, causal=True, average_attn_weights=False)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 9))
    assert torch.all(w.masked_select(torch.ones(9, 9, dtype=torch.bool).triu(1)) == 0)
    assert torch.all(w[1, :, :, 6:] == 0) and torch.all(w[2, :, :, 1:] == 0)


def test_valid_lens_match_key_padding_mask():
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        out_a, w_a = m(x, valid_lens=torch.tensor([4, 2]), average_attn_weights=False)
        out_b, w_b = m(x, key_padding_mask=padding_mask([4, 2], 6), average_attn_weights=False)
        # per query (d2l's 2-D form): row i of text 0 sees i + 1 keys, which is the causal mask
        lens = torch.arange(1, 7).repeat(2, 1)
        out_c, w_c = m(x, valid_lens=lens, average_attn_weights=False)
        out_d, w_d = m(x, causal=True, average_attn_weights=False)
    torch.testing.assert_close(w_a, w_b)
    torch.testing.assert_close(out_a, out_b)
    torch.testing.assert_close(w_c, w_d)
    torch.testing.assert_close(out_c, out_d)


def test_fully_masked_query_gives_zeros_not_nan():
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        out, w = m(x, valid_lens=torch.tensor([[0, 1, 2, 3, 0], [5, 5, 5, 5, 5]]), average_attn_weights=False)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert torch.all(w[0, :, 0] == 0) and torch.all(w[0, :, 4] == 0)
    # no value reaches a query that sees nothing: its output is the output projection's bias
    torch.testing.assert_close(out[0, 0], m.out_proj.bias.detach())
    torch.testing.assert_close(w[1].sum(-1), torch.ones(4, 5))


def test_head_mask_switches_heads_off():
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        out, w = m(x, head_mask=torch.tensor([1.0, 0.0, 1.0, 1.0]), average_attn_weights=False)
        _, w_all = m(x, average_attn_weights=False)
        # the same result by zeroing head 1's value rows by hand
        v_rows = slice(2 * 32 + 8, 2 * 32 + 16)
        m.in_proj_weight[v_rows] = 0
        m.in_proj_bias[v_rows] = 0
        want, _ = m(x, average_attn_weights=False)
    assert torch.all(w[:, 1] == 0)
    torch.testing.assert_close(w[:, [0, 2, 3]], w_all[:, [0, 2, 3]])
    torch.testing.assert_close(out, want, **TOL)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4, dropout=0.5)
    x = torch.randn(1, 6, 32)
    with torch.no_grad():
        _, w_train = m.train()(x, average_attn_weights=False)
        _, w_eval = m.eval()(x, average_attn_weights=False)
    assert (w_train == 0).sum() > 0
    torch.testing.assert_close(w_eval.sum(-1), torch.ones(1, 4, 6))


def test_rejects_sizes_that_do_not_split_into_heads():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        MultiHeadAttention(30, 4)


def test_gradients_match_pytorch_in_training():
    """The in-place softmax is for inference only: training must still backpropagate correctly."""
    ref = torch_mha()
    ours = MultiHeadAttention.from_torch(ref)
    x = torch.randn(2, 6, 32)
    kpm = padding_mask([6, 4], 6)
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref.train()(x_ref, x_ref, x_ref, key_padding_mask=kpm)[0].square().sum().backward()
    ours.train()(x_ours, key_padding_mask=kpm)[0].square().sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, **TOL)
    torch.testing.assert_close(ours.in_proj_weight.grad, ref.in_proj_weight.grad, **TOL)


# --- a drop-in for torch.nn.MultiheadAttention: the mask and weight arguments of PyTorch's own tests ------

def _attn_mask(kind, B, H, Lq, Lk, gen):
    if kind == "none":
        return None
    shape = (Lq, Lk) if kind.endswith("2d") else (B * H, Lq, Lk)
    blocked = torch.rand(shape, generator=gen) < 0.3
    blocked[..., 0] = False  # every query keeps a key: PyTorch gives NaN for a row with none
    if kind.startswith("bool"):
        return blocked
    return torch.randn(shape, generator=gen).masked_fill(blocked, float("-inf"))


def _key_padding_mask(kind, B, Lk, gen):
    if kind == "none":
        return None
    pad = padding_mask([Lk, Lk - 2, 3][:B], Lk)
    if kind == "bool":
        return pad
    return torch.randn(B, Lk, generator=gen).masked_fill(pad, float("-inf"))


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask and attn_mask")  # PyTorch still takes them
@pytest.mark.parametrize("attn_mask", ["none", "bool2d", "float2d", "bool3d", "float3d"])
@pytest.mark.parametrize("kpm", ["none", "bool", "float"])
@pytest.mark.parametrize("cross", [False, True])
def test_masks_and_weights_as_pytorch_takes_them(attn_mask, kpm, cross):
    B, Lq, E, H = 3, 6, 32, 4
    Lk = 7 if cross else Lq
    gen = torch.Generator().manual_seed(hash((attn_mask, kpm, cross)) % 1000)
    ref = torch_mha(E, H)
    ours = MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(B, Lq, E, generator=gen)
    kv = torch.randn(B, Lk, E, generator=gen) if cross else x
    am, pm = _attn_mask(attn_mask, B, H, Lq, Lk, gen), _key_padding_mask(kpm, B, Lk, gen)
    with torch.no_grad():
        for need, average in [(True, True), (True, False), (False, True)]:
            want_out, want_w = ref(x, kv, kv, key_padding_mask=pm, need_weights=need, attn_mask=am,
                                   average_attn_weights=average)
            out, w = ours(x, kv, kv, key_padding_mask=pm, need_weights=need, attn_mask=am,
                          average_attn_weights=average)
            torch.testing.assert_close(out, want_out, **TOL)
            if need:
                assert w.shape == ((B, Lq, Lk) if average else (B, H, Lq, Lk))
                torch.testing.assert_close(w, want_w, **TOL)
            else:
                assert w is None and want_w is None


@pytest.mark.parametrize("window", [None, 100])
def test_a_long_causal_text_scores_only_the_keys_its_queries_see(window, monkeypatch):
    """Past ``BLOCKED_FROM`` tokens, causal weights come a block of query rows at a time, scored only against
    keys before the block's end and within the window: equal to the masked whole, and no larger score matrix."""
    from models import kernels

    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4, window=window).eval()
    x = torch.randn(2, 3 * kernels.BLOCK_ROWS + 17, 32)
    L = x.shape[1]
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0])
    formed, matmul = [], torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: formed.append(tuple(a.shape[:-1]) + (b.shape[-1],)) or matmul(a, b))
    with torch.inference_mode():
        out, weights = m(x, causal=True, average_attn_weights=False, head_mask=mask)
    monkeypatch.setattr(torch, "matmul", matmul)
    seen = kernels.BLOCK_ROWS + (L if window is None else window - 1)
    assert max(s[-1] for s in formed if len(s) == 4) <= min(L, seen)  # no (L, L) matrix of scores
    i = torch.arange(L)
    blocked = i.view(1, -1) > i.view(-1, 1)
    if window is not None:
        blocked |= (i.view(-1, 1) - i.view(1, -1)) >= window
    q, k, v = m.heads_qkv(x, x, x)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(m.head_dim)).masked_fill(blocked, float("-inf"))
    want = torch.softmax(scores, dim=-1) * mask.view(1, 4, 1, 1)
    torch.testing.assert_close(weights, want, **TOL)
    torch.testing.assert_close(out, m.out_proj((want @ v).transpose(1, 2).reshape(2, L, 32)), **TOL)
    into = torch.zeros(2, 4, L, L)  # a stack's buffer of every layer's weights: written in place, not copied
    with torch.inference_mode():
        _, written = m(x, causal=True, average_attn_weights=False, head_mask=mask, into=into)
    assert written.data_ptr() == into.data_ptr()
    torch.testing.assert_close(into, want, **TOL)
