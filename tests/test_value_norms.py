"""What a head moves (Kobayashi et al. 2020): each weight times the length of what its key sends through
the head, against the same product computed from transformers' own modules, on all-MiniLM-L6-v2
(a BERT encoder) and on SmolLM2 (Llama, key/value heads shared by groups of query heads)."""
import numpy as np
import pytest
import torch
import transformers as tf

from models.files import resolve_model_dir

TEXT = "Which do you like better, coffee or tea?"


def reference(hf_layers, hidden_states, attentions, values, out_weight, heads, kv_heads) -> np.ndarray:
    """``(layers, heads, n, n)`` from a transformers model's modules: α_ij ||W_O^h v_j^h||."""
    out = []
    with torch.no_grad():
        for layer, block in enumerate(hf_layers):
            v = values(block, hidden_states[layer][0])                         # (n, kv_heads * Dh)
            n, dh = v.shape[0], v.shape[1] // kv_heads
            v = v.view(n, kv_heads, dh).repeat_interleave(heads // kv_heads, dim=1)   # (n, heads, Dh)
            w = out_weight(block).view(-1, heads, dh)                          # (E, heads, Dh)
            moved = torch.einsum("nhd,ehd->hne", v, w).norm(dim=-1)            # (heads, n)
            out.append((attentions[layer][0] * moved[:, None, :]).numpy())
    return np.stack(out)


def test_minilm_value_norms_equal_transformers_bert_modules(scratch_model):
    hf = tf.AutoModel.from_pretrained(resolve_model_dir(None)[0], attn_implementation="eager").eval()
    enc = scratch_model.tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        out = hf(**enc, output_hidden_states=True, output_attentions=True)
    want = reference(hf.encoder.layer, out.hidden_states, out.attentions,
                     lambda block, x: block.attention.self.value(x), lambda block: block.attention.output.dense.weight,
                     12, 12)
    ours = scratch_model.value_norms(TEXT)
    np.testing.assert_allclose(ours, want, atol=1e-4)
    raw = scratch_model.attend(TEXT).weights
    assert ours.shape == raw.shape and not np.allclose(ours / ours.sum(-1, keepdims=True), raw, atol=0.05)


def test_smollm2_value_norms_equal_transformers_llama_modules(smollm2):
    folder = resolve_model_dir("HuggingFaceTB/SmolLM2-135M-Instruct")[0]
    hf = tf.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = smollm2.tokenizer(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = hf.model(ids, output_hidden_states=True, output_attentions=True)
    want = reference(hf.model.layers, out.hidden_states, out.attentions,
                     lambda block, x: block.self_attn.v_proj(block.input_layernorm(x)),
                     lambda block: block.self_attn.o_proj.weight, 9, 3)
    ours = smollm2.value_norms(TEXT)
    np.testing.assert_allclose(ours, want, atol=1e-4)
    assert not np.triu(ours, 1).any()
    # the sink receives most raw attention but sends less than other tokens: its share falls once weighted
    # by what it moves (0.65 raw, 0.39 weighted, on this sentence)
    raw = smollm2.attend(TEXT).weights[..., 1:, :]
    moved = ours[..., 1:, :]
    assert raw[..., 0].sum() / raw.sum() > 0.5 > moved[..., 0].sum() / moved.sum()


def test_a_pruned_heads_norms_are_zero(scratch_model):
    small = scratch_model.pruned([(0, 3), (2, 7)])
    norms = small.value_norms(TEXT)
    assert not norms[0, 3].any() and not norms[2, 7].any()
    full = scratch_model.value_norms(TEXT)
    np.testing.assert_allclose(norms[0, 4], full[0, 4], atol=1e-5)  # layer 0 sees the same input


def test_the_transformers_engine_gives_its_twins_value_norms(hf_model, scratch_model, tiny):
    from models import HeadLensError, load_model

    np.testing.assert_array_equal(hf_model.value_norms(TEXT), scratch_model.value_norms(TEXT))
    with pytest.raises(HeadLensError, match="Value norms read .* the from-scratch engine, which does not implement"):
        load_model(tiny("bloom")).value_norms(TEXT)
