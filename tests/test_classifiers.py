"""Sequence classifiers, the proof that a kind of model is one readout: tiny random ``BertForSequenceClassification``,
``RobertaForSequenceClassification``, ``DistilBertForSequenceClassification`` and ``GPT2ForSequenceClassification`` (a
decoder's, which computes in float64 throughout) saved in float64, opened on the from-scratch engine, read as the difference of two classes' logits named by their
``id2label``, and held against transformers' own model run with hooks on each layer's attention output projection."""
import functools

import numpy as np
import pytest
import torch
import transformers as tf

from analysis.effects import logit_attribution, parts_total, patch_heads, patch_residual
from analysis.effects.readouts import readout_for
from analysis.tasks.effects import run_task
from analysis.tasks.build import from_rows
from models import HeadLensError, load_model
from models.corpus import CORPUS
from tests.conftest import _bpe_vocab, decode, figures, title_text
from tests.hooked import every_edge_or_none, saved_perturbed, z_hooked

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, initializer_range=0.2)
FAMILIES = {  # model_type: (config, model, sizes, its layers, layer i's attention output projection)
    "bert": (tf.BertConfig, tf.BertForSequenceClassification, dict(max_position_embeddings=64, **SIZES),
             lambda hf: hf.bert.encoder.layer, lambda layer: layer.attention.output.dense),
    "roberta": (tf.RobertaConfig, tf.RobertaForSequenceClassification,
                dict(max_position_embeddings=66, pad_token_id=1, bos_token_id=0, eos_token_id=2, **SIZES),
                lambda hf: hf.roberta.encoder.layer, lambda layer: layer.attention.output.dense),
    "distilbert": (tf.DistilBertConfig, tf.DistilBertForSequenceClassification,
                   dict(dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=64, pad_token_id=0,
                        initializer_range=0.2),
                   lambda hf: hf.distilbert.transformer.layer, lambda layer: layer.attention.out_lin),
    "gpt2": (tf.GPT2Config, tf.GPT2ForSequenceClassification,
             dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=37, initializer_range=0.3, bos_token_id=0,
                  eos_token_id=2, pad_token_id=1),
             lambda hf: hf.transformer.h, lambda layer: layer.attn.c_proj),
}
CLEAN = "Which do you like better, coffee or tea?"
SWAPS = ("juice", "water", "milk", "the", "a")  # the first as many tokens as "coffee" to a tokenizer is its corruption
H = 4
CORPUS_PART = list(dict.fromkeys(CORPUS))[:40]  # enough sentences for Head roles and the explanations' halves


def build(name: str, folder, minilm_dir):
    """(ours in float64, transformers' classifier in float64, tokenizer) of a tiny random ``name`` classifier with
    three labels, saved in ``folder``."""
    config_class, model_class, sizes, *_ = FAMILIES[name]
    if name == "bert" or name == "distilbert":
        tok = tf.AutoTokenizer.from_pretrained(minilm_dir)
        size = tok.vocab_size
    else:
        vocab, merges = _bpe_vocab()
        tok = (tf.RobertaTokenizerFast(vocab=vocab, merges=merges) if name == "roberta" else
               tf.GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                    pad_token="<pad>"))
        size = len(vocab)
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    hf = model_class(config_class(vocab_size=size, num_labels=3, id2label=LABELS,
                                  label2id={v: k for k, v in LABELS.items()}, **sizes)).eval()
    theirs = saved_perturbed(hf, folder, model_class)
    ours = load_model(folder, backend="scratch")
    ours.stack.double()
    return ours, theirs, tf.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def built(tmp_path_factory, minilm_dir):
    """``built(name)``: each family's classifier, built once."""
    return functools.cache(lambda name: build(name, tmp_path_factory.mktemp(f"classifier-{name}"), minilm_dir))


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, built):
    """(name, ours in float64, transformers' classifier in float64, tokenizer)."""
    return (request.param, *built(request.param))


def theirs_metric(name, theirs, ids, a: int, d: int, patches=(), taps=None):
    """transformers' ``logit(a) - logit(d)`` of each row of ``ids``, with ``patches`` (row, layer, head, z) put into
    the output projection's input; ``taps``: a list given a zero added to each layer's z, for its gradient. Returns
    the metric and each layer's z."""
    _, _, _, layers_of, out_proj = FAMILIES[name]
    logits, zs = z_hooked(lambda: theirs(input_ids=ids).logits, layers_of(theirs), out_proj, H, patches, taps)
    return logits[:, a] - logits[:, d], zs


