"""Circuits on tiny random Llama and Gemma 3 decoders built here: edge attribution (EAP, EAP-IG) against the
gradient formula taken with forward hooks and autograd on transformers' own modules; a circuit's run with every
edge in is the clean run and with none the corrupted run; exact edge patching through the circuit machinery
against patching built by hand with hooks; a hand-made two-layer model whose only path runs head A into head B's
query."""
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from analysis import circuits as AC
from analysis.tasks.build import Task, TaskPair
from models import HeadLensError, load_model
from analysis.circuits import graph as C
from analysis.effects.metrics import TokenLogits
from models.stacks.decoder import Decoder, DecoderConfig
from tests import test_gemma3
from tests.test_llama import build as build_llama

N = 9        # tokens a prompt
DIFFER = 3   # the position where the corrupted prompts differ
ANSWER, DISTRACTOR = 7, 9


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def family(request, tmp_path_factory):
    """(name, ours on the from-scratch engine, transformers' CausalLM)."""
    folder = tmp_path_factory.mktemp(f"circuits-{request.param}")
    if request.param == "llama":  # attention biases on: the output projection's bias is a constant write
        _, folder, hf, _ = build_llama("llama", folder)
    else:
        folder, hf, _ = test_gemma3.build(folder, 2)  # two key/value heads, each read by two query heads
    return request.param, load_model(folder, backend="scratch"), hf


def prompts(vocab: int, seed: int = 0, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(5, vocab, (batch, N), generator=gen)
    bad = clean.clone()
    bad[:, DIFFER] = torch.randint(5, vocab, (batch,), generator=gen)
    return clean, bad


def logit_measure(batch: int) -> TokenLogits:
    return TokenLogits(torch.tensor([[ANSWER, DISTRACTOR]] * batch), torch.tensor([[1.0, -1.0]] * batch))


# --- the reference: hooks on transformers' modules ----------------------------------------------------------

def hf_run(family: str, hf, embeds: torch.Tensor):
    """transformers' forward of ``embeds`` (the input node's output) with hooks: every sender's output, each
    receiver's stream, and after a backward pass of the metric each receiver's gradient, the gradient by the
    output of its own projection (or MLP, or norm) carried back through that module alone with autograd."""
    cfg = hf.config
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    Dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    gemma = family == "gemma3"
    got = {"pre": [], "mid": [], "z": [], "o": [], "mlp": [], "q": [], "k": [], "v": [], "out": []}
    handles = []

    def keep(name, grad=False):
        def hook(m, a, out):
            out = out[0] if isinstance(out, tuple) else out
            if grad:
                out.retain_grad()
            got[name].append(out)
        return hook

    for layer in hf.model.layers:
        attn = layer.self_attn
        handles += [
            layer.register_forward_pre_hook(lambda m, a, kw: got["pre"].append(a[0] if a else kw["hidden_states"]),
                                            with_kwargs=True),
            attn.o_proj.register_forward_pre_hook(lambda m, a: got["z"].append(a[0])),
            attn.o_proj.register_forward_hook(keep("o")),
            attn.q_proj.register_forward_hook(keep("q", True)), attn.k_proj.register_forward_hook(keep("k", True)),
            attn.v_proj.register_forward_hook(keep("v", True)), layer.register_forward_hook(keep("out", True)),
            (layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm)
            .register_forward_pre_hook(lambda m, a: got["mid"].append(a[0])),
            (layer.post_feedforward_layernorm if gemma else layer.mlp).register_forward_hook(keep("mlp")),
        ]
    handles.append(hf.model.norm.register_forward_pre_hook(lambda m, a: got.__setitem__("final", a[0])))
    handles.append(hf.model.norm.register_forward_hook(lambda m, a, out: got.__setitem__("normed", out)))
    try:
        with torch.enable_grad():
            hf(inputs_embeds=embeds)
            u = hf.lm_head.weight[ANSWER] - hf.lm_head.weight[DISTRACTOR]
            value = got["normed"][:, -1] @ u
            value.sum().backward()
    finally:
        for h in handles:
            h.remove()
    senders = [embeds.detach()]
    grads = []
    for i, layer in enumerate(hf.model.layers):
        attn = layer.self_attn
        z, o = got["z"][i].detach(), got["o"][i].detach()
        scale = 1.0
        if gemma:  # the norm after the attention, its scale taken at the whole output
            norm = layer.post_attention_layernorm
            scale = (1.0 + norm.weight) * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + norm.eps)
        for h in range(H):
            part = slice(h * Dh, (h + 1) * Dh)
            senders.append(F.linear(z[..., part], attn.o_proj.weight[:, part]) * scale)
        x = got["pre"][i].detach()
        for kind, heads in (("q", H), ("k", G), ("v", G)):
            proj = getattr(attn, f"{kind}_proj")
            g_out = got[kind][i].grad
            for h in range(heads):
                part = slice(h * Dh, (h + 1) * Dh)
                xd = x.clone().requires_grad_()
                y = proj(layer.input_layernorm(xd))[..., part]
                grads.append(torch.autograd.grad(y, xd, g_out[..., part])[0])
        xd = got["mid"][i].detach().clone().requires_grad_()
        if gemma:
            write = layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(xd)))
        else:
            write = layer.mlp(layer.post_attention_layernorm(xd))
        grads.append(torch.autograd.grad(write, xd, got["out"][i].grad)[0])
        senders.append(got["mlp"][i].detach())
    grads.append(got["out"][-1].grad)  # the logits read the last layer's output, through the final norm
    return torch.stack(senders).detach(), torch.stack(grads).detach(), value.detach()


