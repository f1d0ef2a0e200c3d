"""Logit attribution and activation patching against forward hooks on transformers' own modules (tiny
random Llama, Qwen2 and Mistral built here), on a hand-made model whose only path is one head, and on
the bundled SmolLM2 doing the indirect-object task."""
import numpy as np
import pytest
import torch

from analysis.defaults import PAIRS

from analysis.effects import answer_token, grid, logit_attribution, parts_total, patch_heads, patch_residual
from models import HeadLensError, load_model
from models.run import Edits
from models.stacks.decoder import Decoder, DecoderConfig
from tests.test_llama import FAMILIES, build

CLEAN = "The cat sat on the mat because it was warm."
CORRUPTED = "The cat sat on the mat because it was cold."  # tokens 17 to 19 differ: within a sliding window of 5


@pytest.fixture(scope="module", params=list(FAMILIES))
def decoder(request, tmp_path_factory):
    """(family, ours on the from-scratch engine, the transformers engine's model, transformers' CausalLM, tokenizer)."""
    family, folder, hf, tok = build(request.param, tmp_path_factory.mktemp(f"effects-{request.param}"))
    if family == "llama":  # attention_bias=True: give the output projections' biases values to attribute
        with torch.no_grad():
            for layer in hf.model.layers:
                layer.self_attn.o_proj.bias.normal_(0, 0.5)
        hf.save_pretrained(folder)
    return family, load_model(folder, backend="scratch"), load_model(folder), hf, tok


def run_hf(hf, tok, text, patch=None):
    """transformers' forward of ``text`` with hooks: each layer's input, o_proj input (z), attention and MLP
    outputs, the last layer's output, the logits; ``patch`` = (layer, head, position or None, z) puts ``z``'s
    slice of that head into o_proj's input."""
    ids = tok(text, return_tensors="pt")["input_ids"]
    layers = hf.model.layers
    Dh = getattr(hf.config, "head_dim", None) or hf.config.hidden_size // hf.config.num_attention_heads
    got = {"resid": [], "z": [], "mlp": [], "out": None}
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda m, args, kw: got["resid"].append(args[0][0].clone())
                                                       if args else got["resid"].append(kw["hidden_states"][0].clone()),
                                                       with_kwargs=True))

        def o_pre(m, args, i=i):
            z = args[0].clone()
            if patch is not None and patch[0] == i:
                _, h, p, clean_z = patch
                at = slice(None) if p is None else p
                z[0, at, h * Dh:(h + 1) * Dh] = clean_z[at, h * Dh:(h + 1) * Dh]
            got["z"].append(z[0].clone())
            return (z,)

        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(o_pre))
        handles.append(layer.mlp.register_forward_hook(lambda m, a, out: got["mlp"].append(out[0].clone())))
    handles.append(layers[-1].register_forward_hook(
        lambda m, a, out: got.__setitem__("out", (out[0] if isinstance(out, tuple) else out)[0].clone())))
    try:
        with torch.inference_mode():
            got["logits"] = hf(ids).logits[0]
    finally:
        for h in handles:
            h.remove()
    return got


def test_attribution_equals_hooks_on_transformers_and_its_parts_sum_to_the_logit_difference(decoder):
    family, ours, theirs, hf, tok = decoder
    ref = run_hf(hf, tok, CLEAN)
    answer, distractor = ref["logits"][-1].topk(2).indices.tolist()
    for model in (ours, theirs):  # the transformers engine hands the work to its twin
        frame = logit_attribution(model, CLEAN, answer, distractor)
        direction = hf.lm_head.weight[answer] - hf.lm_head.weight[distractor]
        x = ref["out"][-1]
        scale = hf.model.norm.weight / torch.sqrt(x.pow(2).mean() + hf.model.norm.variance_epsilon)
        H = hf.config.num_attention_heads
        Dh = hf.config.hidden_size // H
        with torch.no_grad():
            for layer in range(hf.config.num_hidden_layers):
                w = hf.model.layers[layer].self_attn.o_proj.weight
                for head in range(H):
                    part = w[:, head * Dh:(head + 1) * Dh] @ ref["z"][layer][-1, head * Dh:(head + 1) * Dh]
                    got = frame.query("layer == @layer and head == @head")["attribution"].item()
                    assert got == pytest.approx(float(part * scale @ direction), abs=1e-5)
                mlp = float(ref["mlp"][layer][-1] * scale @ direction)
                assert frame.attrs["mlp"][layer] == pytest.approx(mlp, abs=1e-5)
            emb = float(ref["resid"][0][-1] * scale @ direction)
        assert frame.attrs["embeddings"] == pytest.approx(emb, abs=1e-5)
        own = float(ref["logits"][-1, answer] - ref["logits"][-1, distractor])
        assert frame.attrs["logit_diff"] == pytest.approx(own, abs=1e-4)
        assert parts_total(frame) == pytest.approx(own, abs=1e-4)
        if family == "llama":  # attention_bias=True: o_proj's bias is a part of its own
            assert any(abs(b) > 1e-4 for b in frame.attrs["attention_bias"])
    alone = logit_attribution(ours, CLEAN, answer)  # without a distractor: logit(answer) itself
    assert alone.attrs["logit_diff"] == pytest.approx(float(ref["logits"][-1, answer]), abs=1e-4)
    assert parts_total(alone) == pytest.approx(float(ref["logits"][-1, answer]), abs=1e-4)