def corrupted(tok) -> str:
    """``CLEAN`` with "coffee" swapped for a word of as many tokens."""
    n = len(tok(CLEAN)["input_ids"])
    return next(t for t in (CLEAN.replace("coffee", w) for w in SWAPS) if len(tok(t)["input_ids"]) == n)


def _ids(tok):
    return [tok(t, return_tensors="pt")["input_ids"] for t in (CLEAN, corrupted(tok))]


def test_a_classifiers_logits_and_labels_are_transformers(family):
    name, ours, theirs, tok = family
    stack = ours.stack
    assert stack.readouts == ("class_label",) and stack.prediction_head.labels == ("negative", "neutral", "positive")
    ids = _ids(tok)[0]
    with torch.inference_mode():
        want = theirs(input_ids=ids).logits
        x, _ = stack.run_layers(stack.embed(ids), need_weights=False)
        got = stack.prediction_head.logits(stack.finish(x))
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-10)
    assert float(want.std()) > 1e-3  # three classes the model tells apart


def test_every_head_patched_and_attribution_patched_equals_transformers_hooks(family):
    name, ours, theirs, tok = family
    (clean, bad), (a, d) = _ids(tok), (2, 0)
    m_clean, clean_z = theirs_metric(name, theirs, clean, a, d)
    m_bad, _ = theirs_metric(name, theirs, bad, a, d)
    rows = [(layer * H + h, layer, h, clean_z[layer][0]) for layer in range(2) for h in range(H)]
    patched, _ = theirs_metric(name, theirs, bad.repeat(2 * H, 1), a, d, rows)
    span = float(m_clean - m_bad)
    want = ((patched.detach().numpy() - float(m_bad)) / span).reshape(2, H)
    frame = patch_heads(ours, CLEAN, corrupted(tok), "positive", "negative")
    assert frame.attrs["metric"] == "class_logit_diff"
    assert (frame.attrs["answer"], frame.attrs["distractor"]) == ("positive", "negative")
    assert frame.attrs["ld_clean"] == pytest.approx(float(m_clean), abs=1e-10)
    assert frame.attrs["ld_corrupted"] == pytest.approx(float(m_bad), abs=1e-10)
    np.testing.assert_allclose(frame["recovered"].to_numpy().reshape(2, H), want, atol=1e-8)
    assert np.abs(want).max() > 0.02
    taps = []
    m, bad_z = theirs_metric(name, theirs, bad, a, d, taps=taps)
    grads = torch.autograd.grad(m.sum(), taps)
    Dh = clean_z[0].shape[-1] // H
    want = np.array([[float(((clean_z[layer] - bad_z[layer]) * grads[layer])[..., h * Dh:(h + 1) * Dh].sum())
                      for h in range(H)] for layer in range(2)]) / span
    got = patch_heads(ours, CLEAN, corrupted(tok), 2, 0, method="attribution")["recovered"].to_numpy().reshape(2, H)
    np.testing.assert_allclose(got, want, atol=1e-8)


def test_a_label_not_in_id2label_gets_a_sentence_naming_the_labels(built):
    ours, _, tok = built("bert")
    with pytest.raises(HeadLensError, match="^The answer 'happy' is not one of this classifier's labels: 'negative', "
                                            "'neutral', 'positive'"):
        patch_heads(ours, CLEAN, corrupted(tok), "happy", "negative")
    with pytest.raises(HeadLensError, match="the same label"):
        patch_heads(ours, CLEAN, corrupted(tok), "positive", 2)
    with pytest.raises(HeadLensError, match="^The distractor 3 is not one of"):  # an index past the last class
        patch_heads(ours, CLEAN, corrupted(tok), 2, 3)
    assert patch_heads(ours, CLEAN, corrupted(tok), 2, 0).attrs["distractor"] == "negative"  # an index is a class


