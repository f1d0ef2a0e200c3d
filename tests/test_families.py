"""Every decoder family the from-scratch engine declares (GPT-2, GPT-NeoX, Qwen3, Phi-3, OLMo-2, Gemma 2) against
transformers' eager run of the same tiny random model built here, in float64: each layer's attention, the logits,
saving back to a folder transformers opens, and the analyses (attribution, head patching) against hooks on
transformers' own modules. Prompts are longer than every sliding window."""
import numpy as np
import pytest
import torch
import transformers as tf

from analysis.effects import logit_attribution, parts_total, patch_heads
from models import load_model
from models.stacks import for_model_type
from tests.conftest import _bpe_vocab

TEXT = "The cat sat on the mat because it was warm and the dog ran."
CLEAN = "The cat sat on the mat because it was warm."
CORRUPTED = "The cat sat on the mat because it was cold."
SIZES = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, initializer_range=0.3, bos_token_id=0, eos_token_id=2, pad_token_id=1)
LLAMA_LIKE = dict(SIZES, num_key_value_heads=2, head_dim=8)


def _o_proj(hf, i):
    return hf.model.layers[i].self_attn.o_proj


FAMILIES = {  # model_type: (config, model, sizes, the module whose input is each head's z side by side)
    "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel,
             dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=37, initializer_range=0.3, bos_token_id=0,
                  eos_token_id=2), lambda hf, i: hf.transformer.h[i].attn.c_proj),
    "gpt_neox": (tf.GPTNeoXConfig, tf.GPTNeoXForCausalLM, dict(SIZES, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        lambda hf, i: hf.gpt_neox.layers[i].attention.dense),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(LLAMA_LIKE, attention_bias=True), _o_proj),
    "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, dict(SIZES, sliding_window=5, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), _o_proj),
    "olmo2": (tf.Olmo2Config, tf.Olmo2ForCausalLM, dict(LLAMA_LIKE), _o_proj),
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, dict(LLAMA_LIKE, sliding_window=5, query_pre_attn_scalar=6,
                                                           attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
               _o_proj),
}


def build(family: str, folder):
    """(folder, transformers' model in float64, tokenizer) of a tiny random ``family`` decoder saved in ``folder``
    with a byte-level BPE tokenizer; norms given weights of their own, so that a misplaced one shows."""
    config_class, model_class, sizes, _ = FAMILIES[family]
    vocab, merges = _bpe_vocab()
    torch.manual_seed(0)
    hf = model_class(config_class(vocab_size=len(vocab), **sizes)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 1:  # norms and biases, which start at 1 or 0
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(folder)
    tok = tf.GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                               pad_token="<pad>")
    tok.save_pretrained(folder)
    hf = model_class.from_pretrained(folder, attn_implementation="eager").eval().double()
    return folder, hf, tok


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    return (request.param, *build(request.param, tmp_path_factory.mktemp(f"family-{request.param}")))


def test_attention_and_logits_equal_transformers_eager(family):
    name, folder, hf, tok = family
    stack = for_model_type(name).from_pretrained(folder).double()
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 10  # beyond the sliding windows of 5
    with torch.inference_mode():
        theirs = hf(ids, output_attentions=True)
        ours = stack(ids)
    for layer, (a, b) in enumerate(zip(ours.attentions, theirs.attentions)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5, err_msg=f"{name} layer {layer}")
    np.testing.assert_allclose(ours.logits.numpy(), theirs.logits.numpy(), atol=1e-4)
    assert theirs.attentions[0].max() > 0.3 and theirs.logits.std() > 0.05  # a comparison that means something


def test_a_saved_folder_opens_in_transformers_with_the_same_logits(family, tmp_path):
    name, folder, hf, tok = family
    stack = for_model_type(name).from_pretrained(folder)
    stack.save_pretrained(tmp_path)
    again = tf.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval().double()
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        np.testing.assert_allclose(again(ids).logits.numpy(), hf(ids).logits.numpy(), atol=1e-5)
    reopened = for_model_type(name).from_pretrained(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(reopened.state_dict().values(), stack.state_dict().values()))


def run_hf(hf, o_proj, ids, patch=None):
    """transformers' last logits of ``ids`` with each layer's output projection's input (every head's z) kept;
    ``patch`` = (layer, head, z) puts ``z``'s slice of that head there. The logits before a final soft cap (Gemma
    2's), as the analyses measure them: a sum of parts, linear in the stream."""
    H = hf.config.num_attention_heads
    zs, handles = [], []
    for i in range(hf.config.num_hidden_layers):
        def pre(m, args, i=i):
            z = args[0].clone()
            Dh = z.shape[-1] // H
            if patch is not None and patch[0] == i:
                z[..., patch[1] * Dh:(patch[1] + 1) * Dh] = patch[2][..., patch[1] * Dh:(patch[1] + 1) * Dh]
            zs.append(z)
            return (z,)
        handles.append(o_proj(hf, i).register_forward_pre_hook(pre))
    try:
        with torch.inference_mode():
            logits = hf(ids).logits[0, -1]
        cap = getattr(hf.config, "final_logit_softcapping", None)
        return (logits if cap is None else torch.atanh(logits / cap) * cap), zs
    finally:
        for h in handles:
            h.remove()


def test_attribution_and_head_patching_equal_hooks_on_transformers(family):
    name, folder, hf, tok = family
    o_proj = FAMILIES[name][3]
    ours = load_model(folder, backend="scratch")
    ours.stack.double()
    clean_ids, corrupted_ids = (tok(t, return_tensors="pt")["input_ids"] for t in (CLEAN, CORRUPTED))
    clean, clean_z = run_hf(hf, o_proj, clean_ids)
    corrupted, _ = run_hf(hf, o_proj, corrupted_ids)
    answer, distractor = clean.topk(2).indices.tolist()

    def ld(logits):
        return float(logits[answer] - logits[distractor])

    frame = logit_attribution(ours, CLEAN, answer, distractor)
    assert frame.attrs["logit_diff"] == pytest.approx(ld(clean), abs=1e-5)
    assert parts_total(frame) == pytest.approx(ld(clean), abs=1e-5)  # heads, MLPs, embeddings and biases add up
    heads = patch_heads(ours, CLEAN, CORRUPTED, answer, distractor)
    assert heads.attrs["ld_corrupted"] == pytest.approx(ld(corrupted), abs=1e-5)
    for layer in range(2):
        for head in range(4):
            patched, _ = run_hf(hf, o_proj, corrupted_ids, (layer, head, clean_z[layer]))
            want = (ld(patched) - ld(corrupted)) / (ld(clean) - ld(corrupted))
            got = heads.query("layer == @layer and head == @head")["recovered"].item()
            assert got == pytest.approx(want, abs=1e-4), (name, layer, head)
    assert heads["recovered"].abs().max() > 0.01
