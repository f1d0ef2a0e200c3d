"""Every head explained (``analysis.explanations.explain_heads``): the rule chosen on the fit text and scored on the
held-out text, each score recomputed query by query from transformers' own attention; the two texts held apart; and a
head replaced by its rule equal to transformers' run with a hook that sets the head's output to (the rule's pattern)
@ (its values from transformers' value projection)."""
import numpy as np
import pandas as pd
import pytest
import torch
from transformers import BertModel

from analysis.explanations import EXPLAINED, corpus_halves, explain_attentions, explain_heads, explained_share
from analysis.explanations.replace import Replacer
from analysis.roles.rules import RULES, rule_named
from models import HeadLensError, load_model
from models.corpus import CORPUS
from tests.test_explanations import by_hand, check_interval, transformers_weights
from tests.test_families import build

FIT, HELD_OUT = list(CORPUS[0:16:2]), list(CORPUS[1:16:2])


def _hand_parts(folder, model, texts, rule, causal) -> list[dict]:
    """Each text's sums for every head, query by query from transformers' attention."""
    parts = []
    for t in texts:
        special = None if causal else list(model.attend(t).special)
        parts.append(by_hand(transformers_weights(folder, model, t), rule.keys(model, t), special, causal))
    return parts


def _hand_scores(folder, model, texts, rule, causal) -> np.ndarray:
    """The rule's score for every head over ``texts``."""
    parts = _hand_parts(folder, model, texts, rule, causal)
    return sum(p["score"] for p in parts) / sum(p["queries"] for p in parts)


def _drawn(parts: list[dict], layer: int, head: int, draws: int = 40_000) -> tuple[np.ndarray, np.ndarray]:
    """The Poisson bootstrap of one head's held-out score over the texts ``parts``, drawn here ``draws`` times with a
    generator of this test's own: ``(values (draws, 1), probabilities)``."""
    counts = np.random.default_rng(12345).poisson(1.0, (draws, len(parts))).astype(float)
    scores = np.array([p["score"][layer, head] for p in parts])
    base = counts @ np.array([p["queries"] for p in parts], dtype=float)
    kept = base > 0
    values = (counts[kept] @ scores) / base[kept]
    return values[:, None], np.full(kept.sum(), 1.0 / kept.sum())


def _check(frame, folder, model, fit, held_out, causal):
    singles = {name: _hand_scores(folder, model, fit, rule, causal) for name, rule in RULES.items()}
    best_single = np.max(np.stack(list(singles.values())), axis=0)
    fits = dict(singles)
    for r in frame.itertuples():
        if r.rule not in fits:
            fits[r.rule] = _hand_scores(folder, model, fit, rule_named(r.rule), causal)
        fitted = fits[r.rule][r.layer, r.head]
        assert r.fit_score == pytest.approx(fitted, abs=1e-5)
        assert r.fit_score >= best_single[r.layer, r.head] - 1e-5  # no single rule fits the head better
        if r.rule in singles:  # a single rule is the best one
            assert r.fit_score == pytest.approx(best_single[r.layer, r.head], abs=1e-5)
        else:  # a union earns its second rule
            assert r.fit_score >= best_single[r.layer, r.head] + 0.05 - 1e-5
    # held out: the chosen rule and the best positional one
    for r in frame.sample(min(12, len(frame)), random_state=0).itertuples():
        parts = _hand_parts(folder, model, held_out, rule_named(r.rule), causal)
        queries = sum(p["queries"] for p in parts)
        held = (sum(p["score"] for p in parts) / queries)[r.layer, r.head]
        assert r.score == pytest.approx(held, abs=1e-5)
        assert r.coverage == pytest.approx(sum(p["covered"] for p in parts) / queries, abs=1e-12)
        assert r.lift == pytest.approx(held / (sum(p["uniform"] for p in parts) / queries), rel=1e-4)
        assert r.sink_share == pytest.approx((sum(p["sink"] for p in parts) / queries)[r.layer, r.head], abs=1e-5)
        assert r.family == rule_named(r.rule).family
        check_interval([r.lo], [r.hi], *_drawn(parts, r.layer, r.head))
        positional = _hand_scores(folder, model, held_out, RULES[r.positional], causal)[r.layer, r.head]
        assert r.lift_positional == pytest.approx(held / positional, rel=1e-4)
        fit_positional = {n: singles[n][r.layer, r.head] for n, rule in RULES.items() if rule.family == "positional"}
        assert fit_positional[r.positional] == pytest.approx(max(fit_positional.values()), abs=1e-5)  # on the fit


def test_an_encoders_heads_are_explained_on_text_they_were_not_fitted_on(scratch_model, minilm_dir):
    frame = explain_heads(scratch_model, FIT, HELD_OUT, replicates=1000)
    assert len(frame) == 72 and frame.attrs == {"causal": False, "fit": len(FIT), "held_out": len(HELD_OUT)}
    _check(frame, minilm_dir, scratch_model, FIT, HELD_OUT, causal=False)
    assert explained_share(frame) == pytest.approx((frame["score"] >= EXPLAINED).mean())
    l0h2 = frame.set_index(["layer", "head"]).loc[(0, 2)]  # MiniLM's previous-token head
    assert l0h2["rule"] == "previous token" and l0h2["score"] > 0.95