def test_a_classifiers_task_takes_labelled_pairs_and_says_so_for_any_other(built):
    """A built-in task is the founding sentence's foci read as the classifier's last class against its first, each
    prompt's metric transformers' own logit difference; a next-token task gets a sentence naming the classifier's
    tasks; a CSV row giving one label twice is named."""
    from analysis.tasks import make_task

    ours, theirs, tok = built("bert")
    task = make_task(ours, "objects", 4)
    assert task.metric == "class_logit_diff" and {(p.answer, p.distractor, p.probes) for p in task.pairs} == {(2, 0, ())}
    found = run_task(ours, task, "class_logit_diff")
    for k, p in enumerate(task.pairs):
        for prompt, ids in ((found.clean, p.clean_ids), (found.corrupted, p.corrupted_ids)):
            want, _ = theirs_metric("bert", theirs, torch.tensor([ids]), 2, 0)
            assert prompt[k] == pytest.approx(float(want[0]), abs=1e-6)
    with pytest.raises(HeadLensError, match=r"^'ioi' is not a task for .*, whose prediction is read as the class logit "
                                            r"difference: choose one of objects, relation, sentence_type, sentiment, "
                                            r"or give your own pairs\.$"):
        make_task(ours, "ioi", 4)
    rows = [{"clean": CLEAN, "corrupted": corrupted(tok), "answer": "neutral", "distractor": "negative"},
            {"clean": CLEAN, "corrupted": corrupted(tok), "answer": "neutral", "distractor": "neutral"},
            {"clean": CLEAN, "corrupted": corrupted(tok), "answer": "neutral", "distractor": 7}]
    task = from_rows(ours, rows)
    assert [(p.answer, p.distractor) for p in task.pairs] == [(1, 0)]
    assert task.problems == ("Row 3: its answer and distractor are the same label; give two different ones.",
                             "Row 4: its distractor 7 is not one of this classifier's labels: 'negative', 'neutral', "
                             "'positive'.")


@pytest.mark.parametrize("name", ["bert", "roberta", "distilbert"])
def test_a_pooled_head_has_no_direct_parts_and_says_why(built, name):
    ours = built(name)[0]  # noqa: F841
    with pytest.raises(HeadLensError, match="not linear"):
        logit_attribution(ours, CLEAN, "positive", "negative")
    assert "not linear" in readout_for(ours, CLEAN).not_linear


def test_a_decoders_score_splits_into_each_heads_direct_part_through_its_final_norm(built):
    """GPT-2's score is linear in its last token's final hidden state: each head's part is its write at the last
    token (transformers' c_proj of that head's z alone) through the final LayerNorm, its scale frozen at the run's,
    along ``score[positive] - score[negative]``; the parts add up to the class logit difference."""
    ours, theirs, tok = built("gpt2")
    ids = _ids(tok)[0]
    caught = []
    hook = theirs.transformer.ln_f.register_forward_pre_hook(lambda m, args: caught.append(args[0].detach()))
    try:
        with torch.no_grad():
            value, zs = theirs_metric("gpt2", theirs, ids, 2, 0)
    finally:
        hook.remove()
    norm, last = theirs.transformer.ln_f, caught[0][0, -1]
    scale = norm.weight / torch.sqrt(last.var(unbiased=False) + norm.eps)
    toward = theirs.score.weight[2] - theirs.score.weight[0]
    Dh = zs[0].shape[-1] // H
    want = np.zeros((2, H))
    with torch.no_grad():
        for layer, z in enumerate(zs):
            w = theirs.transformer.h[layer].attn.c_proj.weight                   # Conv1D: (in, out)
            for h in range(H):
                write = z[0, -1, h * Dh:(h + 1) * Dh] @ w[h * Dh:(h + 1) * Dh]
                want[layer, h] = float(((write - write.mean()) * scale) @ toward)
    frame = logit_attribution(ours, CLEAN, "positive", "negative")
    np.testing.assert_allclose(frame["attribution"].to_numpy().reshape(2, H), want, atol=1e-10)
    assert frame.attrs["logit_diff"] == pytest.approx(float(value), abs=1e-10)
    assert parts_total(frame) == pytest.approx(float(value), abs=1e-10)
    assert np.abs(want).max() > 1e-2