def hf_scores(family: str, hf, clean: torch.Tensor, bad: torch.Tensor, steps: int) -> torch.Tensor:
    e_clean, e_bad = hf.model.embed_tokens(clean).detach(), hf.model.embed_tokens(bad).detach()
    out_clean, _, _ = hf_run(family, hf, e_clean)
    out_bad, _, _ = hf_run(family, hf, e_bad)
    g = sum(hf_run(family, hf, e_bad + (j / steps) * (e_clean - e_bad))[1] for j in range(1, steps + 1)) / steps
    return torch.einsum("sbne,rbne->sr", out_clean - out_bad, g)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_edge_scores_equal_the_gradient_formula_with_hooks_on_transformers(family, steps):
    name, ours, hf = family
    stack, graph = ours.stack, C.graph_of(ours.stack)
    cfg = hf.config
    assert len(graph.senders) == 1 + cfg.num_hidden_layers * (cfg.num_attention_heads + 1)
    assert len(graph.receivers) == cfg.num_hidden_layers * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads
                                                            + 1) + 1
    clean, bad = prompts(cfg.vocab_size)
    scores, run, corrupted = C.edge_attribution(stack, graph, clean, bad, logit_measure(3), torch.arange(3),
                                                steps=steps)
    theirs = hf_scores(name, hf, clean, bad, steps)
    mask = torch.as_tensor(graph.mask())
    top = float(theirs[mask].abs().max())
    assert top > 1e-3
    np.testing.assert_allclose(scores[mask].numpy(), theirs[mask].numpy(), atol=1e-5 * top, rtol=1e-4)
    assert not scores[~mask].any()
    # the run the scores came from is the clean run, and its metric is transformers'
    _, _, value = hf_run(name, hf, hf.model.embed_tokens(clean).detach())
    np.testing.assert_allclose(run.value.numpy(), value.numpy(), atol=1e-4)


def test_eap_ig_with_one_step_is_eap_and_its_sum_settles_as_the_steps_grow(family):
    _, ours, hf = family
    stack, graph = ours.stack, C.graph_of(ours.stack)
    clean, bad = prompts(hf.config.vocab_size, seed=1)
    args = (stack, graph, clean, bad, logit_measure(3), torch.arange(3))
    eap = C.edge_attribution(*args, steps=1)[0]
    one = C.edge_attribution(*args, steps=1)[0]
    assert torch.equal(eap, one)
    fine, finer = (C.edge_attribution(*args, steps=k)[0] for k in (40, 80))
    coarse = C.edge_attribution(*args, steps=2)[0]
    # a Riemann sum of the gradient along the path: the step from 40 to 80 moves it far less than from 2 to 40
    assert (finer - fine).abs().max() < 0.1 * (fine - coarse).abs().max()


def test_a_circuit_with_every_edge_is_the_clean_run_and_with_none_the_corrupted_run(family):
    _, ours, hf = family
    stack, graph = ours.stack, C.graph_of(ours.stack)
    clean, bad = prompts(hf.config.vocab_size, seed=2)
    measure, rows = logit_measure(3), torch.arange(3)
    with torch.inference_mode():
        x, _ = stack.run_layers(stack.embed(clean), causal=True, need_weights=False)
        model_clean = measure(stack, x, rows)
        corrupted = C.run_ids(stack, graph, bad, measure, rows)
        x, _ = stack.run_layers(stack.embed(bad), causal=True, need_weights=False)
        model_bad = measure(stack, x, rows)
        every = C.circuit_values(stack, graph, clean, corrupted, C.all_edges(graph), measure, rows)
        none = C.circuit_values(stack, graph, clean, corrupted, torch.zeros(graph.mask().shape), measure, rows)
    np.testing.assert_allclose(every.numpy(), model_clean.numpy(), atol=1e-4)
    np.testing.assert_allclose(none.numpy(), model_bad.numpy(), atol=1e-4)
    assert (model_clean - model_bad).abs().max() > 1e-2  # the corruption changes the metric


