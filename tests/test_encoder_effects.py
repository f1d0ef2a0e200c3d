"""Patching, attribution patching and direct attribution on encoders, the sentence-embedding metric
``cos(e, answer) - cos(e, distractor)``, against transformers' own modules run with hooks: the bundled MiniLM on
pairs of each of the four foci, and tiny random BERT, RoBERTa and DistilBERT models in float64."""
import itertools

import numpy as np
import pytest
import torch
import transformers as tf

from analysis.effects import logit_attribution, parts_total, patch_heads, patch_residual
from analysis.tasks.effects import run_task, table
from analysis.tasks.focus import ENCODER_TASKS
from analysis.tasks.build import from_rows, make_task
from models import HeadLensError, load_model
from tests.conftest import _bpe_vocab
from tests.hooked import saved_perturbed

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
ENCODERS = {  # model_type: (config, model, sizes, its layers, layer i's attention output projection, its two norms)
    "bert": (tf.BertConfig, tf.BertModel, dict(max_position_embeddings=64, **SIZES),
             lambda hf: hf.encoder.layer, lambda layer: layer.attention.output.dense,
             lambda layer: (layer.attention.output.LayerNorm, layer.output.LayerNorm)),
    "roberta": (tf.RobertaConfig, tf.RobertaModel,
                dict(max_position_embeddings=66, pad_token_id=1, bos_token_id=0, eos_token_id=2, **SIZES),
                lambda hf: hf.encoder.layer, lambda layer: layer.attention.output.dense,
                lambda layer: (layer.attention.output.LayerNorm, layer.output.LayerNorm)),
    "distilbert": (tf.DistilBertConfig, tf.DistilBertModel,
                   dict(dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=64, pad_token_id=0),
                   lambda hf: hf.transformer.layer, lambda layer: layer.attention.out_lin,
                   lambda layer: (layer.sa_layer_norm, layer.output_layer_norm)),
}
CLEAN, CORRUPTED = "Which do you like better, coffee or tea?", "Which do you like better, tea or coffee?"
PROBES = ("tea", "coffee")


class Hooked:
    """transformers' encoder run on ``ids`` with hooks: each layer's input and its output projection's input (every
    head's ``z``, ``(B, n, H * Dh)``), each norm's input; patches put clean values into chosen batch rows."""

    def __init__(self, name: str, hf):
        self.hf = hf
        _, _, _, self.layers_of, self.out_proj, self.norms = ENCODERS[name]
        self.H = hf.config.num_attention_heads if name != "distilbert" else hf.config.n_heads

    def run(self, ids, *, heads=(), resid=(), grad: bool = False):
        """``heads``: ``(row, layer, head, clean z (n, H*Dh))``; ``resid``: ``(row, layer, position, clean (E,))``.
        Returns (last hidden state, zs, layer inputs, norm inputs, taps on z when ``grad``)."""
        zs, inputs, norm_in, taps, handles = [], [], [], [], []
        for i, layer in enumerate(self.layers_of(self.hf)):
            def pre_layer(m, args, kwargs, i=i):
                key = next(k for k in ("hidden_states", "x") if k in kwargs) if not args else None
                x = (args[0] if args else kwargs[key]).clone()
                for row, at, p, value in resid:
                    if at == i:
                        x[row, p] = value
                inputs.append(x)
                return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, key: x})

            def pre_proj(m, args, i=i):
                z = args[0].clone()
                Dh = z.shape[-1] // self.H
                for row, at, h, clean in heads:
                    if at == i:
                        z[row, :, h * Dh:(h + 1) * Dh] = clean[:, h * Dh:(h + 1) * Dh]
                if grad:
                    taps.append(torch.zeros_like(z, requires_grad=True))
                    z = z + taps[-1]
                zs.append(z.detach())
                return (z,)

            handles.append(layer.register_forward_pre_hook(pre_layer, with_kwargs=True))
            handles.append(self.out_proj(layer).register_forward_pre_hook(pre_proj))
            for norm in self.norms(layer):
                handles.append(norm.register_forward_pre_hook(lambda m, args: norm_in.append((m, args[0].detach()))))
        try:
            with torch.set_grad_enabled(grad):
                out = self.hf(input_ids=ids).last_hidden_state
        finally:
            for h in handles:
                h.remove()
        return out, zs, inputs, norm_in, taps

    def embedding(self, text: str, tok) -> torch.Tensor:
        out, *_ = self.run(tok(text, return_tensors="pt")["input_ids"])
        e = out[0].mean(0)
        return e / e.norm()

    def along(self, tok, probes) -> torch.Tensor:
        return (self.embedding(probes[0], tok) - self.embedding(probes[1], tok)).detach()