def test_a_csv_of_labelled_pairs_is_a_task_whose_table_is_its_pairs_patched_one_at_a_time(built):
    ours, _, tok = built("gpt2")
    bad = corrupted(tok)
    rows = [{"clean": CLEAN, "corrupted": bad, "answer": "positive", "distractor": "negative"},
            {"clean": CLEAN.replace("better", "more"), "corrupted": bad.replace("better", "more"),
             "answer": "neutral", "distractor": "positive"},
            {"clean": CLEAN, "corrupted": bad, "answer": "glad", "distractor": "negative"}]
    task = from_rows(ours, rows)
    assert task.metric == "class_logit_diff" and len(task) == 2
    assert task.problems == ("Row 4: its answer 'glad' is not one of this classifier's labels: 'negative', "
                             "'neutral', 'positive'.",)
    effects = run_task(ours, task, residual=False)
    for k, (answer, distractor) in enumerate([("positive", "negative"), ("neutral", "positive")]):
        pair = task.pairs[k]
        one = patch_heads(ours, pair.clean, pair.corrupted, answer, distractor)
        np.testing.assert_allclose(effects.recovered("heads")[k], one["recovered"].to_numpy().reshape(2, H),
                                   atol=1e-8)
        direct = logit_attribution(ours, pair.clean, answer, distractor)["attribution"].to_numpy().reshape(2, H)
        np.testing.assert_allclose(effects.attribution[k], direct, atol=1e-8)


def test_a_classifier_circuit_of_every_edge_or_none_is_transformers_clean_or_corrupted_run(family):
    name, ours, theirs, tok = family
    clean, bad = _ids(tok)
    with torch.no_grad():
        m_clean, _ = theirs_metric(name, theirs, clean, 2, 0)
        m_bad, _ = theirs_metric(name, theirs, bad, 2, 0)
    measure, _, _ = readout_for(ours, CLEAN).pair(clean[0].tolist(), "positive", "negative")
    every_edge_or_none(ours.stack, clean, bad, measure, m_clean, m_bad, "classes")


def test_effects_patches_a_typed_pair_of_two_labels(new_app, built, tmp_path_factory, minilm_dir):
    """The Effects page on a BERT classifier opened as a custom model: the answer and distractor are picked among
    its labels, the patching grid is ``patch_heads``'s, and the attribution grid gives way to the head's sentence."""
    folder = tmp_path_factory.mktemp("classifier-page")
    tok = build("bert", folder, minilm_dir)[2]
    ours, bad = load_model(folder, backend="scratch"), corrupted(tok)  # in float32, as the page opens it
    at = new_app({"model": "custom", "custom_model": str(folder), "effects_source": "own", "effects_clean": CLEAN,
                  "effects_corrupted": bad, "effects_label_answer": "positive",
                  "effects_label_distractor": "negative"}, page="app_pages/effects.py")
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("logit(“positive”) − logit(“negative”) of the classes" in c.value.replace("\\", "")
               for c in at.caption)
    assert any("pooler" in c.value and "not linear" in c.value for c in at.caption)
    want = patch_heads(ours, CLEAN, bad, "positive", "negative")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Clean"] == f"{want.attrs['ld_clean']:+.2f}" and metrics["By the heads"] == "—"
    charts = figures(at)
    assert not any(title_text(c).startswith("Direct") for c in charts)
    grid = next(c for c in charts if "recovered" in title_text(c))["data"][0]["z"]
    np.testing.assert_allclose(decode(grid), want["recovered"].to_numpy().reshape(2, H), atol=1e-6)


def test_a_classifiers_card_patches_the_built_in_pairs_by_its_labels_and_the_atlas_reads_the_first(built):
    """A head's card on a pooled classifier: the founding sentence's pairs compare its last class with its first,
    each patched as ``patch_heads`` patches it, with no direct parts and no built-in task; the Atlas's effect size is
    the first pair's recovered share."""
    from analysis.cards.build import atlas, card_parts, head_card
    from analysis.defaults import ENCODER_PAIRS

    ours = built("bert")[0]
    parts = card_parts(ours, sentences=CORPUS_PART, importance=False)
    assert parts.task is None and list(parts.pairs) == list(ENCODER_PAIRS)
    for name, pair in ENCODER_PAIRS.items():
        attribution, patched = parts.pairs[name]
        want = patch_heads(ours, pair.clean, pair.corrupted, "positive", "negative")
        assert attribution is None
        np.testing.assert_allclose(patched["recovered"].to_numpy(), want["recovered"].to_numpy(), atol=1e-10)
    first = parts.pairs[next(iter(ENCODER_PAIRS))][1]
    np.testing.assert_allclose(atlas(parts)["effect"].to_numpy(), first["recovered"].to_numpy(), atol=1e-12)
    card = head_card(ours, 1, 2, parts=parts)
    assert card.pairs["attribution"].isna().all()
    assert card.pairs["recovered"].tolist() == [float(parts.pairs[n][1].query("layer == 1 and head == 2")["recovered"]
                                                      .iloc[0]) for n in ENCODER_PAIRS]


