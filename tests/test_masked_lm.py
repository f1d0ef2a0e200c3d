"""A masked-LM encoder's metric, the logit difference of two tokens at its ``[MASK]``: tiny random BERT, RoBERTa and
DistilBERT masked-LM models in float64, their heads patched and attributed against transformers' own
``...ForMaskedLM`` run with a hook on each layer's attention output projection, and its logits read to 1e-10."""
import numpy as np
import pytest
import torch
import transformers as tf

from analysis.circuits import graph as C
from analysis.effects import logit_attribution, patch_heads, patch_residual
from models import HeadLensError, load_model
from tests.conftest import decode, figures, title_text
from tests.hooked import every_edge_or_none, z_hooked
from tests.test_encoder_effects import saved_tiny

FAMILIES = {  # model_type: (transformers' masked-LM model, its layers, layer i's attention output projection)
    "bert": (tf.BertForMaskedLM, lambda hf: hf.bert.encoder.layer, lambda layer: layer.attention.output.dense),
    "roberta": (tf.RobertaForMaskedLM, lambda hf: hf.roberta.encoder.layer,
                lambda layer: layer.attention.output.dense),
    "distilbert": (tf.DistilBertForMaskedLM, lambda hf: hf.distilbert.transformer.layer,
                   lambda layer: layer.attention.out_lin),
}
WORDS = {"bert": ("tea", "juice"), "roberta": (" the", " you"), "distilbert": ("tea", "juice")}
SWAP = {"bert": "juice", "roberta": "water", "distilbert": "juice"}  # as many tokens as "coffee" to each tokenizer


@pytest.fixture(scope="module")
def built(tmp_path_factory, minilm_dir):
    """``built(name)``: (ours in float64, transformers' masked-LM model in float64, tokenizer), once per family."""
    done = {}

    def build(name: str):
        if name not in done:
            done[name] = saved_tiny(name, tmp_path_factory.mktemp(f"masked-{name}"), minilm_dir, FAMILIES[name][0])
        return done[name]

    return build


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, built):
    """(name, ours in float64, transformers' masked-LM model in float64, tokenizer)."""
    return (request.param, *built(request.param))


def prompts(tok, name: str) -> tuple[str, str]:
    m = tok.mask_token
    return f"Which do you like better, coffee or {m}?", f"Which do you like better, {SWAP[name]} or {m}?"


def _ids_and_tokens(tok, name):
    """The clean and corrupted ids, the mask's position, and the answer's and distractor's ids, by the tokenizer."""
    ids = [tok(t, return_tensors="pt")["input_ids"] for t in prompts(tok, name)]
    a, d = (tok(w, add_special_tokens=False)["input_ids"][0] for w in WORDS[name])
    return ids, ids[0][0].tolist().index(tok.mask_token_id), a, d


def test_the_masked_lm_head_is_read_with_the_encoder(family):
    name, ours, theirs, tok = family
    assert ours.stack.masked_lm
    ids = tok(prompts(tok, name)[0], return_tensors="pt")["input_ids"]
    want = theirs(input_ids=ids).logits
    with torch.inference_mode():
        x, _ = ours.stack.run_layers(ours.stack.embed(ids), need_weights=False)
        got = ours.stack.masked_logits(x)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), atol=1e-10)


def _theirs_metric(theirs, ids, mask, a, d, layers, out_proj, H, patches=(), taps=None):
    """transformers' logit difference at the mask, each row of ``ids`` with ``patches`` (row, layer, head, z) on
    the output projection's input; ``taps``: a list given a zero added to each layer's z, for its gradient."""
    logits, zs = z_hooked(lambda: theirs(input_ids=ids).logits[:, mask], layers, out_proj, H, patches, taps)
    return logits[:, a] - logits[:, d], zs