def metric(hidden: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``(B,)``: the mean-pooled embedding's cosine with ``w``, as sentence-transformers pools."""
    e = hidden.mean(1)
    return (e @ w) / e.norm(dim=-1)


def every_head_patched(hooked: Hooked, tok, clean: str, corrupted: str, probes) -> tuple[np.ndarray, float, float]:
    """Every head's recovered share from one batched transformers run, row ``l * H + h`` patching head ``h`` of
    layer ``l``; and the clean and corrupted metrics."""
    w = hooked.along(tok, probes)
    ids = [tok(t, return_tensors="pt")["input_ids"] for t in (clean, corrupted)]
    out_clean, clean_z, *_ = hooked.run(ids[0])
    out_bad, *_ = hooked.run(ids[1])
    L, H = len(clean_z), hooked.H
    rows = [(layer * H + h, layer, h, clean_z[layer][0]) for layer in range(L) for h in range(H)]
    patched, *_ = hooked.run(ids[1].repeat(L * H, 1), heads=rows)
    m_clean, m_bad = float(metric(out_clean, w)), float(metric(out_bad, w))
    return ((metric(patched, w).numpy() - m_bad) / (m_clean - m_bad)).reshape(L, H), m_clean, m_bad


# --- the bundled MiniLM -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_hooked(minilm_dir):
    hf = tf.AutoModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    return Hooked("bert", hf), tf.AutoTokenizer.from_pretrained(minilm_dir)


def test_every_head_of_minilm_patched_equals_transformers_with_a_hook_on_each_output_projection(scratch_model,
                                                                                                minilm_hooked):
    hooked, tok = minilm_hooked
    pairs = [(CLEAN, "Which do you like better, coffee or juice?", ("tea", "juice"))]
    for name in ENCODER_TASKS:  # a pair of each focus: objects, relation, sentence type, sentiment
        pair = make_task(scratch_model, name, 1, seed=3).pairs[0]
        pairs.append((pair.clean, pair.corrupted, pair.probes))
    for clean, corrupted, probes in pairs:
        want, m_clean, m_bad = every_head_patched(hooked, tok, clean, corrupted, probes)
        frame = patch_heads(scratch_model, clean, corrupted, *probes)
        assert frame.attrs["ld_clean"] == pytest.approx(m_clean, abs=1e-5)
        assert frame.attrs["ld_corrupted"] == pytest.approx(m_bad, abs=1e-5)
        got = frame["recovered"].to_numpy().reshape(6, 12)
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=clean)  # within 1e-4 of the span
        assert np.abs(want).max() > 0.05


def test_minilm_on_the_transformers_engine_patches_as_transformers_hooks(hf_model, minilm_hooked):
    """The transformers engine (which patches on its from-scratch twin) against transformers' own run with hooks."""
    hooked, tok = minilm_hooked
    want, m_clean, m_bad = every_head_patched(hooked, tok, CLEAN, CORRUPTED, PROBES)
    frame = patch_heads(hf_model, CLEAN, CORRUPTED, *PROBES)
    assert frame.attrs["ld_clean"] == pytest.approx(m_clean, abs=1e-5)
    np.testing.assert_allclose(frame["recovered"].to_numpy().reshape(6, 12), want, atol=1e-4)
    assert np.abs(want).max() > 0.05


# --- tiny random BERT, RoBERTa and DistilBERT in float64 --------------------------------------------------------


@pytest.fixture(scope="module", params=list(ENCODERS))
def encoder(request, tmp_path_factory, minilm_dir):
    """(model_type, ours in float64, Hooked on transformers' float64 model, tokenizer)."""
    return tiny_encoder(request.param, tmp_path_factory.mktemp(f"encoder-effects-{request.param}"), minilm_dir)