def test_effects_opens_a_classifier_on_its_built_in_pairs(new_app, built, tmp_path_factory, minilm_dir):
    """Effects' first view on a classifier: the first built-in pair read as its last class against its first."""
    from analysis.defaults import ENCODER_PAIRS

    folder = tmp_path_factory.mktemp("classifier-first")
    build("distilbert", folder, minilm_dir)
    at = new_app({"model": "custom", "custom_model": str(folder)}, page="app_pages/effects.py")
    assert not at.exception and not at.error, [e.value for e in at.error]
    pair = next(iter(ENCODER_PAIRS.values()))
    want = patch_heads(load_model(folder, backend="scratch"), pair.clean, pair.corrupted, "positive", "negative")
    grid = next(c for c in figures(at) if "recovered" in title_text(c))["data"][0]["z"]
    np.testing.assert_allclose(decode(grid), want["recovered"].to_numpy().reshape(2, H), atol=1e-6)


def llama_classifier(folder, tok=None):
    """(transformers' ``LlamaForSequenceClassification`` in float64, its tokenizer), tiny and random, three labels,
    saved in ``folder``; ``tok``: its tokenizer (a toy BPE one by default)."""
    if tok is None:
        vocab, merges = _bpe_vocab()
        tok = tf.GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=len(tok), num_labels=3, id2label=LABELS, num_key_value_heads=2, head_dim=8,
                            max_position_embeddings=64, bos_token_id=tok.bos_token_id or tok.cls_token_id,
                            eos_token_id=tok.eos_token_id or tok.sep_token_id, pad_token_id=tok.pad_token_id, **SIZES)
    return saved_perturbed(tf.LlamaForSequenceClassification(config).eval(), folder,
                           tf.LlamaForSequenceClassification), tok