def test_heads_patched_and_attributed_at_the_mask_equal_transformers_hooks(family):
    name, ours, theirs, tok = family
    _, layers_of, out_proj = FAMILIES[name]
    layers, H = layers_of(theirs), 4
    clean, corrupted = prompts(tok, name)
    words = WORDS[name]
    ids, mask, a, d = _ids_and_tokens(tok, name)
    m_clean, clean_z = _theirs_metric(theirs, ids[0], mask, a, d, layers, out_proj, H)
    m_bad, _ = _theirs_metric(theirs, ids[1], mask, a, d, layers, out_proj, H)
    rows = [(layer * H + h, layer, h, clean_z[layer][0]) for layer in range(2) for h in range(H)]
    patched, _ = _theirs_metric(theirs, ids[1].repeat(2 * H, 1), mask, a, d, layers, out_proj, H, rows)
    span = float(m_clean - m_bad)
    want = ((patched.numpy() - float(m_bad)) / span).reshape(2, H)
    frame = patch_heads(ours, clean, corrupted, *words)
    assert frame.attrs["metric"] == "masked_logit_diff"
    assert frame.attrs["ld_clean"] == pytest.approx(float(m_clean), abs=1e-10)
    np.testing.assert_allclose(frame["recovered"].to_numpy().reshape(2, H), want, atol=1e-8)
    assert np.abs(want).max() > 0.02
    # attribution patching: the gradient taken through transformers' modules
    taps = []
    m, bad_z = _theirs_metric(theirs, ids[1], mask, a, d, layers, out_proj, H, taps=taps)
    grads = torch.autograd.grad(m.sum(), taps)
    Dh = clean_z[0].shape[-1] // H
    want = np.array([[float(((clean_z[layer] - bad_z[layer]) * grads[layer])[..., h * Dh:(h + 1) * Dh].sum())
                      for h in range(H)] for layer in range(2)]) / span
    got = patch_heads(ours, clean, corrupted, *words, method="attribution")["recovered"].to_numpy().reshape(2, H)
    np.testing.assert_allclose(got, want, atol=1e-8)
    # the residual stream entering the last layer patched at the mask: transformers' layer input set there
    caught = []
    hook = layers[1].register_forward_pre_hook(
        lambda m, args, kwargs: caught.append((args[0] if args else kwargs[next(k for k in kwargs if k in (
            "hidden_states", "x"))]).detach()), with_kwargs=True)
    try:
        theirs(input_ids=ids[0])
    finally:
        hook.remove()

    def put(m, args, kwargs):
        key = None if args else next(k for k in kwargs if k in ("hidden_states", "x"))
        x = (args[0] if args else kwargs[key]).clone()
        x[:, mask] = caught[0][0, mask]
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, key: x})
    hook = layers[1].register_forward_pre_hook(put, with_kwargs=True)
    try:
        with torch.no_grad():
            logits = theirs(input_ids=ids[1]).logits[0, mask]
    finally:
        hook.remove()
    resid = patch_residual(ours, clean, corrupted, *words)
    assert resid.query("layer == 1 and position == @mask")["recovered"].item() == \
        pytest.approx((float(logits[a] - logits[d]) - float(m_bad)) / span, abs=1e-8)


def test_what_a_masked_lm_metric_cannot_read_gets_a_sentence(family):
    name, ours, theirs, tok = family
    clean, corrupted = prompts(tok, name)
    words = WORDS[name]
    with pytest.raises(HeadLensError, match="not linear"):
        logit_attribution(ours, clean, *words)
    with pytest.raises(HeadLensError, match="2 .* tokens; the masked-LM metric reads the logits at one"):
        patch_heads(ours, clean.replace("coffee", tok.mask_token), corrupted.replace(SWAP[name], tok.mask_token),
                    *words)
    if name == "bert":
        with pytest.raises(HeadLensError, match="is 2 tokens"):
            patch_heads(ours, clean, corrupted, "tea", "hot chocolate")


def test_a_masked_lm_circuit_of_every_edge_or_none_is_transformers_clean_or_corrupted_run(family):
    name, ours, theirs, tok = family
    from analysis.effects.readouts import readout_for

    _, layers_of, out_proj = FAMILIES[name]
    (clean, corrupted), mask, a, d = _ids_and_tokens(tok, name)
    with torch.no_grad():
        m_clean, _ = _theirs_metric(theirs, clean, mask, a, d, layers_of(theirs), out_proj, 4)
        m_bad, _ = _theirs_metric(theirs, corrupted, mask, a, d, layers_of(theirs), out_proj, 4)
    measure, _, _ = readout_for(ours, tok.mask_token).pair(clean[0].tolist(), *WORDS[name])
    every_edge_or_none(ours.stack, clean, corrupted, measure, m_clean, m_bad, "embedding")


@pytest.fixture(scope="module", params=["bert", "roberta"])
def hooked_mlm(request, built):
    """A masked-LM BERT or RoBERTa (their layers name their parts alike): ours, transformers' model, its base model
    and its masked-LM head, the tokenizer."""
    name = request.param
    ours, theirs, tok = built(name)
    base, head = (theirs.bert, theirs.cls) if name == "bert" else (theirs.roberta, theirs.lm_head)
    return name, ours, base, head, tok