def tiny_encoder(name: str, folder, minilm_dir):
    """A tiny random encoder of family ``name`` saved in ``folder``: (name, ours in float64, Hooked on transformers'
    float64 model, tokenizer)."""
    ours, theirs, tokenizer = saved_tiny(name, folder, minilm_dir)
    return name, ours, Hooked(name, theirs), tokenizer


def saved_tiny(name: str, folder, minilm_dir, model_class=None):
    """A tiny random model of family ``name`` (transformers' ``model_class``, its base model by default) saved in
    ``folder``: (ours in float64, transformers' in float64, tokenizer)."""
    config_class, base_class, sizes, *_ = ENCODERS[name]
    model_class = model_class or base_class
    torch.manual_seed(0)
    if name == "roberta":
        vocab, merges = _bpe_vocab()
        tf.RobertaTokenizerFast(vocab=vocab, merges=merges).save_pretrained(folder)
        size = len(vocab)
    else:
        wordpiece = tf.AutoTokenizer.from_pretrained(minilm_dir)
        wordpiece.save_pretrained(folder)
        size = wordpiece.vocab_size
    hf = model_class(config_class(vocab_size=size, initializer_range=0.2, **sizes)).eval()  # heads that matter
    theirs = saved_perturbed(hf, folder, model_class)
    ours = load_model(folder, backend="scratch")
    ours.stack.double()
    return ours, theirs, tf.AutoTokenizer.from_pretrained(folder)


def test_head_and_residual_patching_on_each_encoder_equal_transformers_hooks(encoder):
    name, ours, hooked, tok = encoder
    want, m_clean, m_bad = every_head_patched(hooked, tok, CLEAN, CORRUPTED, PROBES)
    frame = patch_heads(ours, CLEAN, CORRUPTED, *PROBES)
    assert frame.attrs["ld_clean"] == pytest.approx(m_clean, abs=1e-10)
    np.testing.assert_allclose(frame["recovered"].to_numpy().reshape(2, 4), want, atol=1e-8)
    assert np.abs(want).max() > 0.02

    w = hooked.along(tok, PROBES)
    ids = [tok(t, return_tensors="pt")["input_ids"] for t in (CLEAN, CORRUPTED)]
    n = ids[0].shape[1]
    _, _, clean_in, _, _ = hooked.run(ids[0])
    rows = [(layer * n + p, layer, p, clean_in[layer][0, p]) for layer in range(2) for p in range(n)]
    patched, *_ = hooked.run(ids[1].repeat(2 * n, 1), resid=rows)
    want = ((metric(patched, w).numpy() - m_bad) / (m_clean - m_bad)).reshape(2, n)
    got = patch_residual(ours, CLEAN, CORRUPTED, *PROBES)["recovered"].to_numpy().reshape(2, n)
    np.testing.assert_allclose(got, want, atol=1e-8)


def test_attribution_patching_on_each_encoder_is_the_gradient_through_transformers_modules(encoder):
    name, ours, hooked, tok = encoder
    w = hooked.along(tok, PROBES)
    ids = [tok(t, return_tensors="pt")["input_ids"] for t in (CLEAN, CORRUPTED)]
    out_clean, clean_z, *_ = hooked.run(ids[0])
    out_bad, bad_z, _, _, taps = hooked.run(ids[1], grad=True)
    grads = torch.autograd.grad(metric(out_bad, w).sum(), taps)
    span = float((metric(out_clean, w) - metric(out_bad, w)).detach())
    Dh = clean_z[0].shape[-1] // 4
    want = np.array([[float(((clean_z[layer] - bad_z[layer]) * grads[layer])[..., h * Dh:(h + 1) * Dh].sum())
                      for h in range(4)] for layer in range(2)]) / span
    got = patch_heads(ours, CLEAN, CORRUPTED, *PROBES, method="attribution")["recovered"].to_numpy().reshape(2, 4)
    np.testing.assert_allclose(got, want, atol=1e-8)
    assert np.abs(want).max() > 0.02