def test_a_llama_classifier_opens_with_its_score_and_patches_as_transformers(tmp_path):
    """A ``LlamaForSequenceClassification`` folder, which holds no language-model head: its logits and every head
    patched agree with transformers' (whose RMSNorm runs in float32 inside a float64 model: ``test_families``'
    tolerance), and its readout has direct parts."""
    theirs, tok = llama_classifier(tmp_path)
    ours = load_model(tmp_path, backend="scratch")
    ours.stack.double()
    assert ours.stack.readouts == ("class_label",) and not ours.stack.language_model
    ids = tok(CLEAN, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        x, _ = ours.stack.run_layers(ours.stack.embed(ids), need_weights=False)
        np.testing.assert_allclose(ours.stack.prediction_head.logits(ours.stack.finish(x)).numpy(),
                                   theirs(input_ids=ids).logits.numpy(), atol=1e-5)
    bad = corrupted(tok)
    layers, out_proj = theirs.model.layers, (lambda layer: layer.self_attn.o_proj)
    run = lambda rows, patches=(): z_hooked(lambda: theirs(input_ids=rows).logits, layers, out_proj, H, patches)  # noqa: E731
    clean_logits, clean_z = run(ids)
    bad_ids = tok(bad, return_tensors="pt")["input_ids"]
    bad_logits, _ = run(bad_ids)
    patches = [(layer * H + h, layer, h, clean_z[layer][0]) for layer in range(2) for h in range(H)]
    patched, _ = run(bad_ids.repeat(2 * H, 1), patches)
    m = lambda logits: (logits[:, 2] - logits[:, 0]).detach().numpy()  # noqa: E731
    want = ((m(patched) - m(bad_logits)) / (m(clean_logits) - m(bad_logits))).reshape(2, H)
    got = patch_heads(ours, CLEAN, bad, "positive", "negative")["recovered"].to_numpy().reshape(2, H)
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert np.abs(want).max() > 0.02
    assert readout_for(ours, CLEAN).not_linear is None
    # pruned, it holds no language-model head still, and its classes are transformers' with those heads silenced
    heads = [(0, 1), (1, 3)]
    stack = ours.pruned(heads).stack
    assert "lm_head" not in stack._modules and stack.prediction_head is ours.stack.prediction_head
    silenced, _ = run(ids, [(0, layer, h, torch.zeros(ids.shape[1], 32, dtype=torch.float64)) for layer, h in heads])
    with torch.inference_mode():
        x, _ = stack.run_layers(stack.embed(ids), need_weights=False)
        np.testing.assert_allclose(stack.prediction_head.logits(stack.finish(x)).numpy(), silenced.detach().numpy(),
                                   atol=1e-5)


def test_the_residual_stream_attribution_patched_is_transformers_gradient_times_the_difference(built):
    """Attribution patching of the residual stream entering each layer, at each position: transformers' gradient of
    the class logit difference by that layer's input on the corrupted prompt, times the clean input less the
    corrupted one, over the clean difference."""
    ours, theirs, tok = built("gpt2")
    clean, bad = _ids(tok)

    def layer_inputs(ids, taps=None):
        seen = []

        def pre(m, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            if taps is not None:
                taps.append(torch.zeros_like(x, requires_grad=True))
                x = x + taps[-1]
            seen.append(x.detach())
            return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

        handles = [block.register_forward_pre_hook(pre, with_kwargs=True) for block in theirs.transformer.h]
        try:
            with torch.set_grad_enabled(taps is not None):
                logits = theirs(input_ids=ids).logits
        finally:
            for h in handles:
                h.remove()
        return logits[:, 2] - logits[:, 0], seen

    m_clean, x_clean = layer_inputs(clean)
    taps = []
    m_bad, x_bad = layer_inputs(bad, taps)
    grads = torch.autograd.grad(m_bad.sum(), taps)
    want = np.stack([((x_clean[i] - x_bad[i]) * grads[i]).sum(-1)[0].detach().numpy() for i in range(2)])
    want /= float((m_clean - m_bad).detach())
    frame = patch_residual(ours, CLEAN, corrupted(tok), "positive", "negative", method="attribution")
    np.testing.assert_allclose(frame.pivot(index="layer", columns="position", values="recovered").to_numpy(), want,
                               atol=1e-8)
    assert np.abs(want).max() > 1e-3


def test_a_prompt_traced_on_another_model_gets_a_sentence(built):
    from analysis.effects.traced import traced

    gpt2, _, tok = built("gpt2")
    prompt = traced(gpt2, CLEAN)
    with pytest.raises(HeadLensError, match="was traced on"):
        patch_heads(built("bert")[0], prompt, CLEAN, "positive", "negative")
    assert patch_heads(gpt2, prompt, corrupted(tok), "positive", "negative").attrs["metric"] == "class_logit_diff"


def test_a_decoder_classifiers_card_leaves_out_the_pairs_its_tokenizer_splits_unevenly(built):
    """A decoder's classifier (GPT-2's score at the last token) is a card's to patch as a pooled one is; a built-in
    pair its tokenizer splits unevenly (every one, on this toy tokenizer) is left out with the patching's sentence,
    and the card is built without it."""
    from analysis.cards.build import card_parts, head_card
    from analysis.defaults import ENCODER_PAIRS

    ours, _, tok = built("gpt2")
    uneven = {n for n, p in ENCODER_PAIRS.items() if len(tok(p.clean)["input_ids"]) != len(tok(p.corrupted)["input_ids"])}
    parts = card_parts(ours, sentences=CORPUS_PART, importance=False)
    assert uneven and set(parts.left_out) == uneven and set(parts.pairs) == set(ENCODER_PAIRS) - uneven
    assert all("as many tokens" in why for why in parts.left_out.values())
    card = head_card(ours, 1, 2, parts=parts)
    assert card.left_out == parts.left_out and card.role
    # its causal mask offers the head detector, whose repeated sequences this toy tokenizer cannot write: said why
    assert card.detector is None and card.detector_why.startswith("The tokenizer has 3 whole-word tokens")


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_a_pruned_classifier_is_transformers_with_those_heads_silenced(built, name):
    """A classifier pruned of two heads (an encoder's, and a decoder's whose files hold no language-model head): its
    class logits are transformers' classifier's with those heads' outputs zeroed, it keeps the classifier's own
    prediction head, and it gains no part the stack's files did not hold."""
    ours, theirs, tok = built(name)
    heads = [(0, 1), (1, 3)]
    stack = ours.pruned(heads).stack
    ids = tok(CLEAN, return_tensors="pt")["input_ids"]
    zero = torch.zeros(ids.shape[1], ours.stack.hidden_size, dtype=torch.float64)
    _, _, _, layers_of, out_proj = FAMILIES[name]
    want, _ = z_hooked(lambda: theirs(input_ids=ids).logits, layers_of(theirs), out_proj, H,
                       [(0, layer, head, zero) for layer, head in heads])
    with torch.inference_mode():
        x, _ = stack.run_layers(stack.embed(ids), need_weights=False)
        got = stack.prediction_head.logits(stack.finish(x))
        full = ours.stack.prediction_head.logits(ours.stack.finish(ours.stack.run_layers(ours.stack.embed(ids))[0]))
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), atol=1e-10)
    assert np.abs(got.numpy() - full.numpy()).max() > 1e-4  # the two heads matter to the classes
    assert stack.prediction_head is ours.stack.prediction_head and stack.readouts == ("class_label",)
    assert set(stack._modules) == set(ours.stack._modules)