def hf_edge_patched(family: str, hf, clean: torch.Tensor, delta: torch.Tensor, receiver: tuple) -> torch.Tensor:
    """The clean prompts through transformers with receiver ``(kind, layer, index)``'s stream less ``delta``, put
    in by hooks on its own module; every other module reads what it reads."""
    cfg = hf.config
    Dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kind, layer, index = receiver
    gemma, handles, seen = family == "gemma3", [], {}
    if kind in ("q", "k", "v"):
        block = hf.model.layers[layer]
        handles.append(block.register_forward_pre_hook(
            lambda m, a, kw: seen.__setitem__("x", a[0] if a else kw["hidden_states"]), with_kwargs=True))
        proj, part = getattr(block.self_attn, f"{kind}_proj"), slice(index * Dh, (index + 1) * Dh)

        def swap(m, a, out):
            out = out.clone()
            out[..., part] = F.linear(block.input_layernorm(seen["x"] - delta), m.weight, m.bias)[..., part]
            return out

        handles.append(proj.register_forward_hook(swap))
    elif kind == "mlp":
        block = hf.model.layers[layer]
        norm = block.pre_feedforward_layernorm if gemma else block.post_attention_layernorm
        handles.append(norm.register_forward_pre_hook(lambda m, a: (a[0] - delta,)))
    else:
        handles.append(hf.model.norm.register_forward_pre_hook(lambda m, a: (a[0] - delta,)))
    handles.append(hf.model.norm.register_forward_hook(lambda m, a, out: seen.__setitem__("normed", out)))
    try:
        with torch.inference_mode():
            hf(input_ids=clean)
            return seen["normed"][:, -1] @ (hf.lm_head.weight[ANSWER] - hf.lm_head.weight[DISTRACTOR])
    finally:
        for h in handles:
            h.remove()


def test_exact_edge_patching_equals_patching_built_by_hand_with_hooks(family):
    name, ours, hf = family
    stack, graph = ours.stack, C.graph_of(ours.stack)
    clean, bad = prompts(hf.config.vocab_size, seed=3)
    measure, rows = logit_measure(3), torch.arange(3)
    with torch.inference_mode():
        good, corrupted = C.run_ids(stack, graph, clean, measure, rows), C.run_ids(stack, graph, bad, measure, rows)
    out_clean, _, _ = hf_run(name, hf, hf.model.embed_tokens(clean).detach())
    out_bad, _, _ = hf_run(name, hf, hf.model.embed_tokens(bad).detach())
    # an edge into every kind of receiver: a query, a key and a value of grouped heads, an MLP and the logits
    top = graph.n_layers - 1
    at = {node: r for r, node in enumerate(graph.receivers)}
    head, mlp = graph.senders.index(("head", 0, 1)), graph.senders.index(("mlp", 0, -1))
    edges = [(head, at["q", top, 1]), (mlp, at["k", top, 1]), (0, at["v", top, 0]),
             (graph.senders.index(("head", top, 3)), at["mlp", top, -1]), (head, at["logits", top + 1, -1]),
             (graph.senders.index(("mlp", top, -1)), at["logits", top + 1, -1])]
    for s, r in edges:
        with torch.inference_mode():
            ours_value = C.circuit_values(stack, graph, clean, corrupted, C.without(graph, [(s, r)]), measure, rows)
        theirs = hf_edge_patched(name, hf, clean, (out_clean[s] - out_bad[s]).detach(), graph.receivers[r])
        np.testing.assert_allclose(ours_value.numpy(), theirs.numpy(), atol=1e-4,
                                   err_msg=f"{graph.sender_name(s)} -> {graph.receiver_name(r)}")
    # and patching changes the metric somewhere: the comparison is not of two clean runs
    assert max(float((good.value - hf_edge_patched(name, hf, clean, (out_clean[s] - out_bad[s]).detach(),
                                                   graph.receivers[r])).abs().max()) for s, r in edges) > 1e-3


def test_a_small_circuit_reads_the_corrupted_run_in_the_layers_it_does_not_enter(family):
    """A circuit of the top layer alone: the input into one key/value head's values, the layer's heads into its
    MLP and the logits, the MLP into the logits (and a head of the first layer into the logits, which carries its
    corrupted output, nothing entering that head). Every layer below takes the corrupted run's outputs (not computed
    again); the values read the corrupted stream plus the clean input less the corrupted one. Transformers'
    corrupted run with that added to the values' stream by hooks agrees: the change reaches the logits through the
    heads and the MLP."""
    name, ours, hf = family
    stack, graph = ours.stack, C.graph_of(ours.stack)
    clean, bad = prompts(hf.config.vocab_size, seed=3)
    measure, rows = logit_measure(3), torch.arange(3)
    with torch.inference_mode():
        corrupted = C.run_ids(stack, graph, bad, measure, rows)
    out_clean, _, _ = hf_run(name, hf, hf.model.embed_tokens(clean).detach())
    out_bad, _, _ = hf_run(name, hf, hf.model.embed_tokens(bad).detach())
    top = graph.n_layers - 1
    at = {node: r for r, node in enumerate(graph.receivers)}
    heads = [s for s, (kind, layer, _) in enumerate(graph.senders) if kind == "head" and layer == top]
    mlp = graph.senders.index(("mlp", top, -1))
    keep = torch.zeros(graph.mask().shape)
    for s, r in [(0, at["v", top, 0]), *((h, at[kind, top + (kind == "logits"), -1]) for h in heads
                                         for kind in ("mlp", "logits")), (mlp, at["logits", top + 1, -1]),
                 (graph.senders.index(("head", 0, 1)), at["logits", top + 1, -1])]:  # its inputs corrupted: no change
        keep[s, r] = 1
    with torch.inference_mode():
        ours_value = C.circuit_values(stack, graph, clean, corrupted, keep, measure, rows)
    theirs = hf_edge_patched(name, hf, bad, -(out_clean[0] - out_bad[0]).detach(), ("v", top, 0))
    np.testing.assert_allclose(ours_value.numpy(), theirs.numpy(), atol=1e-4)
    assert float((theirs - corrupted.value).abs().max()) > 1e-3  # the circuit moves the metric


