"""Every decoder family the from-scratch engine declares (GPT-2, GPT-NeoX, Qwen3, Phi-3, OLMo-2, Gemma 2) against
transformers' eager run of the same tiny random model built here, in float64: each layer's attention, the logits,
saving back to a folder transformers opens, and the analyses (attribution, head patching, circuits, a head's score
split over its writers) against transformers' own run, with hooks on its modules where the analysis changes the
run. Prompts are longer than every sliding window."""
import copy
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers as tf

from analysis.effects import logit_attribution, parts_total, patch_heads, patch_residual
from analysis.pruning.importance import head_importance
from analysis.tasks.effects import run_task
from analysis.tasks.build import Task, TaskPair
from analysis.circuits import graph as C
from models import HeadLensError, load_model
from analysis.qk_attribution import split as Q
from analysis.effects.metrics import TokenLogits
from models.stacks import for_model_type
from tests.conftest import _bpe_vocab

# How near each family comes to transformers' own float64 run in these tests (the largest difference of a logit, a
# recovered share or an attribution): GPT-2 computes in float64 throughout (its LayerNorm, learned positions and
# Conv1D) and agrees to 2e-14; every other family's RMSNorm, or GPT-NeoX's rotary angles, runs in float32 inside
# transformers' float64 model, which agrees to 2e-5 at the most (GPT-NeoX's patched residual stream). Each
# tolerance is 50 times that: GPT-2 still shows an error of one part in 10^12, the others of one in 10^4.
REACHED = {"gpt2": 2e-14, "gpt_neox": 2e-5, "qwen3": 2e-6, "phi3": 2e-6, "olmo2": 4e-6, "gemma2": 2e-6}
TOL = {name: 50 * reached for name, reached in REACHED.items()}
# Attention weights are held to their own: each family's weights agree to 2e-7 or better (the float32 norms and
# angles above barely move a softmax), so 1e-5 leaves room while a misplaced norm or rotation, moving them by 1e-3
# or more, fails; GPT-2 to its float64 figure.
ATTENTION_TOL = {name: 50 * REACHED["gpt2"] if name == "gpt2" else 1e-5 for name in REACHED}
# transformers' loss takes the logits to float32 whatever the model's dtype: its loss agrees to about 1e-6
LOSS_TOL = 2e-5
TEXT = "The cat sat on the mat because it was warm and the dog ran."
CLEAN = "The cat sat on the mat because it was warm."
CORRUPTED = "The cat sat on the mat because it was close."  # one token apart, as CLEAN
SIZES = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, initializer_range=0.3, bos_token_id=0, eos_token_id=2, pad_token_id=1)
LLAMA_LIKE = dict(SIZES, num_key_value_heads=2, head_dim=8)


def _o_proj(hf, i):
    return hf.model.layers[i].self_attn.o_proj


LAYERS = {"gpt2": lambda hf: hf.transformer.h, "gpt_neox": lambda hf: hf.gpt_neox.layers}  # else hf.model.layers


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
    vocab, merges = _bpe_vocab(600)  # enough whole words for the head detector
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
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=ATTENTION_TOL[name], rtol=0,
                                   err_msg=f"{name} layer {layer}")
    np.testing.assert_allclose(ours.logits.numpy(), theirs.logits.numpy(), atol=TOL[name])
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


@dataclass
class PairRun:
    """A family's clean and corrupted prompts run through transformers (hooks keeping each head's z), with the two
    tokens the analyses compare, and the model on the from-scratch engine in float64."""

    ours: object
    o_proj: object
    ids: tuple
    clean: torch.Tensor
    corrupted: torch.Tensor
    clean_z: list
    answer: int
    distractor: int

    def ld(self, logits) -> float:
        return float(logits[self.answer] - logits[self.distractor])


def pair_run(family) -> PairRun:
    name, folder, hf, tok = family
    o_proj = FAMILIES[name][3]
    ours = load_model(folder, backend="scratch")
    ours.stack.double()
    ids = tuple(tok(t, return_tensors="pt")["input_ids"] for t in (CLEAN, CORRUPTED))
    clean, clean_z = run_hf(hf, o_proj, ids[0])
    corrupted, _ = run_hf(hf, o_proj, ids[1])
    return PairRun(ours, o_proj, ids, clean, corrupted, clean_z, *clean.topk(2).indices.tolist())