def test_direct_attribution_on_each_encoder_passes_transformers_norms_frozen_and_adds_up(encoder):
    """Each head's part: its slice of the output projection's input through that projection's columns, then every
    LayerNorm above it with its scale at the value transformers' run gave it (read by hooks), pooled and read along
    the probes; the parts add up to the metric."""
    name, ours, hooked, tok = encoder
    w = hooked.along(tok, PROBES)
    ids = tok(CLEAN, return_tensors="pt")["input_ids"]
    out, zs, _, norm_in, _ = hooked.run(ids)
    out = out.detach()
    e = out[0].mean(0)
    frame = logit_attribution(ours, CLEAN, *PROBES)
    assert frame.attrs["logit_diff"] == pytest.approx(float(e @ w / e.norm()), abs=1e-10)
    assert parts_total(frame) == pytest.approx(frame.attrs["logit_diff"], abs=1e-10)
    frozen = [norm.weight.detach() / torch.sqrt(x[0].var(-1, unbiased=False, keepdim=True) + norm.eps)
              for norm, x in norm_in]
    Dh = zs[0].shape[-1] // 4
    want = np.zeros((2, 4))
    for layer in range(2):
        proj = hooked.out_proj(hooked.layers_of(hooked.hf)[layer])
        for h in range(4):
            part = zs[layer][0, :, h * Dh:(h + 1) * Dh] @ proj.weight.detach()[:, h * Dh:(h + 1) * Dh].T     # (n, E)
            for scale in frozen[2 * layer:]:
                part = (part - part.mean(-1, keepdim=True)) * scale
            want[layer, h] = float(part.mean(0) @ w / e.norm())
    np.testing.assert_allclose(frame["attribution"].to_numpy().reshape(2, 4), want, atol=1e-10)
    assert np.abs(want).max() > 5e-3


# --- tasks --------------------------------------------------------------------------------------------------------


def test_an_encoders_tasks_have_forty_pairs_of_each_focus_read_by_its_tokenizer(scratch_model):
    for name in ENCODER_TASKS:
        task = make_task(scratch_model, name, 40)
        assert len(task) == 40 and task.metric == "embedding"
        for pair in task.pairs:
            ids = scratch_model.tokenize(pair.clean)["input_ids"]
            assert list(pair.clean_ids) == ids and len(pair.corrupted_ids) == len(ids)
            assert pair.probes[0] != pair.probes[1]
            focus = pair.role("FOCUS")
            assert pair.clean_ids[focus] != pair.corrupted_ids[focus]  # the focus word is the one changed
    with pytest.raises(HeadLensError, match="^'ioi' is not a task for .*, whose prediction is read as the embedding "
                                            "difference: choose one of objects, relation, sentence_type, sentiment"):
        make_task(scratch_model, "ioi", 10)


def test_an_encoder_task_table_matches_its_pairs_patched_one_at_a_time(scratch_model):
    task = make_task(scratch_model, "objects", 6, seed=1)
    effects = run_task(scratch_model, task, residual=False)
    frames = [patch_heads(scratch_model, p.clean, p.corrupted, *p.probes) for p in task.pairs]
    for k in (0, 5):
        np.testing.assert_allclose(effects.recovered("heads")[k], frames[k]["recovered"].to_numpy().reshape(6, 12),
                                   atol=1e-5)
    frame = table(effects)
    assert frame.attrs["metric"] == "embedding"
    # the table by hand from the pairs patched one at a time: the mean normalised over the set, the exact sign-flip
    # p-value over all 2^6 flips, Benjamini-Hochberg, and an interval within the pairs' own ratios
    spans = np.array([f.attrs["ld_clean"] - f.attrs["ld_corrupted"] for f in frames])
    effect = np.stack([f["recovered"].to_numpy() * s for f, s in zip(frames, spans)])     # (pairs, heads)
    np.testing.assert_allclose(frame["mean"], effect.sum(0) / spans.sum(), atol=1e-5)
    flips = np.array(list(itertools.product((1.0, -1.0), repeat=len(spans))))            # (64, pairs)
    null, seen = flips @ effect / len(spans), effect.mean(0)
    p = (np.abs(null) >= np.abs(seen) * (1 - 1e-9)).mean(0)
    np.testing.assert_allclose(frame["p"], p, atol=1e-12)
    order = np.argsort(p)
    q = np.minimum.accumulate((p[order] * len(p) / np.arange(1, len(p) + 1))[::-1])[::-1]
    np.testing.assert_allclose(frame["q"].to_numpy()[order], np.minimum(q, 1), atol=1e-12)
    ratios = effect / spans[:, None]
    assert (frame["low"] >= ratios.min(0) - 1e-9).all() and (frame["high"] <= ratios.max(0) + 1e-9).all()
    assert (frame["low"] <= frame["mean"] + 1e-9).all() and (frame["mean"] <= frame["high"] + 1e-9).all()
    assert (frame["high"] - frame["low"]).max() > 0.01 and p.min() < 0.05
    estimated = run_task(scratch_model, task, method="attribution", residual=False)
    np.testing.assert_allclose(estimated.clean, effects.clean, atol=1e-6)