# --- a hand-made two-layer model: the only path runs through head A into head B's query ------------------------

def two_heads(tmp_path):
    """Attention-only, one head a layer, 16 dimensions: token identity in 0-1 (others in 2), position 0 in 4 and
    the rest in 5, and a large constant in 15 that keeps every LayerNorm's scale nearly still, so that the model is
    nearly linear along its path. Head A (layer 0) looks at position 0 from everywhere and copies its token into
    8-9; head B (layer 1) asks with 8-9 whether position 0 held the first token, looks there if so (elsewhere if
    not) and writes what it finds of the position into 12-13; the unembedding reads 12 alone. Every change the
    corruption makes off that path swaps two dimensions' values, which no LayerNorm sees."""
    from tests.conftest import _bpe_vocab
    import transformers as tf

    vocab, merges = _bpe_vocab()
    config = DecoderConfig(vocab_size=len(vocab), max_len=32, n_layers=2, n_heads=1, d_model=16)
    stack = Decoder(config)
    with torch.no_grad():
        for p in stack.parameters():
            p.zero_()
        for ln in (stack.layers[0].ln_attn, stack.layers[1].ln_attn, stack.ln_final):
            ln.weight.fill_(1.0)
        stack.tok_emb.weight[:, 2] = 5.0
        stack.tok_emb.weight[10] = 0
        stack.tok_emb.weight[10, 0] = 5.0   # the clean first token
        stack.tok_emb.weight[11] = 0
        stack.tok_emb.weight[11, 1] = 5.0   # the corrupted one
        stack.pos_emb.weight[0, 4] = 5.0
        stack.pos_emb.weight[1:, 5] = 5.0
        stack.pos_emb.weight[:, 15] = 400.0
        for layer, (q_from, v_from, v_to) in enumerate([(None, (0, 1), (8, 9)), ((8, 9), (4, 5), (12, 13))]):
            attn = stack.layers[layer].attn
            wq, wk, wv = attn.in_proj_weight.split(attn.sizes)
            bq = attn.in_proj_bias.split(attn.sizes)[0]
            if q_from is None:
                bq[0] = 10.0                                       # A asks the same everywhere
            else:
                wq[0, q_from[0]], wq[0, q_from[1]] = 10.0, -10.0       # B asks by what A copied, softly
            wk[0, 4], wk[0, 5] = 1000.0, -1000.0                   # keys: position 0 or not
            wv[0, v_from[0]], wv[1, v_from[1]] = 1.0, 1.0
            attn.out_proj.weight[v_to[0], 0], attn.out_proj.weight[v_to[1], 1] = 100.0, 100.0
        stack.unembed.weight[ANSWER, 12], stack.unembed.weight[DISTRACTOR, 12] = 100.0, -100.0
    stack.save_pretrained(tmp_path)
    tok = tf.GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                               pad_token="<pad>")
    tok.save_pretrained(tmp_path)
    return load_model(tmp_path, backend="scratch")


def test_the_only_path_from_head_a_into_head_bs_query_is_the_circuit_found(tmp_path):
    model = two_heads(tmp_path)
    pairs = tuple(TaskPair("", "", (10,) + (20 + i,) * 6, (11,) + (20 + i,) * 6, ANSWER, DISTRACTOR, (("END", 6),))
                  for i in range(4))
    task = Task("two heads", "Two heads", pairs)
    path = {("input", "L0 H0.v"), ("L0 H0", "L1 H0.q"), ("L1 H0", "logits")}
    scores = AC.edge_scores(model, task, "eap_ig")
    top = scores.frame(3)
    assert set(zip(top.sender, top.receiver)) == path
    assert (top.share > 0.9).all() and scores.frame().share[3:].abs().max() < 1e-3
    # EAP's one gradient at the clean input misses the edge into B's query: B's attention there is settled (its
    # softmax flat to a small change), which is why EAP-IG walks the path from the corrupted input
    eap = AC.edge_scores(model, task, "eap").frame()
    assert eap.query("sender == 'L0 H0' and receiver == 'L1 H0.q'").share.abs().item() < 0.01
    assert (scores.clean > scores.corrupted + 1).all()
    curve = AC.faithfulness(model, scores, sizes=[0, 2, 3, scores.graph.n_edges])
    np.testing.assert_allclose(curve.faithfulness, [0.0, 0.0, 1.0, 1.0], atol=1e-5)
    assert curve.smallest() == 3
    # each of the three alone carries the whole effect; every other edge, exactly patched, none of it
    frame = scores.frame()
    edges = list(zip(frame.sender_index, frame.receiver_index))
    exact = AC.exact_edges(model, task, edges).mean(0) / np.mean(scores.clean - scores.corrupted)
    np.testing.assert_allclose(exact[:3], 1.0, atol=1e-5)
    np.testing.assert_allclose(exact[3:], 0.0, atol=1e-5)
    # path patching A into B's query is the paper's test of that edge: the whole effect; into B's key, none
    assert AC.path_patching(model, task, (0, 0), [(1, 0)], kinds=("q",)).share == pytest.approx(1.0, abs=1e-5)
    assert AC.path_patching(model, task, (0, 0), [(1, 0)], kinds=("k",)).share == pytest.approx(0.0, abs=1e-5)