def test_a_masked_lms_eap_edges_are_transformers_gradients_through_its_frozen_norms(hooked_mlm):
    """Each edge's EAP score: the sender's change passed through transformers' own LayerNorms (scales frozen at the
    clean run), moved along at the receiver's input, times the gradient of the logit difference at the mask read
    off transformers' masked-LM head."""
    from analysis.effects.readouts import readout_for
    from tests.test_encoder_circuits import HFGraph

    name, ours, base, head, tok = hooked_mlm
    (clean, corrupted), mask, a, d = _ids_and_tokens(tok, name)
    stack = ours.stack
    measure, _, _ = readout_for(ours, tok.mask_token).pair(clean[0].tolist(), *WORDS[name])
    graph, rows = C.graph_of(stack), torch.zeros(1, dtype=torch.long)
    scores, _, _ = C.edge_attribution(stack, graph, clean, corrupted, measure, rows)
    hf = HFGraph(base, graph)

    def metric(last):
        logits = head(last)[:, mask]
        return logits[:, a] - logits[:, d]

    want = hf.eap(clean, corrupted, metric)
    np.testing.assert_allclose(scores.numpy(), want, atol=1e-8)
    assert np.abs(want).max() > 1e-2 and (np.abs(want) > 1e-5).sum() > 50  # edges that carry something


def test_a_csv_of_masked_pairs_is_a_task_whose_table_is_its_pairs_patched_one_at_a_time(family):
    """Rows whose clean prompt has the mask token take the masked logit difference; a row without one at the same
    place in the corrupted prompt, or with two, gets a sentence."""
    from analysis.tasks.effects import run_task
    from analysis.tasks.build import from_rows

    name, ours, theirs, tok = family
    clean, corrupted = prompts(tok, name)
    a, d = WORDS[name]
    m = tok.mask_token
    rows = [{"clean": clean, "corrupted": corrupted, "answer": a, "distractor": d},
            {"clean": clean.replace("better", "more"), "corrupted": corrupted.replace("better", "more"),
             "answer": d, "distractor": a},
            {"clean": clean, "corrupted": corrupted.replace(m, "tea"), "answer": a, "distractor": d},
            {"clean": clean.replace("coffee", m), "corrupted": corrupted, "answer": a, "distractor": d}]
    task = from_rows(ours, rows)
    assert task.metric == "masked_logit_diff" and len(task.problems) == 2
    assert "Row 4" in task.problems[0] and "same position" in task.problems[0]
    assert "Row 5" in task.problems[1] and "reads the logits at one" in task.problems[1]
    effects = run_task(ours, task, residual=False)
    for k, pair in enumerate(task.pairs):
        one = patch_heads(ours, pair.clean, pair.corrupted, tok.decode([pair.answer]), tok.decode([pair.distractor]))
        np.testing.assert_allclose(effects.recovered("heads")[k], one["recovered"].to_numpy().reshape(2, 4),
                                   atol=1e-8)
    assert np.isnan(effects.attribution).all()  # no head has a direct part of a masked token's logits


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory, minilm_dir):
    folder = tmp_path_factory.mktemp("masked-page")
    saved_tiny("bert", folder, minilm_dir, tf.BertForMaskedLM)
    return str(folder), load_model(folder, backend="scratch")


def test_effects_patches_a_typed_pair_at_its_mask_and_says_why_there_are_no_direct_parts(new_app, bert_folder):
    """The Effects page on a masked-LM BERT opened as a custom model: a typed pair with [MASK] is compared by the
    logit difference there, its patching grid is ``patch_heads``'s, and the attribution grid gives way to a
    sentence."""
    folder, ours = bert_folder
    clean, corrupted = "Which do you like better, coffee or [MASK]?", "Which do you like better, juice or [MASK]?"
    at = new_app({"model": "custom", "custom_model": folder, "effects_source": "own", "effects_clean": clean,
                  "effects_corrupted": corrupted, "effects_probe_answer": "tea", "effects_probe_distractor": "juice"},
                 page="app_pages/effects.py")
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("logit(“tea”) − logit(“juice”) at [MASK]" in c.value.replace("\\", "") for c in at.caption)
    assert any("not linear" in c.value for c in at.caption)
    metrics = {m.label: m.value for m in at.metric}
    want = patch_heads(ours, clean, corrupted, "tea", "juice")
    assert metrics["Clean"] == f"{want.attrs['ld_clean']:+.2f}" and metrics["By the heads"] == "—"
    charts = figures(at)
    assert not any(title_text(c).startswith("Direct") for c in charts)
    grid = next(c for c in charts if "recovered" in title_text(c))["data"][0]["z"]
    np.testing.assert_allclose(decode(grid), want["recovered"].to_numpy().reshape(2, 4), atol=1e-6)


def test_a_masked_row_with_one_token_twice_is_named_as_any_row_is(built):
    from analysis.tasks.build import from_rows

    ours, _, tok = built("bert")
    clean, corrupted = prompts(tok, "bert")
    good = {"clean": clean, "corrupted": corrupted, "answer": "tea", "distractor": "juice"}
    task = from_rows(ours, [good, {**good, "distractor": "tea"}])
    assert len(task.pairs) == 1 and task.pairs[0].role("MASK") == tok(clean)["input_ids"].index(tok.mask_token_id)
    assert task.problems == ("Row 3: its answer and distractor are the same token; give two different ones.",)