def test_attribution_and_head_patching_equal_hooks_on_transformers(family):
    name, folder, hf, tok = family
    r = pair_run(family)
    ours, o_proj, corrupted_ids, clean, corrupted, clean_z = r.ours, r.o_proj, r.ids[1], r.clean, r.corrupted, r.clean_z
    answer, distractor, ld = r.answer, r.distractor, r.ld

    frame = logit_attribution(ours, CLEAN, answer, distractor)
    assert frame.attrs["logit_diff"] == pytest.approx(ld(clean), abs=TOL[name])
    assert parts_total(frame) == pytest.approx(ld(clean), abs=TOL[name])  # heads, MLPs, embeddings and biases add up
    # each head's part: its output at the last position through the final norm frozen there, along the two tokens'
    # unembedding rows, read from transformers' run with hooks
    senders, final = hf_senders(name, hf, r.ids[0])
    unembedding = hf.get_output_embeddings().weight.detach()
    direction = unembedding[answer] - unembedding[distractor]
    frozen = frozen_final(name, hf, final[0, -1])
    H = hf.config.num_attention_heads
    want = np.array([[float(frozen(senders[1 + layer * (H + 1) + head][0, -1]) @ direction) for head in range(H)]
                     for layer in range(2)])
    np.testing.assert_allclose(frame["attribution"].to_numpy().reshape(2, H), want, atol=TOL[name], rtol=0)
    assert np.abs(want).max() > 0.01
    heads = patch_heads(ours, CLEAN, CORRUPTED, answer, distractor)
    assert heads.attrs["ld_corrupted"] == pytest.approx(ld(corrupted), abs=TOL[name])
    pair = TaskPair(CLEAN, CORRUPTED, tuple(r.ids[0][0].tolist()), tuple(corrupted_ids[0].tolist()), answer,
                    distractor, (("END", corrupted_ids.shape[1] - 1),))
    task = run_task(ours, Task("warm or cold", "Warm or cold", (pair,)), "logit_diff", "exact", residual=False)
    for layer in range(2):
        for head in range(4):
            patched, _ = run_hf(hf, o_proj, corrupted_ids, (layer, head, clean_z[layer]))
            want = (ld(patched) - ld(corrupted)) / (ld(clean) - ld(corrupted))
            got = heads.query("layer == @layer and head == @head")["recovered"].item()
            assert got == pytest.approx(want, abs=TOL[name]), (name, layer, head)
            # a task's effects: the same patch, in the metric's own units
            assert task.heads[0, layer, head] == pytest.approx(ld(patched) - ld(corrupted), abs=TOL[name])
    assert heads["recovered"].abs().max() > 0.01


AFTER = ("gemma2", "olmo2")  # a norm after the attention and after the MLP, which the writes pass
GEMMA = ("gemma2",)           # norms that scale by 1 + weight
FINAL_NORM = {"gpt2": lambda hf: hf.transformer.ln_f, "gpt_neox": lambda hf: hf.gpt_neox.final_layer_norm}


def final_norm(name: str, hf):
    return FINAL_NORM.get(name, lambda hf: hf.model.norm)(hf)