def test_what_cannot_be_a_circuit_gets_a_sentence(tmp_path):
    model = two_heads(tmp_path)
    pair = TaskPair("", "", (10, 20, 21), (11, 20, 21), ANSWER, DISTRACTOR, (("END", 2),))
    task = Task("two heads", "Two heads", (pair,))
    with pytest.raises(HeadLensError, match="Unknown method"):
        AC.edge_scores(model, task, "acdc")
    with pytest.raises(HeadLensError, match="1 to 100 steps"):
        AC.edge_scores(model, task, "eap_ig", steps=0)
    with pytest.raises(HeadLensError, match="later layers"):
        AC.path_patching(model, task, (1, 0), [(0, 0)])
    with pytest.raises(HeadLensError, match="not a head"):
        AC.path_patching(model, task, (0, 5), [(1, 0)])
    with pytest.raises(HeadLensError, match="queries, keys and values"):
        AC.path_patching(model, task, (0, 0), [(1, 0)], kinds=("o",))
    same = Task("same", "Same", (TaskPair("", "", (10, 20, 21), (10, 20, 21), ANSWER, DISTRACTOR, (("END", 2),)),))
    with pytest.raises(HeadLensError, match="nothing for a circuit to recover"):
        AC.faithfulness(model, AC.edge_scores(model, same, "eap"), sizes=[1])


def test_a_patched_edge_is_a_circuit_of_every_other_edge(family):
    """Exact edge patching adds the corrupted output's difference to one receiver's stream; a circuit of every
    edge but those gives the same run."""
    _, ours, hf = family
    stack, graph = ours.stack, C.graph_of(ours.stack)
    clean, bad = prompts(hf.config.vocab_size, seed=4)
    measure, rows = logit_measure(3), torch.arange(3)
    edges = [(0, 5), (1, len(graph.receivers) - 1), (len(graph.senders) - 1, len(graph.receivers) - 1)]
    with torch.inference_mode():
        good, corrupted = C.run_ids(stack, graph, clean, measure, rows), C.run_ids(stack, graph, bad, measure, rows)
        for chosen in ([edges[0]], [edges[1]], edges):
            added = C.patched_values(stack, graph, good, corrupted, chosen, measure, rows)
            circuit = C.circuit_values(stack, graph, clean, corrupted, C.without(graph, chosen), measure, rows)
            np.testing.assert_allclose(added.numpy(), circuit.numpy(), atol=1e-4)


# --- what a task's runs report and refuse, on the two-head model ------------------------------------------------

@pytest.fixture(scope="module")
def two(tmp_path_factory):
    model = two_heads(tmp_path_factory.mktemp("two-heads"))
    pairs = tuple(TaskPair("", "", (10,) + (20 + i,) * 6, (11,) + (20 + i,) * 6, ANSWER, DISTRACTOR, (("END", 6),))
                  for i in range(5))
    return model, Task("two heads", "Two heads", pairs)


def test_a_task_run_in_batches_reports_each_batch_and_gives_the_one_batch_result(two):
    model, task = two
    seen = []
    scores = AC.edge_scores(model, task, "eap", batch_pairs=2, progress=lambda done, total: seen.append((done, total)))
    # batches of 2, 2 and 1 pairs; each reports its corrupted run and EAP's one gradient, halfway, then itself done
    assert seen == [(d, 5) for d in (0, 1, 2, 2, 3, 4, 4, 4.5, 5)]
    whole = AC.edge_scores(model, task, "eap")
    np.testing.assert_allclose(scores.scores, whole.scores, atol=1e-6)
    np.testing.assert_allclose(scores.clean, whole.clean, atol=1e-5)
    seen.clear()
    scores = AC.edge_scores(model, task, "eap_ig")  # EAP misses the edge into B's query (above); EAP-IG finds it
    curve = AC.faithfulness(model, scores, [0, 3], batch_pairs=2,
                            progress=lambda done, total: seen.append((done, total)))
    values, clean, corrupted = curve.values, curve.clean, curve.corrupted
    assert seen == [(d, 10) for d in (2, 4, 6, 8, 9, 10)]  # (pairs, sizes) counted over both
    np.testing.assert_allclose(clean, scores.clean)
    np.testing.assert_allclose(values[:, 1], clean, atol=1e-4)  # the three path edges are the whole effect
    np.testing.assert_allclose(values[:, 0], corrupted, atol=1e-4)
    seen.clear()
    frame = scores.frame(2)
    out = AC.exact_edges(model, task, list(zip(frame.sender_index, frame.receiver_index)), batch_pairs=2,
                         progress=lambda done, total: seen.append((done, total)))
    assert seen == [(d, 10) for d in (2, 4, 6, 8, 9, 10)]
    np.testing.assert_allclose(out, (scores.clean - scores.corrupted)[:, None].repeat(2, 1), atol=1e-4)