def test_patching_equals_hooks_on_transformers(decoder):
    family, ours, theirs, hf, tok = decoder
    clean, corrupted = run_hf(hf, tok, CLEAN), run_hf(hf, tok, CORRUPTED)
    answer = int(clean["logits"][-1].argmax())
    distractor = int(corrupted["logits"][-1].topk(2).indices[1 if corrupted["logits"][-1].argmax() == answer else 0])

    def ld(got):
        return float(got["logits"][-1, answer] - got["logits"][-1, distractor])

    ld_clean, ld_corrupted = ld(clean), ld(corrupted)
    heads = patch_heads(theirs, CLEAN, CORRUPTED, answer, distractor)
    assert heads.attrs["ld_clean"] == pytest.approx(ld_clean, abs=1e-4)
    assert heads.attrs["ld_corrupted"] == pytest.approx(ld_corrupted, abs=1e-4)
    per_position = patch_heads(ours, CLEAN, CORRUPTED, answer, distractor, per_position=True)
    n = len(tok(CLEAN)["input_ids"])
    assert len(per_position) == 2 * 4 * n and per_position["token"].tolist()[:n] == tok.tokenize(CORRUPTED)
    for layer in range(2):
        for head in range(4):
            want = (ld(run_hf(hf, tok, CORRUPTED, (layer, head, None, clean["z"][layer]))) - ld_corrupted) / \
                (ld_clean - ld_corrupted)
            assert heads.query("layer == @layer and head == @head")["recovered"].item() == pytest.approx(want, abs=1e-4)
            for position in (3, 18, n - 1):
                want = (ld(run_hf(hf, tok, CORRUPTED, (layer, head, position, clean["z"][layer]))) - ld_corrupted) / \
                    (ld_clean - ld_corrupted)
                got = per_position.query("layer == @layer and head == @head and position == @position")["recovered"]
                assert got.item() == pytest.approx(want, abs=1e-4)
    assert heads["recovered"].abs().max() > 0.05  # some head matters, so the comparison means something


def test_residual_patching_equals_hooks_on_transformers(decoder):
    family, ours, theirs, hf, tok = decoder
    clean, corrupted = run_hf(hf, tok, CLEAN), run_hf(hf, tok, CORRUPTED)
    answer, distractor = int(clean["logits"][-1].argmax()), int(corrupted["logits"][-1].argmax())
    if answer == distractor:
        distractor = int(clean["logits"][-1].topk(2).indices[1])
    frame = patch_residual(ours, CLEAN, CORRUPTED, answer, distractor)
    ld_c = float(clean["logits"][-1, answer] - clean["logits"][-1, distractor])
    ld_k = float(corrupted["logits"][-1, answer] - corrupted["logits"][-1, distractor])
    ids = tok(CORRUPTED, return_tensors="pt")["input_ids"]
    for layer in (0, 1):
        for position in (0, 1, ids.shape[1] - 1):
            def put(m, args, kw):
                h = (args[0] if args else kw["hidden_states"]).clone()
                h[0, position] = clean["resid"][layer][position]
                return ((h, *args[1:]), kw) if args else (args, {**kw, "hidden_states": h})

            handle = hf.model.layers[layer].register_forward_pre_hook(put, with_kwargs=True)
            try:
                with torch.inference_mode():
                    logits = hf(ids).logits[0, -1]
            finally:
                handle.remove()
            want = (float(logits[answer] - logits[distractor]) - ld_k) / (ld_c - ld_k)
            got = frame.query("layer == @layer and position == @position")["recovered"].item()
            assert got == pytest.approx(want, abs=1e-4)
    assert frame.query("layer == 0 and position < 17")["recovered"].abs().max() == 0  # the same tokens there