def test_a_decoders_heads_set_the_first_token_aside(tmp_path):
    folder, _, _ = build("gpt2", tmp_path)
    model = load_model(folder)
    texts = ["The cat sat on the mat. The cat sat on the rug.", "A dog and a dog and a cat.", *CORPUS[:6]]
    fit, held = texts[0::2], texts[1::2]
    frame = explain_heads(model, fit, held, replicates=1000)
    assert frame.attrs["causal"] is True
    _check(frame, folder, model, fit, held, causal=True)


def test_the_corpus_halves_alternate_and_a_head_at_the_bar_is_explained(scratch_model):
    fit, held = corpus_halves()
    assert fit == list(CORPUS[0::2]) and held == list(CORPUS[1::2])  # every other sentence: both span the corpus
    frame = pd.DataFrame({"score": [EXPLAINED, EXPLAINED - 1e-9, 0.99, 0.1]})
    assert explained_share(frame) == 0.5 and explained_share(frame, at_least=0.05) == 1.0
    held_out = scratch_model.attend(HELD_OUT)
    for fit_texts, held_texts in (([], held_out), (held_out, [])):
        with pytest.raises(HeadLensError, match="at least one of each"):
            explain_attentions(fit_texts, held_texts)


def test_the_fit_and_held_out_texts_are_kept_apart(scratch_model):
    with pytest.raises(HeadLensError, match="1 of the held-out texts are among the fit texts"):
        explain_heads(scratch_model, FIT, [FIT[0], *HELD_OUT])
    with pytest.raises(HeadLensError, match="both"):
        explain_heads(scratch_model, FIT)
    fit, held = scratch_model.attend(FIT), scratch_model.attend(HELD_OUT)
    other = scratch_model.attend(list(CORPUS[100:116]))
    a, b = explain_attentions(fit, held, replicates=50), explain_attentions(other, held, replicates=50)
    same = (a["rule"] == b["rule"]).to_numpy()
    assert same.sum() > 20  # a rule chosen on other text is scored on the same held-out text the same way
    np.testing.assert_allclose(a["score"][same], b["score"][same], atol=1e-12)
    assert not np.allclose(a["fit_score"][same], b["fit_score"][same])
    c = explain_attentions(fit, other, replicates=50)  # and the fit is untouched by the held-out text
    np.testing.assert_allclose(a["fit_score"], c["fit_score"], atol=1e-12)
    assert (a["rule"] == c["rule"]).all()


# --- replacement ----------------------------------------------------------------------------------------------------

def _pattern(n: int, keys: list[list[int]], rows: list[int], sink: float) -> torch.Tensor:
    """By hand: each replaced row even over its keys, the first token keeping ``sink``; no key: all on the first."""
    p = torch.zeros(n, n, dtype=torch.float64)
    for q in rows:
        if keys[q]:
            for k in keys[q]:
                p[q, k] += (1 - sink) / len(keys[q])
            p[q, 0] += sink
        else:
            p[q, 0] = 1.0
    return p


def _hooked(layers, edits: dict, value_of, output_of):
    """Hooks on transformers' layers: each edited head's slice of the output projection's input set to (pattern) @
    (its values, read from the value projection's output in the same run)."""
    values, handles = {}, []
    for layer, heads in edits.items():
        def keep(_, __, out, layer=layer):
            values[layer] = out
        def replace(_, args, layer=layer, heads=heads):
            (x,) = args
            x = x.clone()
            for head, dh, pattern, rows in heads:
                v = value_of(values[layer])[0, :, head * dh:(head + 1) * dh].to(x.dtype)
                z = pattern.to(x.dtype) @ v
                x[0, rows, head * dh:(head + 1) * dh] = z[rows]
            return (x,)
        handles.append(layers[layer][0].register_forward_hook(keep))
        handles.append(layers[layer][1].register_forward_pre_hook(replace))
    return handles


