"""The norms every family reads (``models.stacks.norms``) against transformers' own modules, in the dtypes a model
runs in (bfloat16 computed in float32 as transformers does, float32, float64), and a norm frozen at a run's scale
(``frozen``) against the norm it stands for, in the dtype of the stream it is given."""
import pytest
import torch
from torch import nn
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from models.stacks.norms import GemmaRMSNorm, RMSNorm, frozen

E, EPS = 16, 1e-5


def _pair(ours_class, theirs_class, dtype):
    """Ours and transformers' norm with the same random weight (away from 0 and 1), in ``dtype``."""
    torch.manual_seed(0)
    ours, theirs = ours_class(E, EPS), theirs_class(E, eps=EPS)
    weight = torch.randn(E) * 0.5 + 0.3
    with torch.no_grad():
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    return ours.to(dtype), theirs.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("ours_class, theirs_class", [(RMSNorm, LlamaRMSNorm), (GemmaRMSNorm, Gemma3RMSNorm)])
def test_a_norm_is_transformers_in_the_models_dtype(ours_class, theirs_class, dtype):
    """Llama's RMSNorm casts the normed stream back before its weight, Gemma's after ``1 + weight``; both compute the
    mean square in float32 for a half-precision stream: the same bits as transformers'. A float64 stream stays
    float64 in ours, where transformers computes it in float32: equal to float32's 1e-6."""
    ours, theirs = _pair(ours_class, theirs_class, dtype)
    x = (torch.randn(3, 5, E) * 4 + 1).to(dtype)
    got, want = ours(x), theirs(x)
    assert got.dtype == want.dtype == dtype
    if dtype == torch.float64:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        in_float64 = x / x.pow(2).mean(-1, keepdim=True).add(EPS).sqrt() * ours.gain()  # every step in float64
        torch.testing.assert_close(got, in_float64, rtol=1e-13, atol=1e-13)
    else:
        assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("norm_dtype, x_dtype", [(torch.float32, torch.float64), (torch.bfloat16, torch.bfloat16)])
def test_a_frozen_rms_norm_is_the_norm_as_a_linear_map_in_the_streams_dtype(norm_dtype, x_dtype):
    """``frozen`` gives the gain, no bias and each vector's 1/rms, in the stream's dtype whatever the norm's (a float32
    model read in float64; a bfloat16 stream, whose rms is taken in float32): gain * scale * x is the norm of x."""
    for norm_class in (RMSNorm, GemmaRMSNorm):
        norm, _ = _pair(norm_class, LlamaRMSNorm, norm_dtype)
        x = (torch.randn(4, E) * 3).to(x_dtype)
        gain, bias, scale = frozen(norm, x)
        assert bias is None and gain.dtype == scale.dtype == x_dtype, (gain.dtype, scale.dtype)
        assert scale.shape == (4, 1)
        want = x.double() / x.double().pow(2).mean(-1, keepdim=True).add(EPS).sqrt()
        want = want * (norm.weight.double() + (1.0 if norm_class is GemmaRMSNorm else 0.0))
        tolerance = 1e-6 if x_dtype == torch.float64 else 5e-2  # Gemma's 1 + weight is taken in the weight's float32
        torch.testing.assert_close((gain * scale * x).double(), want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("bias", [True, False])
def test_a_frozen_layer_norm_centres_scales_and_keeps_its_bias_or_none(bias):
    """A LayerNorm frozen at ``x``: its weight and bias (None for a LayerNorm without one) in ``x``'s dtype, and each
    vector's 1/std; ``(x - mean) * scale * weight + bias`` is the LayerNorm of ``x``."""
    torch.manual_seed(1)
    norm = nn.LayerNorm(E, eps=EPS, bias=bias)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(E) * 0.5 + 0.3)
        if bias:
            norm.bias.copy_(torch.randn(E) * 0.2 - 0.1)
    x = torch.randn(4, E, dtype=torch.float64) * 2 + 0.5
    gain, shift, scale = frozen(norm, x)
    assert gain.dtype == scale.dtype == torch.float64
    assert (shift is None) == (not bias) and (shift is None or shift.dtype == torch.float64)
    rebuilt = (x - x.mean(-1, keepdim=True)) * scale * gain + (0.0 if shift is None else shift)
    torch.testing.assert_close(rebuilt, norm.double()(x), rtol=1e-12, atol=1e-12)


def test_no_norm_is_the_stream_itself_and_another_module_gets_a_sentence():
    x = torch.randn(2, E)
    assert frozen(None, x) == (1.0, None, 1.0)
    with pytest.raises(TypeError, match=r"^HeadLens cannot freeze a Linear\.$"):
        frozen(nn.Linear(E, E), x)