def one_head_model(tmp_path, *, pruned: bool = False):
    """A one-layer, attention-only decoder whose head 1 writes nothing (its output projection is zero):
    what the first token says reaches the last position through head 0 alone."""
    from tests.conftest import _bpe_vocab
    import transformers as tf

    vocab, merges = _bpe_vocab()
    config = DecoderConfig(vocab_size=len(vocab), max_len=32, n_layers=1, n_heads=2, d_model=16)
    stack = Decoder.untrained(config, seed=3)
    with torch.no_grad():
        stack.layers[0].attn.out_proj.weight[:, 8:] = 0
        stack.layers[0].attn.in_proj_weight.mul_(20)  # sharp attention, so the first token matters
        stack.tok_emb.weight.mul_(20)
    if pruned:
        stack = stack.pruned_copy([(0, 1)])
    stack.save_pretrained(tmp_path)
    tok = tf.GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                               pad_token="<pad>")
    tok.save_pretrained(tmp_path)
    return load_model(tmp_path, backend="scratch")


def last_logits_and_pair(model, clean: str, corrupted: str):
    """Both prompts' last-position logits, and the answer and distractor the corruption moves most apart."""
    with torch.inference_mode():
        logits = [model.stack(torch.tensor([model.tokenizer(t)["input_ids"]], device=model.device)).logits[0, -1]
                  for t in (clean, corrupted)]
    return logits, int((logits[0] - logits[1]).argmax()), int((logits[0] - logits[1]).argmin())


@pytest.mark.parametrize("pruned", [False, True])
def test_the_only_path_recovers_everything_and_a_silent_head_nothing(tmp_path, pruned):
    model = one_head_model(tmp_path, pruned=pruned)
    clean, corrupted = "cat sat on the mat", "book sat on the mat"
    assert len(model.tokenizer(clean)["input_ids"]) == len(model.tokenizer(corrupted)["input_ids"])
    logits, answer, distractor = last_logits_and_pair(model, clean, corrupted)
    seen = []
    frame = patch_heads(model, clean, corrupted, answer, distractor, progress=lambda done, total: seen.append(done / total))
    assert seen[-1] == 1 and seen == sorted(seen)
    assert frame.query("head == 0")["recovered"].item() == pytest.approx(1.0, abs=1e-5)
    assert frame.query("head == 1")["recovered"].item() == pytest.approx(0.0, abs=1e-6)
    per_position = patch_heads(model, clean, corrupted, answer, distractor, per_position=True)
    last = len(per_position.attrs["tokens"]) - 1
    assert per_position.query("head == 0 and position == @last")["recovered"].item() == pytest.approx(1.0, abs=1e-5)
    assert per_position.query("head == 0 and position < @last")["recovered"].abs().max() < 1e-6
    assert per_position.query("head == 1")["recovered"].abs().max() < 1e-6  # silent, or pruned: at no position
    attribution = logit_attribution(model, clean, answer, distractor)
    assert attribution.query("head == 1")["attribution"].item() == 0
    assert parts_total(attribution) == pytest.approx(attribution.attrs["logit_diff"], abs=1e-4)


def test_a_pruned_heads_patch_at_one_position_runs_the_corrupted_prompt(tmp_path):
    """``patched_differences`` given a pruned head: its copy, at one position as at every one, is the corrupted
    prompt (the kept head beside it, the only path here, is not patched in its place)."""
    from analysis.effects import parts as P
    from analysis.effects.frames import _setup

    model = one_head_model(tmp_path, pruned=True)
    clean, corrupted = "cat sat on the mat", "book sat on the mat"
    logits, answer, distractor = last_logits_and_pair(model, clean, corrupted)
    s = _setup(model, clean, corrupted, answer, distractor)
    last = len(s.tokens) - 1
    ld_corrupted = float(logits[1][answer] - logits[1][distractor])
    ld_clean = float(logits[0][answer] - logits[0][distractor])
    got = P.patched_differences(model, s.clean, s.corrupted, np.array([0, 0, 0, 0]), np.array([1, 1, 0, 0]),
                                np.array([last, -1, last, -1]), s.measure)
    assert got == pytest.approx([ld_corrupted, ld_corrupted, ld_clean, ld_clean], abs=1e-4)