def test_edge_scores_frame_names_its_columns_and_keeps_the_kinds_asked_for(two):
    model, task = two
    scores = AC.edge_scores(model, task, "eap_ig")
    frame = scores.frame()
    assert list(frame.columns) == ["rank", "sender", "receiver", "kind", "sender_layer", "receiver_layer", "score",
                                   "share", "sender_index", "receiver_index"]
    assert list(frame["rank"]) == list(range(1, scores.graph.n_edges + 1))
    # the path input → A's value, A → B's query, B → logits, whatever order their scores take
    top = {(r.sender, r.receiver): (r.kind, r.sender_layer, r.receiver_layer) for r in frame[:3].itertuples()}
    assert top == {("input", "L0 H0.v"): ("v", -1, 0), ("L0 H0", "L1 H0.q"): ("q", 0, 1),
                   ("L1 H0", "logits"): ("logits", 1, 2)}
    queries = scores.frame(kinds=("q",))
    assert set(queries.kind) == {"q"} and len(queries) == 3  # input, A and A's MLP... into B's query
    assert (queries.sender.iloc[0], queries.receiver.iloc[0]) == ("L0 H0", "L1 H0.q")
    assert list(scores.frame(1, kinds=("k", "v")).receiver) == ["L0 H0.v"]


def test_eap_ig_takes_one_to_a_hundred_steps(two):
    model, task = two
    one = Task("one", "One", task.pairs[:1])
    assert AC.edge_scores(model, one, "eap_ig", steps=100).steps == 100
    with pytest.raises(HeadLensError, match="EAP-IG takes 1 to 100 steps; 101 were asked for"):
        AC.edge_scores(model, one, "eap_ig", steps=101)


def test_what_a_task_cannot_run_gets_its_own_sentence(two):
    model, task = two
    with pytest.raises(HeadLensError, match="^The task has no pairs.$"):
        AC.edge_scores(model, Task("none", "None", ()), "eap")
    graph = AC.graph_of(model.stack)
    later = graph.senders.index(("head", 1, 0))
    with pytest.raises(HeadLensError, match="^Each edge runs from a sender to a later receiver"):
        AC.exact_edges(model, task, [(later, 0)])  # B's output into A's query, below it
    for outside in [(len(graph.senders), len(graph.receivers) - 1), (0, len(graph.receivers))]:
        with pytest.raises(HeadLensError, match="^Each edge runs from a sender to a later receiver"):
            AC.exact_edges(model, task, [outside])  # past the last sender, past the last receiver
    with pytest.raises(HeadLensError, match="not a head of this model's graph"):
        AC.receiver_index(graph, graph.n_layers, 0, "k")  # the logits' layer has no heads
    scores = AC.edge_scores(model, task, "eap")
    import dataclasses
    other = dataclasses.replace(scores.graph, receivers=scores.graph.receivers[:-1])  # the same senders
    with pytest.raises(HeadLensError, match=r"^These edge scores were taken on another model's graph\.$"):
        AC.circuit_values(model, dataclasses.replace(scores, graph=other), [1])


def test_a_curves_interval_is_the_bootstrap_of_its_pairs_faithfulness():
    """The pairs resampled together: a ratio of means whose percentile interval a plain bootstrap of 20,000 draws
    matches; the same seed gives the same interval, another seed another."""
    rng = np.random.default_rng(3)
    clean, corrupted = rng.normal(3.0, 1.0, 40), rng.normal(0.5, 1.0, 40)
    values = corrupted[:, None] + (clean - corrupted)[:, None] * np.array([0.0, 0.4, 1.0]) + rng.normal(0, .5, (40, 3))
    curve = AC.curve_of([0, 5, 9], values, clean, corrupted, seed=1)
    span = clean - corrupted
    np.testing.assert_allclose(curve.faithfulness, (values - corrupted[:, None]).mean(0) / span.mean())
    np.testing.assert_array_equal(curve.clean, clean)
    np.testing.assert_array_equal(curve.corrupted, corrupted)
    draws = np.random.default_rng(0).integers(0, 40, (20000, 40))
    ratios = (values - corrupted[:, None])[draws].mean(1) / span[draws].mean(1)[:, None]
    low, high = np.percentile(ratios, [2.5, 97.5], axis=0)
    np.testing.assert_allclose(curve.low, low, atol=0.01)
    np.testing.assert_allclose(curve.high, high, atol=0.01)
    assert (curve.high - curve.low > 0.05).all()
    again, other = AC.curve_of([0, 5, 9], values, clean, corrupted, seed=1), AC.curve_of([0, 5, 9], values, clean,
                                                                                         corrupted, seed=2)
    np.testing.assert_array_equal(again.low, curve.low)
    assert not np.array_equal(other.low, curve.low)


def test_runs_share_their_start_up_to_the_first_token_that_differs(two, scratch_model):
    """A causal model's outputs before the first differing token are the same in both runs; an encoder's never
    are, as every token sees every other."""
    from models.run import patching_stack

    a = torch.tensor([[10, 20, 21, 22, 23], [10, 20, 21, 22, 23]])
    b = a.clone()
    b[1, 3], b[0, 4] = 30, 31
    assert C.shared_start(two[0].stack, a, b) == 3
    assert C.shared_start(two[0].stack, a, a) == 4  # nothing differs: the last token is still run
    assert C.shared_start(patching_stack(scratch_model), a, b) == 0


