"""A prompt traced once for the Effects analyses, and what a pair's answer is read as, against transformers' own run
of the same weights (a tiny random Llama built here, the bundled MiniLM) and its tokenizer."""
import numpy as np
import pytest
import torch
import transformers as tf

from analysis.effects import answer_token, patch_heads, readouts, token_text
from analysis.effects.inputs import probe_text, two, unit_embeddings
from analysis.effects.readouts import NextToken, readout_reading
from analysis.effects.traced import PATCH_MAX_TOKENS, as_traced, traced
from models import HeadLensError, load_model
from tests.hooked import z_hooked
from tests.test_llama import build

TEXT = "The cat sat on the mat because it was warm."


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(ours on the from-scratch engine, the transformers engine on the same folder, transformers' model, tokenizer)."""
    _, folder, hf, tok = build("llama", tmp_path_factory.mktemp("traced-llama"))
    return load_model(folder, backend="scratch"), load_model(folder), hf, tok


def test_a_traced_prompt_keeps_transformers_run_and_its_tokenizers_reading(llama):
    ours, theirs, hf, tok = llama
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    out, z = z_hooked(lambda: hf(ids, output_attentions=True, output_hidden_states=True), hf.model.layers,
                      lambda layer: layer.self_attn.o_proj, hf.config.num_attention_heads)
    ids = ids[0]
    t = traced(ours, TEXT)
    assert t.text == TEXT and len(t) == len(ids)
    assert t.ids.tolist() == ids.tolist() and t.ids.dtype == torch.long
    assert t.tokens == tok.convert_ids_to_tokens(ids.tolist())
    enc = tok(TEXT, return_offsets_mapping=True, return_special_tokens_mask=True)
    assert t.word_ids == enc.word_ids() and t.offsets == [tuple(o) for o in enc["offset_mapping"]]
    assert t.special.dtype == bool and t.special.tolist() == [bool(s) for s in enc["special_tokens_mask"]]
    L, H = hf.config.num_hidden_layers, hf.config.num_attention_heads
    Dh = hf.config.hidden_size // H
    assert len(t.trace.resid) == L + 1 and len(t.trace.z) == L
    for layer in range(L):  # hidden_states[l] enters layer l; the last is after the final norm, so not compared
        # the stream and z to float32's rounding at their own scale (entries up to 30 here: 2e-5 apart on some CPUs)
        want = out.hidden_states[layer][0].numpy()
        np.testing.assert_allclose(t.trace.resid[layer].numpy(), want, rtol=1e-5, atol=5e-6 * np.abs(want).max())
        heads = z[layer][0].view(len(ids), H, Dh).transpose(0, 1).numpy()
        np.testing.assert_allclose(t.trace.z[layer].numpy(), heads, rtol=1e-5, atol=5e-6 * np.abs(heads).max())
    weights = t.weights()
    assert weights.dtype == np.float32 and weights.shape == (L, H, len(ids), len(ids))
    np.testing.assert_allclose(weights, torch.stack(out.attentions, 1)[0].numpy(), atol=1e-5)
    assert t.weights() is weights and not weights.flags.writeable  # read once, and shared read-only
    att = t.attention()
    assert att.weights is weights and att.tokens == t.tokens and att.text == TEXT and att.causal is True
    assert (att.backend, att.model_name, att.n_tokens_original) == ("scratch", ours.name, len(ids))
    assert att.pruned is None and att.offsets == t.offsets and att.special is t.special and att.word_ids == t.word_ids


def test_a_prompt_traced_on_either_engine_of_one_model_is_taken_as_it_is(llama, scratch_model):
    ours, theirs, hf, tok = llama
    t = traced(ours, TEXT)
    assert as_traced(ours, t) is t and as_traced(theirs, t) is t
    again = as_traced(theirs, TEXT)  # a text is traced, on the from-scratch twin of the transformers engine
    assert again is not t and again.ids.tolist() == t.ids.tolist()
    np.testing.assert_allclose(again.weights(), t.weights(), atol=1e-6)
    with pytest.raises(HeadLensError, match=rf"^That prompt was traced on {ours.name}, not on {scratch_model.name}\.$"):
        as_traced(scratch_model, t)
    with pytest.raises(HeadLensError, match=r"^That clean prompt was traced on "):
        as_traced(scratch_model, t, noun="clean prompt")


def test_an_encoders_prompt_is_traced_with_its_special_tokens_and_at_most_256_tokens(scratch_model, minilm_dir):
    tok = tf.AutoTokenizer.from_pretrained(minilm_dir)
    t = traced(scratch_model, "Which do you like better, coffee or tea?")
    enc = tok("Which do you like better, coffee or tea?", return_special_tokens_mask=True)
    assert t.tokens == tok.convert_ids_to_tokens(enc["input_ids"]) and t.tokens[0] == "[CLS]"
    assert t.special.tolist() == [True] + [False] * (len(t) - 2) + [True]
    assert t.word_ids[0] is None and t.word_ids[1] == 0 and t.attention().causal is False
    assert len(traced(scratch_model, "word " * (PATCH_MAX_TOKENS - 2))) == PATCH_MAX_TOKENS == 256  # the longest
    with pytest.raises(HeadLensError, match=r"^The prompt has 257 tokens; effects are computed on prompts of at most "
                                            r"256\.$"):
        traced(scratch_model, "word " * (PATCH_MAX_TOKENS - 1))
    with pytest.raises(HeadLensError, match=r"^The corrupted prompt has 302 tokens"):
        traced(scratch_model, "word " * 300, noun="corrupted prompt")
    with pytest.raises(HeadLensError, match=r"^The clean prompt is empty; type a sentence\.$"):
        traced(scratch_model, "  ", noun="clean prompt")


def test_an_answer_is_a_token_id_or_a_string_read_as_one_token(llama):
    ours, theirs, hf, tok = llama
    vocab = len(tok)
    assert answer_token(ours, 0) == 0 and answer_token(ours, vocab - 1) == vocab - 1
    assert answer_token(ours, np.int64(7)) == 7 and type(answer_token(ours, np.int64(7))) is int
    for bad in (vocab, -1):
        with pytest.raises(HeadLensError, match=rf"^The answer token id {bad} is not in the vocabulary \(0 to "
                                                rf"{vocab - 1}\)\.$"):
            answer_token(ours, bad)
    with pytest.raises(HeadLensError, match=r"^The distractor token id -1 is not"):
        answer_token(ours, -1, role="distractor")
    one = next(t for t in tok.get_vocab() if t.startswith("Ġ") and len(t) > 2)  # a word with its leading space
    text = tok.convert_tokens_to_string([one])
    assert answer_token(ours, text) == tok.convert_tokens_to_ids(one)
    assert token_text(ours, tok.convert_tokens_to_ids(one)) == text
    for bad in ("", True, None, 2.0):  # True is an int to Python, not a token id
        with pytest.raises(HeadLensError, match=r'^Give the answer as a token: a string such as " Mary" \(with its '
                                                r"leading space\), or a token id\.$"):
            answer_token(ours, bad)
    pieces = tok(" coffee or tea", add_special_tokens=False)["input_ids"]
    named = " ".join(repr(p) for p in tok.convert_ids_to_tokens(pieces))
    with pytest.raises(HeadLensError) as err:
        answer_token(ours, " coffee or tea", role="distractor")
    assert str(err.value) == (f"The distractor ' coffee or tea' is {len(pieces)} tokens to this tokenizer ({named}); "
                              "give a string it reads as one token, or a token id.")


def test_an_encoders_probe_texts_and_their_unit_embeddings_equal_transformers_mean_pooling(hf_model, minilm_dir):
    assert probe_text("  tea \n", "answer") == "tea"
    for bad in ("", "   ", 3, None):
        with pytest.raises(HeadLensError, match=r"^On an encoder the distractor is a text \(a word or a sentence\) "
                                                r"whose embedding the prompt's is compared with; give it as text\.$"):
            probe_text(bad, "distractor")
    two(1, 2, "token")
    with pytest.raises(HeadLensError, match=r"^The answer and the distractor are the same text; patching compares "
                                            r"two\.$"):
        two("tea", "tea", "text")
    texts = ["tea", "a cup of coffee", "juice", "Which do you like better, coffee or tea?"]  # two of one length
    tok = tf.AutoTokenizer.from_pretrained(minilm_dir)
    bert = tf.AutoModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    with torch.inference_mode():
        want = [bert(**tok(t, return_tensors="pt")).last_hidden_state[0].mean(0) for t in texts]
    want = torch.stack([w / w.norm() for w in want])
    got = unit_embeddings(hf_model, texts)  # the transformers engine hands the run to its from-scratch twin
    assert got.shape == want.shape and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
    np.testing.assert_allclose(got.norm(dim=-1).numpy(), 1.0, atol=1e-6)


def test_a_metric_another_kind_of_model_reads_gets_a_sentence_naming_this_ones(llama, scratch_model, tiny):
    ours = llama[0]
    with pytest.raises(HeadLensError) as err:
        readout_reading(ours, "embedding")
    assert str(err.value) == ("The embedding difference is an encoder's metric: its sentence embedding against two "
                              f"probe texts; {ours.name}'s prediction is read as the logit difference: choose "
                              "'logit_diff' or 'prob_diff' or 'greater_than'.")
    with pytest.raises(HeadLensError) as err:
        readout_reading(scratch_model, "prob_diff")
    assert str(err.value) == ("The logit difference is read from a language model's next-token logits; "
                              f"{scratch_model.name}'s prediction is read as the embedding difference: choose "
                              "'embedding' (an encoder's tasks: objects, relation, sentence type, sentiment, or pairs "
                              "with probe texts).")
    with pytest.raises(HeadLensError, match=r"^Unknown metric 'loss': choose one of logit_diff, prob_diff, "):
        readout_reading(ours, "loss")
    bloom = load_model(tiny("bloom"))
    for make in (readouts, NextToken):  # a readout made with no stack finds its own
        with pytest.raises(HeadLensError, match=r"^Patching replaces a head's output inside the from-scratch engine, "
                                                r"which does not implement "):
            make(bloom)


def test_an_encoders_probe_texts_and_a_decoders_tokens_are_named_in_their_sentences(llama, scratch_model):
    """An answer the tokenizer reads as no token at all, the same probe text twice, a CSV row's bad distractor."""
    from analysis.tasks.build import from_rows

    with pytest.raises(HeadLensError, match=r"^The answer ' ' is 0 tokens to this tokenizer \(nothing\); give a "):
        answer_token(scratch_model, " ")
    with pytest.raises(HeadLensError, match=r"^The answer and the distractor are the same text; patching compares "
                                            r"two\.$"):
        patch_heads(scratch_model, "Which do you like better, coffee or tea?",
                    "Which do you like better, juice or tea?", "tea ", " tea")
    ours, _, _, tok = llama
    a, d = [tok.convert_tokens_to_string([t]) for t in sorted(t for t in tok.get_vocab() if t.startswith("Ġ")
                                                                  and len(t) > 2)[:2]]
    row = {"clean": TEXT, "corrupted": TEXT.replace("warm", "cold"), "answer": a, "distractor": d}
    assert len(tok(row["clean"])["input_ids"]) == len(tok(row["corrupted"])["input_ids"])
    task = from_rows(ours, [row, {**row, "distractor": " coffee or tea"}])
    assert len(task.pairs) == 1 and len(task.problems) == 1
    assert task.problems[0].startswith("Row 3: its distractor ' coffee or tea' is "), task.problems


def test_the_whole_residual_stream_patched_at_any_layer_gives_the_clean_runs_measure(llama):
    """What enters a layer is all that flows on: the clean residual stream put in whole, at any layer, gives the clean
    run's logit difference, and the attribution's frame names the answer and distractor as they read."""
    from analysis.effects import logit_attribution
    from analysis.effects.batched import final_measures, patched_measures
    from analysis.effects.metrics import TokenLogits
    from models.run import as_batch

    ours, _, _, tok = llama
    clean, bad = (as_batch(traced(ours, t).trace) for t in (TEXT, TEXT.replace("warm", "cold")))
    measure, rows = TokenLogits(torch.tensor([[5, 6]]), torch.tensor([[1.0, -1.0]])), torch.tensor([0])
    want, base = (final_measures(ours.stack, t, measure, rows)[0] for t in (clean, bad))
    assert abs(want - base) > 1e-3
    L = ours.stack.n_layers
    got = patched_measures(ours, clean, bad, measure, rows, np.zeros(L, dtype=int), np.arange(L),
                           np.full(L, -1), np.full(L, -1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    frame = logit_attribution(ours, TEXT, 5, 6)
    assert (frame.attrs["answer"], frame.attrs["distractor"]) == (tok.decode([5]), tok.decode([6]))


def test_a_tasks_greater_than_mass_is_the_probabilities_above_less_those_below(llama, scratch_model):
    """Greater-than's metric over pairs of uneven ``above`` and ``below`` tokens, against transformers' softmax; an
    encoder's metric over pairs without probe texts gets a sentence."""
    from dataclasses import replace

    from analysis.tasks.build import from_rows

    ours, _, hf, tok = llama
    a, d = (tok.decode([t]) for t in (5, 6))
    task = from_rows(ours, [{"clean": TEXT, "corrupted": TEXT.replace("warm", "cold"), "answer": a, "distractor": d}])
    (pair,) = task.pairs
    task = replace(task, pairs=(replace(pair, above=(5, 6), below=(7,)), replace(pair, above=(8,), below=(9, 10, 11))))
    metric = readout_reading(ours, "greater_than").task_metric(task, "greater_than")
    assert metric.tokens.tolist() == [[5, 6, 7, 0], [8, 9, 10, 11]]
    assert metric.weights.tolist() == [[1.0, 1.0, -1.0, 0.0], [1.0, -1.0, -1.0, -1.0]]
    t = traced(ours, TEXT)
    with torch.inference_mode():
        p = torch.softmax(hf(t.ids.view(1, -1)).logits[0, -1].double(), -1)
        got = metric(ours.stack, t.trace.resid[-1].unsqueeze(0).expand(2, -1, -1), torch.tensor([0, 1]))
    np.testing.assert_allclose(got.numpy(), [float(p[5] + p[6] - p[7]), float(p[8] - p[9] - p[10] - p[11])],
                               rtol=1e-4, atol=1e-7)
    u = hf.lm_head.weight.detach().double()  # its direction: each sign's weights scaled to sum to 1 in size
    for k, want in enumerate([(u[5] + u[6]) / 2 - u[7], u[8] - (u[9] + u[10] + u[11]) / 3]):
        np.testing.assert_allclose(metric.direction(ours.stack, k).double().numpy(), want.numpy(), rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(HeadLensError) as err:
        readout_reading(scratch_model, "embedding").task_metric(task, "embedding")
    assert str(err.value) == ("The embedding difference compares each sentence with its pair's probe texts; this "
                              "task's pairs have none: choose an encoder's task or upload pairs with them.")