def test_attribution_patching_is_the_derivative_along_each_patch(decoder):
    """Its estimate is d LD / d t of the corrupted run with ``z + t (z_clean - z)`` put in at t = 0, over
    ``LD_clean - LD_corrupted``: checked by central differences, in float64, of the forward pass that the
    tests above hold equal to transformers'."""
    family, ours, theirs, hf, tok = decoder
    clean = run_hf(hf, tok, CLEAN)
    answer, distractor = clean["logits"][-1].topk(2).indices.tolist()
    exact64 = load_model(theirs.folder, backend="scratch")
    exact64.stack.double()
    estimate = patch_heads(exact64, CLEAN, CORRUPTED, answer, distractor, per_position=True, method="attribution")
    assert estimate.attrs["method"] == "attribution"
    span = estimate.attrs["ld_clean"] - estimate.attrs["ld_corrupted"]
    stack = exact64.stack
    ids = [torch.tensor([tok(t)["input_ids"]], device=exact64.device) for t in (CLEAN, CORRUPTED)]
    toward = stack.unembedding_rows(torch.tensor([answer])) - stack.unembedding_rows(torch.tensor([distractor]))
    zs = []
    with torch.inference_mode():
        for x in ids:
            caught = {}
            stack.run_layers(stack.embed(x), need_weights=False,
                             edits=Edits({("z", i): (lambda z, i=i: caught.setdefault(i, z.clone())) for i in range(2)}))
            zs.append(caught)

    def ld(layer, head, position, t):
        def put(z):
            z = z.clone()
            z[0, head, position] += t * (zs[0][layer][0, head, position] - zs[1][layer][0, head, position])
            return z

        with torch.inference_mode():
            x, _ = stack.run_layers(stack.embed(ids[1]), need_weights=False, edits=Edits({("z", layer): put}))
            return float(stack.finish(x[0, -1]) @ toward[0])

    eps = 1e-5
    checked = 0
    for layer, head, position in [(0, 0, 17), (0, 1, 18), (0, 3, 20), (1, 0, 20), (1, 2, 20), (0, 2, 19)]:
        slope = (ld(layer, head, position, eps) - ld(layer, head, position, -eps)) / (2 * eps) / span
        got = estimate.query("layer == @layer and head == @head and position == @position")["recovered"].item()
        assert got == pytest.approx(slope, rel=1e-5, abs=1e-9)
        checked += abs(slope) > 1e-3
    assert checked >= 2  # some of these patches move the answer, so the comparison means something
    summed = patch_heads(ours, CLEAN, CORRUPTED, answer, distractor, method="attribution")
    per_position = patch_heads(ours, CLEAN, CORRUPTED, answer, distractor, method="attribution", per_position=True)
    np.testing.assert_allclose(summed["recovered"], grid(per_position, "recovered", 2, 4).reshape(-1), atol=1e-9)
    assert not any(p.grad is not None for p in ours.stack.parameters())  # the shared model is left as it was


def test_what_cannot_be_patched_gets_a_sentence(decoder, hf_model, tiny):
    family, ours, theirs, hf, tok = decoder
    with pytest.raises(HeadLensError, match=r"clean prompt has 21, the corrupted one 6"):
        patch_heads(ours, CLEAN, "The dog sat", 5, 6)
    with pytest.raises(HeadLensError, match=r"is \d+ tokens to this tokenizer \('.*'\)"):
        answer_token(ours, " coffee or tea")
    with pytest.raises(HeadLensError, match="not in the vocabulary"):
        answer_token(ours, 10**6)
    with pytest.raises(HeadLensError, match="same token"):
        patch_heads(ours, CLEAN, CORRUPTED, 5, 5)
    with pytest.raises(HeadLensError, match="nothing for a patch to recover"):
        patch_heads(ours, CLEAN, CLEAN, 5, 6)
    with pytest.raises(HeadLensError, match="Unknown patching method"):
        patch_heads(ours, CLEAN, CORRUPTED, 5, 6, method="fast")
    with pytest.raises(HeadLensError, match="give a distractor text beside the answer"):
        logit_attribution(hf_model, "Which do you like better, coffee or tea?", "tea")
    with pytest.raises(HeadLensError, match="On an encoder the answer is a text"):
        patch_heads(hf_model, "Which do you like better, coffee or tea?", "Which do you like better, coffee or juice?",
                    5, "juice")
    with pytest.raises(HeadLensError, match="the from-scratch engine, which does not implement"):
        logit_attribution(load_model(tiny("bloom")), "Hello world", 5)


def test_smollm2_does_the_indirect_object_task_through_its_name_movers(smollm2):
    pair = PAIRS["Indirect object: Mary and John"]
    assert answer_token(smollm2, pair.answer) == smollm2.tokenizer.convert_tokens_to_ids("ĠMary")
    attribution = logit_attribution(smollm2, pair.clean, pair.answer, pair.distractor)
    assert attribution.attrs["logit_diff"] == pytest.approx(6.12, abs=0.01)
    assert parts_total(attribution) == pytest.approx(attribution.attrs["logit_diff"], abs=1e-3)
    heads = patch_heads(smollm2, pair.clean, pair.corrupted, pair.answer, pair.distractor)
    assert heads.attrs["ld_corrupted"] == pytest.approx(-5.49, abs=0.01)
    best = heads.loc[heads["recovered"].idxmax()]
    assert (best["layer"], best["head"]) == (23, 3) and best["recovered"] == pytest.approx(0.58, abs=0.01)
    top = attribution.loc[attribution["attribution"].idxmax()]
    assert (top["layer"], top["head"]) == (23, 3)  # the head that writes the answer most is the one patching finds