def test_a_decoder_head_replaced_by_its_rule_is_transformers_run_with_that_pattern(tmp_path):
    folder, hf, tok = build("gpt2", tmp_path)
    ours = load_model(folder, backend="scratch")
    ours.stack.double()
    texts = ["The cat sat on the mat. The cat sat on the rug.", "A dog and a dog and a cat, and a dog."]
    frame = pd.DataFrame({"layer": [0, 1, 1], "head": [1, 2, 3], "rule": ["previous token", "duplicate", "punctuation"],
                          "sink_share": [0.3, 0.55, 0.0]})
    heads = list(zip(frame["layer"], frame["head"]))
    replacer = Replacer(ours, frame, texts, means=np.zeros((2, 4, 8)))
    dh = 32 // 4
    total = count = 0.0
    for text in texts:
        ids = tok(text, return_tensors="pt")["input_ids"]
        n = ids.shape[1]
        edits = {}
        for r in frame.itertuples():
            keys = rule_named(r.rule).keys(ours, text)
            edits.setdefault(r.layer, []).append((r.head, dh, _pattern(n, keys, list(range(1, n)), r.sink_share),
                                                  list(range(1, n))))
        layers = {l: (hf.transformer.h[l].attn.c_attn, hf.transformer.h[l].attn.c_proj) for l in edits}
        handles = _hooked(layers, edits, lambda out: out[..., 64:96], None)
        try:
            with torch.no_grad():
                logits = hf(ids).logits[0]
        finally:
            for h in handles:
                h.remove()
        total += float(torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum"))
        count += n - 1
    assert replacer.run(heads) == pytest.approx(total / count, abs=1e-5)
    assert abs(replacer.run(heads) - replacer.unedited) > 1e-3  # the replacement changed something


def test_an_encoder_head_replaced_by_its_rule_is_transformers_run_with_that_pattern(scratch_model, minilm_dir):
    hf = BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    texts = ["Which do you like better, coffee or tea?", "The cat sat on the mat, and the dog barked."]
    frame = pd.DataFrame({"layer": [0, 3, 5], "head": [2, 7, 11],
                          "rule": ["next token", "punctuation", "focus: object"],
                          "sink_share": [0.4, 0.4, 0.4]})  # an encoder's pattern takes no sink share
    replacer = Replacer(scratch_model, frame, texts, means=np.zeros((6, 12, 32)))
    cosines = []
    for text in texts:
        enc = scratch_model.tokenize(text, return_tensors="pt", return_special_tokens_mask=True)
        n = enc["input_ids"].shape[1]
        rows = [q for q in range(n) if not enc["special_tokens_mask"][0, q]]
        edits = {}
        for r in frame.itertuples():
            keys = rule_named(r.rule).keys(scratch_model, text)
            edits.setdefault(r.layer, []).append((r.head, 32, _pattern(n, keys, rows, 0.0), rows))
        layers = {l: (hf.encoder.layer[l].attention.self.value, hf.encoder.layer[l].attention.output.dense)
                  for l in edits}
        inputs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            plain = hf(**inputs).last_hidden_state[0].mean(0)
        handles = _hooked(layers, edits, lambda out: out, None)
        try:
            with torch.no_grad():
                edited = hf(**inputs).last_hidden_state[0].mean(0)
        finally:
            for h in handles:
                h.remove()
        cosines.append(float(torch.nn.functional.cosine_similarity(plain, edited, dim=0)))
    heads = list(zip(frame["layer"], frame["head"]))
    assert replacer.unedited == pytest.approx(1.0, abs=1e-6)
    assert replacer.run(heads) == pytest.approx(float(np.mean(cosines)), abs=1e-5)
    assert np.mean(cosines) < 0.999  # the replacement changed something


@pytest.mark.parametrize("layer, head, name", [(5, 11, "first token or focus: object"), (1, 5, "previous token")])
def test_where_a_rule_fails_is_read_from_transformers_attention(scratch_model, minilm_dir, layer, head, name):
    """MiniLM's object head L5 H11 and its rule (missed in 2 of 60 held-out sentences), and L1 H5 and a rule it
    misses in every sentence: every miss is a held-out query giving the rule's keys under half its weight, and the
    key it gives most instead, the strongest such query of its sentence, strongest first; a sentence with no miss has
    no row. The whole table, by hand."""
    from analysis.explanations import misses

    rule = rule_named(name)
    held = corpus_halves()[1][:60]
    attentions = scratch_model.attend(held)
    found = misses(attentions, rule, layer, head, k=len(held))
    want = []
    for i, text in enumerate(held):
        w = transformers_weights(minilm_dir, scratch_model, text)[layer, head]
        keys = rule.keys(scratch_model, text)
        special = scratch_model.tokenize(text, return_special_tokens_mask=True)["special_tokens_mask"]
        best = {}
        for q in (q for q in range(len(w)) if not special[q]):
            on = sum(w[q, k] for k in keys[q])
            others = [(w[q, k], k) for k in range(len(w)) if k not in keys[q]]
            if on < 0.5 and others:
                best[q] = (max(others), on)
        if best:
            q = max(best, key=lambda q: best[q][0][0])
            (weight, key), on = best[q]
            want.append((weight, i, q, key, on))
    want.sort(key=lambda row: -row[0])
    assert len(found) == len(want) == {5: 2, 1: len(held)}[layer]  # some sentences without a miss, or none
    for r, (weight, i, q, key, on) in zip(found.itertuples(), want):
        assert (r.sentence, r.query, r.key) == (i, q, key) and r.text == held[i]
        assert r.weight == pytest.approx(weight, abs=1e-5) and r.on_rule == pytest.approx(on, abs=1e-5)
        tokens = scratch_model.tokenizer.convert_ids_to_tokens(scratch_model.tokenize(held[i])["input_ids"])
        assert (r.query_token, r.key_token) == (tokens[q], tokens[key])
    assert list(found.columns) == ["sentence", "text", "query", "key", "query_token", "key_token", "weight", "on_rule"]
    assert len(misses(attentions, rule, layer, head)) == min(3, len(want))  # three by default