def test_an_encoders_own_pairs_take_probe_texts_and_bad_rows_get_a_sentence(scratch_model):
    rows = [{"clean": CLEAN, "corrupted": "Which do you like better, coffee or milk?", "answer": "tea",
             "distractor": "milk"},
            {"clean": CLEAN, "corrupted": "Which do you like better, coffee or hot chocolate?", "answer": "tea",
             "distractor": "chocolate"},
            {"clean": CLEAN, "corrupted": CORRUPTED, "answer": "tea", "distractor": " "}]
    task = from_rows(scratch_model, rows)
    assert len(task) == 1 and task.pairs[0].probes == ("tea", "milk") and task.metric == "embedding"
    assert "Row 3" in task.problems[0] and "tokens" in task.problems[0]
    assert "Row 4" in task.problems[1] and "empty" in task.problems[1]
    with pytest.raises(HeadLensError, match="next-token logits"):
        run_task(scratch_model, task, "logit_diff")


@pytest.mark.parametrize("method", ["exact", "attribution"])
def test_an_analysis_makes_its_models_stack_once(scratch_model, monkeypatch, method):
    """``patch_heads``, ``patch_residual`` and ``logit_attribution`` turn the model into its stack where they enter
    and pass it down (traces, the readout's probe embeddings, the batched runs): one ``editable`` each."""
    import models.run as run

    from analysis.defaults import ENCODER_PAIRS

    made = []
    real = run.editable
    monkeypatch.setattr(run, "editable", lambda model, what="This": made.append(what) or real(model, what))
    pair = next(iter(ENCODER_PAIRS.values()))
    for analysis in (patch_heads, patch_residual):
        made.clear()
        frame = analysis(scratch_model, pair.clean, pair.corrupted, pair.answer, pair.distractor, method=method)
        assert len(made) == 1 and len(frame), (analysis.__name__, made)
    made.clear()
    logit_attribution(scratch_model, pair.clean, pair.answer, pair.distractor)
    assert len(made) == 1, made


def test_a_pairs_bad_distractor_and_an_encoders_missing_probe_are_named(scratch_model, tmp_path):
    """The readouts' sentences name what is wrong: a token pair's distractor past the vocabulary is "the
    distractor"'s (the base readout's reading); an encoder's CSV row with no answer text is refused as empty, not
    read as a text."""
    from analysis.effects.readouts import Readout
    from analysis.tasks.build import from_rows

    with pytest.raises(HeadLensError, match=r"^The distractor token id 10000000 is not in the vocabulary"):
        Readout(scratch_model).read([101, 102], 2017, 10_000_000)  # the base readout's tokens, as a decoder's
    rows = [{"clean": "I like coffee.", "corrupted": "I hate coffee.", "answer": None, "distractor": "I hate it."},
            {"clean": "I like coffee.", "corrupted": "I hate coffee.", "answer": "I like it.", "distractor": "I hate it."}]
    task = from_rows(scratch_model, rows)
    assert task.problems == ("Row 2: its answer or distractor is empty; on an encoder each is a text (a word or a "
                             "sentence) the sentence's embedding is compared with.",)
    assert [p.probes for p in task.pairs] == [("I like it.", "I hate it.")]