def hf_senders(name: str, hf, ids: torch.Tensor, embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' run of ``ids`` (or of the token embeddings ``embeds``) with hooks: every sender's output
    ``(senders, B, n, E)`` as the graph orders them (the input, then per layer each head and the MLP) and the stream
    its final norm reads ``(B, n, E)``. The input is the first layer's input (positions added, as GPT-2 adds them); a
    head's output is its slice of the output projection's input times its columns (GPT-2's Conv1D rows), through the
    norm after the attention (its scale frozen at the whole output) where the family has one; an MLP's its output,
    through the norm after it."""
    cfg = hf.config
    H = cfg.num_attention_heads
    o_proj = FAMILIES[name][3]
    layers = LAYERS.get(name, lambda hf: hf.model.layers)(hf)
    got = {"z": [], "o": [], "mlp": [], "in": None}
    handles = [layers[0].register_forward_pre_hook(
        lambda m, a, kw: got.__setitem__("in", a[0] if a else kw["hidden_states"]), with_kwargs=True),
        final_norm(name, hf).register_forward_pre_hook(lambda m, a: got.__setitem__("final", a[0]))]
    for i, layer in enumerate(layers):
        handles += [o_proj(hf, i).register_forward_pre_hook(lambda m, a: got["z"].append(a[0])),
                    o_proj(hf, i).register_forward_hook(lambda m, a, out: got["o"].append(out)),
                    (layer.post_feedforward_layernorm if name in AFTER else layer.mlp).register_forward_hook(
                        lambda m, a, out: got["mlp"].append(out[0] if isinstance(out, tuple) else out))]
    try:
        with torch.no_grad():
            hf(**({"input_ids": ids} if embeds is None else {"inputs_embeds": embeds}))
    finally:
        for h in handles:
            h.remove()
    senders = [got["in"]]
    for i, layer in enumerate(layers):
        z, o, w = got["z"][i], got["o"][i], o_proj(hf, i).weight
        Dh = z.shape[-1] // H
        scale = 1.0
        if name in AFTER:
            norm = layer.post_attention_layernorm
            gain = (1 + norm.weight) if name in GEMMA else norm.weight
            eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
            scale = gain * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
        for h in range(H):
            part = slice(h * Dh, (h + 1) * Dh)
            cols = w[part].T if name == "gpt2" else w[:, part]                # Conv1D keeps (in, out)
            senders.append(F.linear(z[..., part], cols) * scale)
        senders.append(got["mlp"][i])
    return torch.stack(senders).detach(), got["final"]


@torch.no_grad()
def frozen_final(name: str, hf, x: torch.Tensor):
    """The final norm of the stream ``x`` ``(..., E)`` with its scale frozen there: a linear map of a part of it."""
    norm = final_norm(name, hf)
    if isinstance(norm, torch.nn.LayerNorm):
        scale = norm.weight / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
        return lambda part: (part - part.mean(-1, keepdim=True)) * scale
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    gain = (1 + norm.weight) if name in GEMMA else norm.weight
    scale = gain * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return lambda part: part * scale


def final_gradient(name: str, hf, embeds: torch.Tensor, answer: int, distractor: int) -> torch.Tensor:
    """``(B, n, E)``: the gradient of the logit difference of ``answer`` and ``distractor`` at the last position,
    before a final soft cap (the normed stream along the two unembedding rows), by the stream transformers' final
    norm reads, in its run of the token embeddings ``embeds``."""
    kept = {}

    def pre(m, a):
        kept["x"] = a[0].detach().requires_grad_()
        return (kept["x"],)

    norm = final_norm(name, hf)
    handles = [norm.register_forward_pre_hook(pre),
               norm.register_forward_hook(lambda m, a, out: kept.__setitem__("normed", out))]
    u = hf.get_output_embeddings().weight
    try:
        with torch.enable_grad():
            hf(inputs_embeds=embeds)
            value = (kept["normed"][:, -1] @ (u[answer] - u[distractor]).detach()).sum()
            (grad,) = torch.autograd.grad(value, kept["x"])
    finally:
        for h in handles:
            h.remove()
    return grad


def uncapped_difference(hf, ids, answer: int, distractor: int) -> torch.Tensor:
    """``(B,)``: transformers' logit of ``answer`` less ``distractor``'s at the last position, before a final soft cap."""
    with torch.inference_mode():
        logits = hf(ids).logits[:, -1]
    cap = getattr(hf.config, "final_logit_softcapping", None)
    logits = logits if cap is None else torch.atanh(logits / cap) * cap
    return logits[:, answer] - logits[:, distractor]


def circuit_setup(name: str, folder, vocab: int, seed: int):
    """The family's stack in float64 (read, as the app opens it), its graph, two batches of 12 random tokens one
    token apart (at 3), and the logit difference of tokens 7 and 9."""
    stack = for_model_type(name).from_pretrained(folder).double().requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(5, vocab, (2, 12), generator=gen)
    bad = clean.clone()
    bad[:, 3] = torch.randint(5, vocab, (2,), generator=gen)
    measure = TokenLogits(torch.tensor([[7, 9]] * 2), torch.tensor([[1.0, -1.0]] * 2))
    return stack, C.graph_of(stack), clean, bad, measure, torch.arange(2)


def test_circuits_and_the_qk_split_hold_on_each_family(family):
    """A circuit of every edge runs as transformers' clean prompts, of none as its corrupted ones (an MLP beside its
    attention reading what the heads read); edge attribution scores edges only; a head's score split over its
    writers sums to the score whose softmax (capped where the model caps) is transformers' attention."""
    name, folder, hf, tok = family
    stack, graph, clean, bad, measure, rows = circuit_setup(name, folder, hf.config.vocab_size, seed=0)
    with torch.inference_mode():
        corrupted = C.run_ids(stack, graph, bad, measure, rows)
        every = C.circuit_values(stack, graph, clean, corrupted, C.all_edges(graph), measure, rows)
        none = C.circuit_values(stack, graph, clean, corrupted, torch.zeros(graph.mask().shape), measure, rows)
    want_clean, want_bad = uncapped_difference(hf, clean, 7, 9), uncapped_difference(hf, bad, 7, 9)
    np.testing.assert_allclose(every.numpy(), want_clean.numpy(), atol=TOL[name])
    np.testing.assert_allclose(none.numpy(), want_bad.numpy(), atol=TOL[name])
    assert (want_clean - want_bad).abs().max() > 1e-3
    # EAP-IG in 2 steps: each sender's edge into the logits against transformers' senders (clean less corrupted)
    # times the gradient of the uncapped logit difference by the stream its final norm reads, averaged over the two
    # inputs between the corrupted and the clean embeddings (through Gemma 2's capped attention)
    scores = C.edge_attribution(stack, graph, clean, bad, measure, rows, steps=2)[0]
    embed = hf.get_input_embeddings()
    e_clean, e_bad = embed(clean).detach(), embed(bad).detach()
    (out_clean, _), (out_bad, _) = hf_senders(name, hf, clean), hf_senders(name, hf, bad)
    grad = sum(final_gradient(name, hf, e_bad + j / 2 * (e_clean - e_bad), 7, 9) for j in (1, 2)) / 2
    want = torch.einsum("sbne,bne->s", out_clean - out_bad, grad)
    logits = graph.receivers.index(("logits", stack.n_layers, -1))
    np.testing.assert_allclose(scores[:, logits].numpy(), want.numpy(), atol=TOL[name] * float(want.abs().max()))
    assert want.abs().max() > 1e-3
    if name == "gpt_neox":  # the MLP reads the stream the heads read, not their writes
        mlp = graph.receivers.index(("mlp", 1, -1))
        assert graph.reach[mlp] == graph.senders.index(("head", 1, 0))

    run = Q.writers_run(stack, graph, clean)
    with torch.inference_mode():
        attentions = hf(clean, output_attentions=True).attentions
    for layer, head in ((1, 3), (1, 0), (0, 2)):
        sides = Q.head_sides(stack, graph, run, layer, head)
        query = 11
        total = sides.split(query).sum((0, 1))                                            # (B, keys)
        capped = total if sides.softcap is None else torch.tanh(total / sides.softcap) * sides.softcap
        weights = torch.softmax(capped.masked_fill(~sides.visible(query), -torch.inf), -1)
        torch.testing.assert_close(weights, attentions[layer][:, head, query, :query + 1], atol=1e-6, rtol=0)


def layer_input_patched(hf, name, ids, layer, position, value):
    """transformers' last logits of ``ids`` with layer ``layer``'s input at ``position`` replaced by ``value``."""
    def put(m, args, kw):
        h = (args[0] if args else kw["hidden_states"]).clone()
        h[0, position] = value
        return ((h, *args[1:]), kw) if args else (args, {**kw, "hidden_states": h})

    kept = []
    layers = LAYERS.get(name, lambda hf: hf.model.layers)(hf)
    handles = [layers[layer].register_forward_pre_hook(put, with_kwargs=True),
               layers[layer].register_forward_pre_hook(lambda m, a, kw: kept.append(a[0] if a else kw["hidden_states"]),
                                                        with_kwargs=True)]
    try:
        with torch.inference_mode():
            logits = hf(ids).logits[0, -1]
    finally:
        for h in handles:
            h.remove()
    cap = getattr(hf.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.atanh(logits / cap) * cap


def test_residual_and_attribution_patching_equal_hooks_on_transformers(family):
    """Patching the stream entering a layer at one position, against a hook on that layer's input; attribution
    patching, against the corrupted run's gradient by each head's z (autograd through transformers' modules) times
    the clean z less the corrupted one."""
    name, folder, hf, tok = family
    r = pair_run(family)
    ours, o_proj, (clean_ids, corrupted_ids), clean, corrupted, clean_z = r.ours, r.o_proj, r.ids, r.clean, \
        r.corrupted, r.clean_z
    answer, distractor = r.answer, r.distractor
    span = float(clean[answer] - clean[distractor] - corrupted[answer] + corrupted[distractor])
    frame = patch_residual(ours, CLEAN, CORRUPTED, answer, distractor)
    inputs = []
    layers = LAYERS.get(name, lambda hf: hf.model.layers)(hf)
    handle = layers[1].register_forward_pre_hook(lambda m, a, kw: inputs.append(a[0] if a else kw["hidden_states"]),
                                                 with_kwargs=True)
    with torch.inference_mode():
        hf(clean_ids)
    handle.remove()
    n = clean_ids.shape[1]
    for position in (n - 3, n - 1):
        logits = layer_input_patched(hf, name, corrupted_ids, 1, position, inputs[0][0, position])
        want = (float(logits[answer] - logits[distractor]) - float(corrupted[answer] - corrupted[distractor])) / span
        got = frame.query("layer == 1 and position == @position")["recovered"].item()
        assert got == pytest.approx(want, abs=TOL[name]), (name, position)

    H = hf.config.num_attention_heads
    zs, handles = [], []
    for i in range(hf.config.num_hidden_layers):
        handles.append(o_proj(hf, i).register_forward_pre_hook(lambda m, args: zs.append(args[0])))
    try:
        logits = hf(corrupted_ids).logits[0, -1]
        cap = getattr(hf.config, "final_logit_softcapping", None)
        logits = logits if cap is None else torch.atanh(logits / cap) * cap
        grads = torch.autograd.grad(logits[answer] - logits[distractor], zs)  # each z's, through the later layers
    finally:
        for h in handles:
            h.remove()
    estimated = patch_heads(ours, CLEAN, CORRUPTED, answer, distractor, method="attribution")
    for layer in range(2):
        moved = ((clean_z[layer] - zs[layer].detach()) * grads[layer])[0].view(n, H, -1).sum((0, 2)) / span
        for head in range(H):
            got = estimated.query("layer == @layer and head == @head")["recovered"].item()
            assert got == pytest.approx(float(moved[head]), abs=TOL[name]), (name, layer, head)
    assert estimated["recovered"].abs().max() > 0.01


def test_a_pruned_copy_is_transformers_with_those_heads_output_columns_at_zero(family, tmp_path):
    """Pruning two heads (one a layer) takes their q rows and output columns away: the copy's logits are
    transformers' with those heads' columns of the output projection zeroed; OLMo-2's norm over the whole query
    projection ties the heads of a layer together, which pruning says."""
    name, folder, hf, tok = family
    o_proj = FAMILIES[name][3]
    ours = load_model(folder, backend="scratch")
    if name == "olmo2":
        with pytest.raises(HeadLensError, match="whole query projection"):
            ours.pruned([(0, 1)])
        return
    pruned = ours.pruned([(0, 1), (1, 2)])
    assert pruned.stack.kept == [[0, 2, 3], [0, 1, 3]]
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    import copy
    cut = copy.deepcopy(hf)
    Dh = cut.config.hidden_size // cut.config.num_attention_heads if name in ("gpt2", "gpt_neox") else 8
    with torch.no_grad():
        for layer, head in ((0, 1), (1, 2)):
            w = o_proj(cut, layer).weight
            if name == "gpt2":  # Conv1D: (in, out)
                w[head * Dh:(head + 1) * Dh] = 0
            else:
                w[:, head * Dh:(head + 1) * Dh] = 0
    with torch.inference_mode():
        want = cut(ids).logits[0].float().numpy()
        got = pruned.stack(ids).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    pruned.stack.save_pretrained(tmp_path)  # a pruned copy saves and opens again with its heads recorded
    again = for_model_type(name).from_pretrained(tmp_path)
    assert again.kept == pruned.stack.kept


# --- the encoders: RoBERTa and DistilBERT on the BERT encoder ---------------------------------------------------

ENCODERS = {  # model_type: (config, model, sizes, the output projection of layer i's attention)
    "roberta": (tf.RobertaConfig, tf.RobertaModel,
                dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                     max_position_embeddings=66, pad_token_id=1, bos_token_id=0, eos_token_id=2),
                lambda hf, i: hf.encoder.layer[i].attention.output.dense),
    "distilbert": (tf.DistilBertConfig, tf.DistilBertModel,
                   dict(dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=64, pad_token_id=0),
                   lambda hf, i: hf.transformer.layer[i].attention.out_lin),
}
SENTENCES = ["Which do you like better, coffee or tea?", "The cat sat on the mat."]


@pytest.fixture(scope="module", params=list(ENCODERS))
def encoder(request, tmp_path_factory):
    """(model_type, folder, transformers' model in float64, tokenizer) of a tiny random encoder."""
    name = request.param
    config_class, model_class, sizes, _ = ENCODERS[name]
    folder = tmp_path_factory.mktemp(f"encoder-{name}")
    vocab, merges = _bpe_vocab()
    torch.manual_seed(0)
    hf = model_class(config_class(vocab_size=len(vocab), **sizes)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(folder)
    tf.RobertaTokenizerFast(vocab=vocab, merges=merges).save_pretrained(folder)
    tok = tf.AutoTokenizer.from_pretrained(folder)
    return name, folder, model_class.from_pretrained(folder, attn_implementation="eager").eval().double(), tok


def test_an_encoder_equals_transformers_padded_and_saved_back(encoder, tmp_path):
    name, folder, hf, tok = encoder
    stack = for_model_type(name).from_pretrained(folder).double()
    batch = tok(SENTENCES, return_tensors="pt", padding=True)
    assert not batch["attention_mask"].all()  # a padded batch: positions must not move with the padding
    inputs = {k: v for k, v in batch.items() if k in stack.input_names}
    with torch.inference_mode():
        theirs = hf(**inputs, output_attentions=True)
        ours = stack(**inputs)
    real = batch["attention_mask"].bool()
    np.testing.assert_allclose(ours.last_hidden_state[real].numpy(), theirs.last_hidden_state[real].numpy(), atol=1e-5)
    for a, b in zip(ours.attentions, theirs.attentions):
        np.testing.assert_allclose(a[0].numpy(), b[0].numpy(), atol=1e-5, rtol=0)  # the longer sentence: no padding
    stack.save_pretrained(tmp_path)
    again = type(hf).from_pretrained(tmp_path, attn_implementation="eager").eval().double()
    with torch.inference_mode():
        np.testing.assert_allclose(again(**inputs).last_hidden_state.numpy(), theirs.last_hidden_state.numpy(),
                                   atol=1e-6)


def test_an_encoders_heads_switched_off_equal_transformers_with_their_columns_at_zero(encoder):
    """What the encoder pages do (ablation, importance, pruning): heads switched off on the from-scratch engine,
    against transformers' model with those heads' columns of the output projection at zero."""
    import copy

    name, folder, hf, tok = encoder
    model = load_model(folder)                       # the transformers engine, switching heads off on its twin
    mask = np.ones((2, 4))
    mask[0, 1] = mask[1, 3] = 0
    got = model.embed(SENTENCES, head_mask=mask)
    cut = copy.deepcopy(hf).float()
    with torch.no_grad():
        for layer, head in ((0, 1), (1, 3)):
            ENCODERS[name][3](cut, layer).weight[:, head * 8:(head + 1) * 8] = 0
    batch = tok(SENTENCES, return_tensors="pt", padding=True)
    with torch.inference_mode():
        hidden = cut(**{k: v for k, v in batch.items() if k != "token_type_ids"}).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).float()
    mean = (hidden * m).sum(1) / m.sum(1)  # mean pooling over the real tokens, L2-normalised
    want = (mean / mean.norm(dim=-1, keepdim=True)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    pruned = model.scratch("Pruning happens").pruned([(0, 1), (1, 3)])
    np.testing.assert_allclose(pruned.embed(SENTENCES), want, atol=1e-4)


def test_a_heads_card_on_each_family_reads_transformers_numbers(family):
    """A head's card (roles, examples, what it writes, copying, a pair attributed and patched, importance) on each
    decoder family: its pair's recovered share is transformers' with that head's z patched by a hook, its strongest
    example's weight is transformers' attention there, where it writes most is where its output's norm in
    transformers' run is largest, and its importance is the gradient of transformers' loss by its gate."""
    from analysis.cards.build import card_parts, head_card
    from analysis.defaults import DECODER_SAMPLE, Pair
    from models.corpus import corpus_sample

    name, folder, hf, tok = family
    r = pair_run(family)
    model, o_proj, corrupted_ids = r.ours, r.o_proj, r.ids[1]
    clean, corrupted, clean_z, answer, distractor = r.clean, r.corrupted, r.clean_z, r.answer, r.distractor
    pair = Pair("warm or cold", "test", CLEAN, CORRUPTED, answer, distractor)
    parts = card_parts(model, sentences=[TEXT, CLEAN], pairs={pair.name: pair}, task=None)
    card = head_card(model, 1, 2, parts=parts)
    patched, _ = run_hf(hf, o_proj, corrupted_ids, (1, 2, clean_z[1]))
    ld = [float(x[answer] - x[distractor]) for x in (clean, corrupted, patched)]
    assert card.pairs.set_index("pair").loc[pair.name, "recovered"] == pytest.approx(
        (ld[2] - ld[1]) / (ld[0] - ld[1]), abs=TOL[name])
    top = card.top.iloc[0]
    ids = tok(top.text, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        weight = hf(ids, output_attentions=True).attentions[1][0, 2, top.query, top.key]
    assert top.weight == pytest.approx(float(weight), abs=1e-6)  # an Attention's weights are float32
    # where it writes most: the norm of its output at each query of that sentence, by transformers' hooks
    write = card.writes.iloc[0]
    senders, _ = hf_senders(name, hf, tok(write.text, return_tensors="pt")["input_ids"])
    norms = senders[1 + 1 * (hf.config.num_attention_heads + 1) + 2][0].norm(dim=-1)      # L1 H2 at every query
    assert write.query == int(norms.argmax()) and write.norm == pytest.approx(float(norms.max()), rel=1e-4)
    # its importance: |dL/d(gate)| of transformers' loss over Pruning's sample with each head's z gated
    H = hf.config.num_attention_heads
    gate = torch.ones(hf.config.num_hidden_layers, H, dtype=torch.float64, requires_grad=True)

    def gated(i):
        return lambda m, args: (args[0] * gate[i].repeat_interleave(args[0].shape[-1] // H),)

    handles = [o_proj(hf, i).register_forward_pre_hook(gated(i)) for i in range(hf.config.num_hidden_layers)]
    try:
        (grad,) = torch.autograd.grad(mean_loss(hf, tok, corpus_sample(DECODER_SAMPLE)), gate)
    finally:
        for h in handles:
            h.remove()
    assert card.importance["importance"] == pytest.approx(float(grad[1, 2].abs()), rel=1e-4)  # a float32 loss


def test_head_patching_equals_transformerlens(family):
    """TransformerLens 4.3 opens each of these families: its sweep of every head's output at every position
    (``get_act_patch_attn_head_out_all_pos`` on a ``TransformerBridge`` of the same float64 weights) against
    HeadLens's, the metric the logit difference before a final soft cap."""
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge

    name, folder, hf, tok = family
    r = pair_run(family)
    # the bridge wraps the model it is given (adapters and hooks stay on it): a copy, so that the tests after this one
    # compare against transformers' own model
    bridge = TransformerBridge.boot_transformers(str(folder), hf_model=copy.deepcopy(hf),
                                                 tokenizer=tf.AutoTokenizer.from_pretrained(folder))
    cap = getattr(hf.config, "final_logit_softcapping", None)

    def ld(logits):
        last = logits[0, -1] if cap is None else torch.atanh(logits[0, -1] / cap) * cap
        return last[r.answer] - last[r.distractor]

    with torch.inference_mode():
        clean, cache = bridge.run_with_cache(r.ids[0])
        lo, hi = float(ld(bridge(r.ids[1]))), float(ld(clean))
        theirs = patching.get_act_patch_attn_head_out_all_pos(bridge, r.ids[1], cache, lambda l: (ld(l) - lo) / (hi - lo))
    assert hi == pytest.approx(r.ld(r.clean), abs=1e-6)
    ours = patch_heads(r.ours, CLEAN, CORRUPTED, r.answer, r.distractor)["recovered"].to_numpy().reshape(2, 4)
    np.testing.assert_allclose(ours, torch.as_tensor(theirs).double().numpy(), atol=1e-5)  # its grid is float32
    assert np.abs(ours).max() > 0.01


def test_exact_edge_patching_into_the_logits_equals_a_hook_on_transformers_final_norm(family):
    """An edge into the logits patched exactly (a head's and an MLP's): the circuit's run with that edge carrying
    the corrupted run's output, against transformers' clean run with the stream its final norm reads changed by
    the same amount by a hook."""
    name, folder, hf, tok = family
    stack, graph, clean, bad, measure, rows = circuit_setup(name, folder, hf.config.vocab_size, seed=1)
    logits = graph.receivers.index(("logits", stack.n_layers, -1))
    norm = final_norm(name, hf)
    changed = []
    (out_clean, _), (out_bad, _) = hf_senders(name, hf, clean), hf_senders(name, hf, bad)
    for sender in (("head", 1, 2), ("mlp", 0, -1), ("head", 0, 1)):
        s = graph.senders.index(sender)
        with torch.inference_mode():
            good, corrupted = (C.run_ids(stack, graph, ids, measure, rows) for ids in (clean, bad))
            ours = C.circuit_values(stack, graph, clean, corrupted, C.without(graph, [(s, logits)]), measure, rows)
        delta = out_clean[s] - out_bad[s]  # the sender's clean output less its corrupted one, by transformers' hooks
        handle = norm.register_forward_pre_hook(lambda m, a: (a[0] - delta,))
        try:
            theirs = uncapped_difference(hf, clean, 7, 9)
        finally:
            handle.remove()
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=TOL[name], err_msg=f"{name} {sender}")
        changed.append(float((ours - good.value).abs().max()))
    assert max(changed) > 1e-4  # the patch changes the metric: not two clean runs compared


def test_gradient_importance_is_the_gradient_of_transformers_loss_by_each_heads_gate(family):
    """Pruning's gradient importance, |dL/d(gate)| of the mean next-token loss, against transformers' loss with
    each head's slice of z scaled by a gate: the loss's gradient by the logits is worked out, not recorded, and a
    final soft cap (Gemma 2's) enters it."""
    name, folder, hf, tok = family
    ours = load_model(folder, backend="scratch")
    ours.stack.double()
    imp = head_importance(ours, [TEXT], method="gradient", measure="loss")
    o_proj, H = FAMILIES[name][3], hf.config.num_attention_heads
    gate = torch.ones(hf.config.num_hidden_layers, H, dtype=torch.float64, requires_grad=True)

    def gated(i):
        def pre(m, args):
            z = args[0]
            return (z * gate[i].repeat_interleave(z.shape[-1] // H),)
        return pre

    handles = [o_proj(hf, i).register_forward_pre_hook(gated(i)) for i in range(hf.config.num_hidden_layers)]
    try:
        ids = tok(TEXT, return_tensors="pt")["input_ids"]
        (grad,) = torch.autograd.grad(hf(ids, labels=ids).loss, gate)
    finally:
        for h in handles:
            h.remove()
    np.testing.assert_allclose(imp["importance"].to_numpy().reshape(grad.shape), grad.abs().numpy(), rtol=1e-4,
                               atol=1e-6, err_msg=name)
    assert grad.abs().min() > 1e-4  # every head's gate moves the loss


def mean_loss(hf, tok, texts: list[str]) -> torch.Tensor:
    """transformers' next-token loss over ``texts``, every predicted token counted once: each text run alone (a
    padded batch gives a query of the padding nothing to see in a sliding window, and NaN)."""
    total, count = 0.0, 0
    for text in texts:
        ids = tok(text, return_tensors="pt")["input_ids"]
        total = total + hf(ids, labels=ids).loss * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    return total / count


def hf_loss(hf, tok, texts: list[str], off: list[tuple[int, int]], o_proj) -> float:
    """transformers' mean next-token loss over ``texts`` (``mean_loss``), the heads ``off`` zeroed in their output
    projection's input."""
    H = hf.config.num_attention_heads
    handles = []
    for layer in {layer for layer, _ in off}:
        heads = [h for l, h in off if l == layer]

        def pre(m, args, heads=heads):
            z = args[0].clone()
            Dh = z.shape[-1] // H
            for h in heads:
                z[..., h * Dh:(h + 1) * Dh] = 0
            return (z,)
        handles.append(o_proj(hf, layer).register_forward_pre_hook(pre))
    try:
        with torch.inference_mode():
            return float(mean_loss(hf, tok, texts))
    finally:
        for h in handles:
            h.remove()


def test_the_loss_importance_and_pruning_curves_equal_transformers_loss(family, monkeypatch):
    """The next-token loss (the vocabulary read 7 tokens at a time, under Gemma 2's final soft cap) and its top-1
    predictions, each head's importance by ablation (the loss with it alone switched off, less the full loss) and a
    pruning curve's losses, against transformers' loss with those heads' slices of the output projection's input at
    zero; OLMo-2, whose query norm spans every head, says why it cannot be pruned."""
    from analysis.pruning.curves import pruning_curve
    from models import language

    name, folder, hf, tok = family
    monkeypatch.setattr(language, "VOCABULARY_SLICE", 7)
    ours = load_model(folder, backend="scratch")
    ours.stack.double()
    texts, o_proj = [TEXT, CLEAN], FAMILIES[name][3]
    full = hf_loss(hf, tok, texts, [], o_proj)
    loss, top = ours.predictions(texts)
    assert loss == pytest.approx(full, abs=LOSS_TOL)
    with torch.inference_mode():
        best = torch.cat([hf(tok(t, return_tensors="pt")["input_ids"]).logits[0, :-1].argmax(-1) for t in texts])
    assert np.array_equal(np.asarray(top), best.numpy())
    imp = head_importance(ours, texts, method="ablation", measure="loss").set_index(["layer", "head"])["importance"]
    for layer, head in ((0, 1), (1, 2), (1, 3)):
        want = hf_loss(hf, tok, texts, [(layer, head)], o_proj) - full
        assert imp[(layer, head)] == pytest.approx(want, abs=LOSS_TOL), (name, layer, head)
    if name == "olmo2":
        with pytest.raises(HeadLensError, match="cannot be cut out"):
            pruning_curve(ours, texts, order="random", measure="loss", step=0.25)
        return
    curve = pruning_curve(ours, texts, order="random", measure="loss", step=0.25)
    assert list(curve.n_pruned) == [0, 2, 4, 6, 8]
    for row in curve.itertuples():
        if row.n_pruned < 8:  # every head gone: the curve's last point, a model without attention
            assert row.loss == pytest.approx(hf_loss(hf, tok, texts, list(row.heads), o_proj), abs=LOSS_TOL)