# --- what the scores' functions say and keep, word for word and by hand -------------------------------------------

def test_the_circuits_sentences_word_for_word(two, tiny):
    model, task = two
    one = Task("one", "One", task.pairs[:1])
    with pytest.raises(HeadLensError, match=r"^Unknown method 'acdc': choose 'eap' or 'eap_ig'\.$"):
        AC.edge_scores(model, one, "acdc")
    with pytest.raises(HeadLensError, match=r"^Give circuit sizes of 0 edges or more\.$"):
        AC.circuit_values(model, AC.edge_scores(model, one, "eap"), [])
    with pytest.raises(HeadLensError, match=r"^Give circuit sizes of 0 edges or more\.$"):
        AC.circuit_values(model, AC.edge_scores(model, one, "eap"), [3, -1])
    with pytest.raises(HeadLensError, match=r"^The clean and corrupted prompts score the same on average: there is "
                                            r"nothing for a circuit to recover\.$"):
        AC.curve_of([1], np.zeros((2, 1)), np.ones(2), np.ones(2))
    with pytest.raises(HeadLensError, match=r"^Choose at least one receiving head and input\.$"):
        AC.path_patching(model, one, (0, 0), [])
    with pytest.raises(HeadLensError, match=r"^L0 H0 writes only to heads in later layers"):
        AC.path_patching(model, one, (0, 0), [(0, 0)])  # its own layer: the first sender its query cannot read
    bloom = load_model(tiny("bloom"))  # an architecture the from-scratch engine does not implement
    with pytest.raises(HeadLensError, match=r"^A circuit's edges are traced "):
        AC.edge_scores(bloom, one, "eap")


def test_edge_scores_default_to_eap_ig_in_five_steps_summed_in_float64_and_take_one_step(two):
    model, task = two
    one = Task("one", "One", task.pairs[:1])
    scores = AC.edge_scores(model, one)
    assert (scores.method, scores.steps, scores.scores.dtype) == ("eap_ig", 5, np.float64)
    assert AC.edge_scores(model, one, "eap_ig", steps=1).steps == 1


def test_a_circuit_of_receiver_kinds_keeps_those_edges_alone_and_the_whole_graph_is_the_clean_run_exactly(two):
    model, task = two
    scores = AC.edge_scores(model, task, "eap_ig")
    kinds = np.array([k for k, _, _ in scores.graph.receivers])
    queries = scores.top(3, ("q",))
    assert queries.sum() == 3 and set(kinds[np.nonzero(queries)[1]]) == {"q"}
    path = AC.faithfulness(model, scores, [3])  # input → A's value, A → B's query, B → logits: the whole effect
    only_queries = AC.faithfulness(model, scores, [3], ("q",))  # into B's query alone: A's copy never made
    assert path.faithfulness[0] == pytest.approx(1.0, abs=1e-3)
    assert abs(only_queries.faithfulness[0]) < 0.5
    whole = AC.faithfulness(model, scores, [scores.graph.n_edges], seed=7)
    np.testing.assert_array_equal(whole.values[:, 0], scores.clean)  # the clean run's metric, not a run again
    again = AC.curve_of(whole.sizes, whole.values, whole.clean, whole.corrupted, seed=7)
    assert (whole.low, whole.high) == (again.low, again.high)  # its interval drawn with the seed asked


def test_a_curves_interval_is_drawn_with_the_seed_asked_and_the_whole_circuit_costs_no_run(family, monkeypatch):
    _, model, hf = family
    clean, bad = prompts(hf.config.vocab_size, seed=6, batch=8)  # pairs whose circuits recover shares of their own
    task = Task("random", "Random", tuple(TaskPair("", "", tuple(c.tolist()), tuple(b.tolist()), ANSWER, DISTRACTOR,
                                                   (("END", N - 1),)) for c, b in zip(clean, bad)))
    scores = AC.edge_scores(model, task, "eap")
    seeded = AC.faithfulness(model, scores, [3, 30], seed=3)
    three, zero = (AC.curve_of(seeded.sizes, seeded.values, seeded.clean, seeded.corrupted, seed=s) for s in (3, 0))
    np.testing.assert_array_equal(seeded.low, three.low)
    np.testing.assert_array_equal(seeded.high, three.high)
    assert not np.array_equal(seeded.low, zero.low), (seeded.low, zero.low)
    runs = []
    circuit = C.circuit_values
    monkeypatch.setattr(C, "circuit_values", lambda *a, **k: runs.append(1) or circuit(*a, **k))
    AC.circuit_values(model, scores, [scores.graph.n_edges, 3])
    assert len(runs) == 1  # the circuit of 3 edges is run; every edge's is the clean run already taken


def test_a_curves_default_seed_is_0_and_its_smallest_circuit_is_the_first_to_reach_the_target_exactly():
    rng = np.random.default_rng(3)
    clean, corrupted = rng.normal(2, 1, 40), rng.normal(0, 1, 40)
    values = corrupted[:, None] + (clean - corrupted)[:, None] * rng.uniform(0, 1, (40, 2))
    default = AC.curve_of([5, 50], values, clean, corrupted)
    zero, one = (AC.curve_of([5, 50], values, clean, corrupted, seed=s) for s in (0, 1))
    np.testing.assert_array_equal(default.low, zero.low)
    assert not np.array_equal(default.low, one.low)
    reached = dataclasses.replace(default, sizes=np.array([5, 50, 500]), faithfulness=np.array([0.5, 0.8, 0.9]))
    assert reached.smallest() == 50  # 0.8 reaches the target of 0.8