def test_a_llama_classifiers_effects_offers_its_label_pairs_and_its_tasks(new_app, tmp_path, minilm_dir):
    """Effects on a Llama sequence classifier (causal, no language-model head), opened as a custom model: its
    built-in pairs are the founding sentence's foci read as its last class against its first, patched as
    ``patch_heads`` patches them; its own pair picks two of its labels; its tasks are the foci's, read by its labels,
    their clean metric transformers' own; a next-token task gets a sentence."""
    from analysis.defaults import ENCODER_PAIRS
    from analysis.tasks import make_task

    theirs, _ = llama_classifier(tmp_path, tf.AutoTokenizer.from_pretrained(minilm_dir))  # its pairs split evenly
    ours = load_model(tmp_path, backend="scratch")  # in float32, as the page opens it
    assert ours.stack.offers == {"detector"}  # a causal mask; no vocabulary, no sentence embedding
    at = new_app({"model": "custom", "custom_model": str(tmp_path)}, page="app_pages/effects.py")
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="effects_pair").options == list(ENCODER_PAIRS)
    assert any("logit(“positive”) − logit(“negative”) of the classes" in c.value.replace("\\", "")
               for c in at.caption)
    pair = next(iter(ENCODER_PAIRS.values()))
    want = patch_heads(ours, pair.clean, pair.corrupted, "positive", "negative")
    grid = next(c for c in figures(at) if "recovered" in title_text(c))["data"][0]["z"]
    np.testing.assert_allclose(decode(grid), want["recovered"].to_numpy().reshape(2, H), atol=1e-5)

    at.segmented_control(key="effects_source").set_value("own").run(timeout=300)
    assert at.selectbox(key="effects_label_answer").options == ["negative", "neutral", "positive"]
    assert at.selectbox(key="effects_label_answer").value == "positive"
    assert at.selectbox(key="effects_label_distractor").value == "negative"

    at.segmented_control(key="effects_source").set_value("builtin").run(timeout=300)
    at.segmented_control(key="effects_scope").set_value("task").run(timeout=300)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="task").options == ["Objects: coffee or tea → coffee or juice", "Relation: like → hate",
                                                "Sentence type: a question → a statement",
                                                "Sentiment: better → worse", "Your pairs (a CSV file)"]
    task = make_task(ours, at.selectbox(key="task").value, at.select_slider(key="task_pairs").value)
    with torch.no_grad():  # transformers' own class logits of each clean prompt, its last class against its first
        clean = np.array([float((lambda lg: lg[0, 2] - lg[0, 0])(theirs(input_ids=torch.tensor([p.clean_ids])).logits))
                          for p in task.pairs])
    assert {m.label: m.value for m in at.metric}["Clean"] == f"{clean.mean():+.3f}"
    with pytest.raises(HeadLensError, match="^'ioi' is not a task for .*class logit difference: choose one of objects"):
        make_task(ours, "ioi", 4)