def test_a_paths_sender_receivers_and_interval_are_its_own(family):
    _, model, hf = family
    clean, bad = prompts(hf.config.vocab_size, seed=6, batch=8)  # pairs whose paths differ: an interval of width
    task = Task("random", "Random", tuple(TaskPair("", "", tuple(c.tolist()), tuple(b.tolist()), ANSWER, DISTRACTOR,
                                                   (("END", N - 1),)) for c, b in zip(clean, bad)))
    path = AC.path_patching(model, task, (0, 1), [(1, 0)])
    assert (path.sender, path.receivers) == ("L0 H1", ("L1 H0.q",))
    assert path.share == pytest.approx(path.effects.mean() / path.span.mean())
    seeded = AC.path_patching(model, task, (0, 1), [(1, 0)], seed=0)
    assert (path.low, path.high) == (seeded.low, seeded.high)  # the default seed, 0: the same draws
    assert path.low <= path.share <= path.high and path.low < path.high, (path.low, path.high)
    from analysis.stats import interval

    three = AC.path_patching(model, task, (0, 1), [(1, 0)], seed=3)
    low, high = interval(three.effects[:, None], three.span, seed=3)  # the share's interval: the pairs resampled
    assert (three.low, three.high) == (low[0], high[0]) and (three.low, three.high) != (path.low, path.high)
    plain = interval(three.effects[:, None], seed=3)  # of the effects alone, not of their share of the span
    assert (three.low, three.high) != (plain[0][0], plain[1][0])


def test_an_edges_share_of_no_span_is_nan_and_equal_scores_keep_the_graphs_order(family):
    _, ours, _ = family
    graph = C.graph_of(ours.stack)
    flat = AC.EdgeScores(None, "logit_diff", "eap", 1, graph, np.ones((len(graph.senders), len(graph.receivers))),
                         np.ones(2), np.ones(2))
    assert flat.frame(5)["share"].isna().all()  # clean and corrupted the same: no share of nothing
    s, r = flat.ranked()
    expected_s, expected_r = np.nonzero(graph.mask())
    np.testing.assert_array_equal(s, expected_s)
    np.testing.assert_array_equal(r, expected_r)
    few = np.random.default_rng(0).integers(-2, 3, flat.scores.shape).astype(float)  # many ties among five values
    s, r = dataclasses.replace(flat, scores=few).ranked()
    by_hand = np.lexsort((np.arange(len(expected_s)), -np.abs(few[expected_s, expected_r])))  # then the graph's order
    np.testing.assert_array_equal(s, expected_s[by_hand])
    np.testing.assert_array_equal(r, expected_r[by_hand])


def test_a_heads_key_and_value_inputs_are_its_groups_and_a_layer_without_heads_names_the_head_asked(family):
    _, ours, hf = family
    graph = C.graph_of(ours.stack)
    H, G = hf.config.num_attention_heads, hf.config.num_key_value_heads
    for layer in range(graph.n_layers):
        for head in range(H):
            group = head // (H // G)
            assert graph.receivers[AC.receiver_index(graph, layer, head, "q")] == ("q", layer, head)
            for kind in ("k", "v"):
                assert graph.receivers[AC.receiver_index(graph, layer, head, kind)] == (kind, layer, group)
    with pytest.raises(HeadLensError, match=rf"^L{graph.n_layers} H-1 is not a head of this model's graph\.$"):
        AC.receiver_index(graph, graph.n_layers, 0, "k")  # the logits' layer: no key head at all


def test_a_key_or_value_head_read_by_several_is_named_as_their_group(family):
    _, ours, hf = family
    graph = C.graph_of(ours.stack)
    H, G = hf.config.num_attention_heads, hf.config.num_key_value_heads
    names = {graph.receivers[r]: graph.receiver_name(r) for r in range(len(graph.receivers))}
    for (kind, layer, index), name in names.items():
        if kind in ("k", "v"):
            assert name == (f"L{layer} H{index}.{kind}" if G == H else f"L{layer} KV{index}.{kind}"), name


def test_a_parallel_blocks_mlp_reads_none_of_its_layers_heads(tmp_path):
    """GPT-NeoX adds attention and feed-forward read from the same stream: an MLP reads what came before its layer's
    heads; a sequential block's (Qwen3's) reads its layer's heads too."""
    from tests import test_families

    for family, parallel in (("gpt_neox", True), ("qwen3", False)):
        folder, hf, _ = test_families.build(family, tmp_path / family)
        assert getattr(hf.config, "use_parallel_residual", False) == parallel
        graph = C.graph_of(load_model(folder, backend="scratch").stack)
        H = hf.config.num_attention_heads
        for r, (kind, layer, _) in enumerate(graph.receivers):
            if kind == "mlp":
                first = graph.senders.index(("head", layer, 0))
                assert graph.reach[r] == (first if parallel else first + H), (family, layer, graph.reach[r])
