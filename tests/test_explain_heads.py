"""Every head explained (``analysis.explanations.explain_heads``): the rule chosen on the fit text and scored on the
held-out text, each score recomputed query by query from transformers' own attention; the two texts held apart; and a
head replaced by its rule equal to transformers' run with a hook that sets the head's output to (the rule's pattern)
@ (its values from transformers' value projection)."""
import hashlib

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import BertModel

from analysis.explanations import (EXPLAINED, corpus_halves, explain_attentions, explain_heads, explained,
                                   explained_share, read_on)
from analysis.explanations.programs import EMPTY
from analysis.explanations.replace import Replacer
from analysis.roles.rules import RULES, rule_named
from models import HeadLensError, load_model
from models.corpus import CORPUS, PARAGRAPHS, paragraph_halves
from tests.test_explanations import by_hand, check_interval, transformers_weights
from tests.test_families import build

FIT, HELD_OUT = list(CORPUS[0:16:2]), list(CORPUS[1:16:2])


def _drawn(parts: list[dict], layer: int, head: int, draws: int = 40_000) -> tuple[np.ndarray, np.ndarray]:
    """The Poisson bootstrap of one head's held-out score over the texts ``parts``, drawn here ``draws`` times with a
    generator of this test's own: ``(values (draws, 1), probabilities)``."""
    counts = np.random.default_rng(12345).poisson(1.0, (draws, len(parts))).astype(float)
    scores = np.array([p["score"][layer, head] for p in parts])
    base = counts @ np.array([p["queries"] for p in parts], dtype=float)
    kept = base > 0
    values = (counts[kept] @ scores) / base[kept]
    return values[:, None], np.full(kept.sum(), 1.0 / kept.sum())


def _bootstrap_by_hand(texts: list[str], parts: list[dict], replicates: int) -> tuple[float, float]:
    """The 95% percentile interval of one head's score over ``texts``, resampled as the docs say: each text drawn a
    Poisson(1) number of times per resample, from a generator seeded by (the text's 64-bit BLAKE2b, the replicates);
    a resample's score its texts' attention on the rules' keys over their queries (one drawing none left out)."""
    counts = np.array([np.random.default_rng([int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(),
                                                             "little"), replicates]).poisson(1.0, replicates)
                       for t in texts], dtype=float)                                  # (texts, replicates)
    on = counts.T @ np.array([p["score"][0, 0] for p in parts])
    base = counts.T @ np.array([p["queries"] for p in parts], dtype=float)
    scores = on[base > 0] / base[base > 0]
    return tuple(np.percentile(scores, [2.5, 97.5]))


def _text(model, t: str, causal: bool) -> dict:
    """A text as the checks read it: its tokens' count, the queries, each query's content keys (a decoder's keys
    1 … q, an encoder's words) and the special tokens, from the tokenizer alone."""
    special = [bool(x) for x in model.tokenize(t, truncation=True, max_length=model.max_tokens,
                                               return_special_tokens_mask=True)["special_tokens_mask"]]
    n = len(special)
    queries = list(range(1, n)) if causal else [q for q in range(n) if not special[q]]
    content = {q: list(range(1, q + 1)) if causal else [k for k in range(n) if not special[k]] for q in queries}
    return {"text": t, "n": n, "special": special, "queries": queries, "content": content, "causal": causal}


def _texts(folder, model, texts, causal) -> list[dict]:
    """Each text as ``_text`` reads it, with transformers' weights."""
    return [{**_text(model, t, causal), "W": transformers_weights(folder, model, t)} for t in texts]


def _part(rule, keys, q, content) -> dict:
    """A rule's part of query ``q``'s content row: its keys among the content keys, evenly or halving every
    half-life back from the previous token."""
    named = [k for k in keys[q] if k in content]
    w = {k: 1.0 if rule.half_life is None else 0.5 ** ((q - 1 - k) / rule.half_life) for k in named}
    return {k: v / sum(w.values()) for k, v in w.items()}


def _rows(model, t: dict, rules, weights, fallback, sink, special):
    """A program's predicted content and whole rows for each query of ``t``, by hand from its rules' keys (each
    rule's keys are worked by hand in tests/test_rules.py, every rule among them)."""
    keys = [r.keys(model, t["text"]) for r in rules]
    n = t["n"]
    for q in t["queries"]:
        row = np.zeros(n)
        for rule, w, k in zip(rules, weights, keys):
            for key, v in _part(rule, k, q, t["content"][q]).items():
                row[key] += w * v
        row[t["content"][q]] += fallback / len(t["content"][q])
        if row.sum() <= 0:  # the rules name nothing and the fallback weighs nothing: every content key evenly
            row[t["content"][q]] = 1.0
        content = row / row.sum()
        others = [] if t["causal"] else [k for k in range(1, n) if t["special"][k]]  # an encoder's [SEP]
        whole = content * (1 - sink - (special if others else 0.0))
        whole[0] += sink
        for k in others:
            whole[k] += special / len(others)
        yield q, content, whole / whole.sum(), sorted({k for kk in keys for k in kk[q] if k in t["content"][q]})


def _read(model, texts: list[dict], r, rules) -> dict:
    """One head's program read on ``texts`` by hand: score, coverage, lift, iou, iou_full, sink share, and each
    text's score sum and queries (for the interval)."""
    mins = maxs = mins_full = maxs_full = on = uniform = covered = sink = 0.0
    parts = []
    for t in texts:
        w = t["W"][r.layer, r.head]
        text_on = 0.0
        for q, content, whole, named in _rows(model, t, rules, r.weights, r.fallback_weight, r.sink_weight,
                                              r.special_weight):
            actual, total = np.zeros_like(content), w[q, t["content"][q]].sum()
            if total > EMPTY:  # a head that gives its content nothing, all on the sink: no row to explain
                actual[t["content"][q]] = w[q, t["content"][q]] / total
            agree = total <= EMPTY and not named  # and a program naming no key for it agrees
            mins, maxs = mins + np.minimum(content, actual).sum() + agree, maxs + np.maximum(content, actual).sum()
            mins_full += np.minimum(whole, w[q]).sum()
            maxs_full += np.maximum(whole, w[q]).sum()
            text_on += actual[named].sum() + agree
            uniform += len(named) / len(t["content"][q])
            covered += bool(named)
            sink += w[q, 0]
        on += text_on
        parts.append({"score": np.full((1, 1), text_on), "queries": len(t["queries"])})
    queries = sum(len(t["queries"]) for t in texts)
    return {"score": on / queries, "coverage": covered / queries, "lift": on / uniform, "iou": mins / maxs,
            "iou_full": mins_full / maxs_full, "sink": sink / queries, "parts": parts}


def _fit_error(model, texts: list[dict], layer, head, rules, weights) -> tuple[float, np.ndarray]:
    """The squared error to one head's content rows over ``texts`` of ``rules`` and the fallback (every content key
    evenly, the last of ``weights``) with ``weights``, unscaled, and its gradient in the weights."""
    err, grad = 0.0, np.zeros(len(rules) + 1)
    for t in texts:
        w = t["W"][layer, head]
        keys = [rule.keys(model, t["text"]) for rule in rules]
        for q in t["queries"]:
            c = t["content"][q]
            actual = np.zeros(w.shape[-1])
            if w[q, c].sum() > EMPTY:
                actual[c] = w[q, c] / w[q, c].sum()
            F = np.zeros((len(rules) + 1, w.shape[-1]))
            for j, (rule, k) in enumerate(zip(rules, keys)):
                for key, v in _part(rule, k, q, c).items():
                    F[j, key] = v
            F[-1, c] = 1 / len(c)
            resid = weights @ F - actual
            err += resid @ resid
            grad += 2 * F @ resid
    return err, grad


def _check(frame, folder, model, fit, held_out, causal, heads=12):
    fit_t, held_t = _texts(folder, model, fit, causal), _texts(folder, model, held_out, causal)
    for r in frame.sample(min(heads, len(frame)), random_state=0).itertuples():
        rules = [RULES[name] for name in r.rule.split(" or ")]
        assert 1 <= len(rules) <= 3 and len(r.weights) == len(rules) and min(r.weights) > 0
        assert r.family == rule_named(r.rule).family
        # the fit: the weights (the rules' and the fallback's) are the least-squares ones on the simplex: they sum
        # to 1 and the error's gradient is the same in every weight above 0 and no lower in one at 0; no rule with
        # the fallback alone fits better; the keys set aside take the head's mean shares on the fit text
        weights = np.array([*r.weights, r.fallback_weight])
        assert weights.sum() == pytest.approx(1.0, abs=1e-4) and (weights >= 0).all()
        err, grad = _fit_error(model, fit_t, r.layer, r.head, rules, weights)
        tol = 1e-3 * max(1.0, np.abs(grad).max())
        assert np.ptp(grad[weights > 1e-6]) <= tol and (grad[weights <= 1e-6] >= grad[weights > 1e-6].max() - tol).all()
        for name, rule in RULES.items():
            if name == "first token":
                continue
            at = {t: _fit_error(model, fit_t, r.layer, r.head, [rule], np.array([t, 1 - t]))[0] for t in (0, 0.5, 1)}
            a = 2 * (at[1] + at[0] - 2 * at[0.5])  # the error along the pair's simplex: a t² + b t + c
            b = at[1] - at[0] - a
            t = np.clip(-b / (2 * a), 0, 1) if a > 0 else float(at[1] < at[0])
            assert err <= a * t * t + b * t + at[0] + 1e-6 * max(1.0, err), name
        queries = [q for t in fit_t for q in t["queries"]]
        first = sum(t["W"][r.layer, r.head, q, 0] for t in fit_t for q in t["queries"]) / len(queries)
        assert r.sink_weight == pytest.approx(first, abs=1e-5)
        if causal:
            assert r.special_weight == pytest.approx(0.0, abs=1e-12)
        # held out: every reading by hand
        got = _read(model, held_t, r, rules)
        assert r.score == pytest.approx(got["score"], abs=1e-5)
        assert r.coverage == pytest.approx(got["coverage"], abs=1e-12)
        assert r.lift == pytest.approx(got["lift"], rel=1e-4, nan_ok=True)  # no key named anywhere: NaN
        assert r.iou == pytest.approx(got["iou"], abs=1e-5)
        assert r.iou_full == pytest.approx(got["iou_full"], abs=1e-5)
        assert r.sink_share == pytest.approx(got["sink"], abs=1e-5)
        means = [p["score"][0, 0] / p["queries"] for p in got["parts"]]
        if np.ptp(means) > 1e-6:
            check_interval([r.lo], [r.hi], *_drawn(got["parts"], 0, 0))
        else:  # every text gives the same score: so does every resample
            assert r.lo == pytest.approx(r.score, abs=1e-6) and r.hi == pytest.approx(r.score, abs=1e-6)
        positional = [RULES[name] for name in r.positional.split(" or ")]
        assert all(p.family == "positional" for p in positional)


def test_an_encoders_heads_are_explained_on_text_they_were_not_fitted_on(scratch_model, minilm_dir):
    frame = explain_heads(scratch_model, FIT, HELD_OUT, replicates=1000)
    assert len(frame) == 72 and frame.attrs == {"causal": False, "fit": len(FIT), "held_out": len(HELD_OUT),
                                                    "held_out_texts": "texts",
                                                    "rules": [n for n in RULES if n != "first token"]}
    _check(frame, minilm_dir, scratch_model, FIT, HELD_OUT, causal=False)
    assert explained_share(frame) == pytest.approx(((frame["score"] >= EXPLAINED) & (frame["lift"] >= 3)).mean())
    l0h2 = frame.set_index(["layer", "head"]).loc[(0, 2)]  # MiniLM's previous-token head
    assert l0h2["rule"].split(" or ")[0] == "previous token" and l0h2["weights"][0] > 0.9
    assert len(l0h2["weights"]) <= 2  # a further rule joins only when it cuts enough of the error left
    assert l0h2["score"] > 0.95 and l0h2["iou"] > 0.8


def test_each_heads_program_is_read_on_a_users_own_text(scratch_model, minilm_dir):
    """The program fitted on the corpus, read on two sentences of a user's: every reading by hand from transformers'
    attention."""
    frame = explain_heads(scratch_model, FIT, HELD_OUT, replicates=50)
    user = ["Which do you like better, coffee or tea?", "The dog chased the cat around the garden twice."]
    got = read_on(frame, scratch_model.attend(user), replicates=1000)
    assert len(got) == 72 and got.attrs["texts"] == 2 and got["rule"].tolist() == frame["rule"].tolist()
    texts = _texts(minilm_dir, scratch_model, user, causal=False)
    for r, mine in zip(frame.sample(10, random_state=1).itertuples(), got.sample(10, random_state=1).itertuples()):
        want = _read(scratch_model, texts, r, [RULES[name] for name in r.rule.split(" or ")])
        for name in ("score", "coverage", "iou", "iou_full"):
            assert getattr(mine, name) == pytest.approx(want[name], abs=1e-5), name
        assert mine.lift == pytest.approx(want["lift"], rel=1e-4, nan_ok=True)
        low, high = _bootstrap_by_hand(user, want["parts"], 1000)
        assert (mine.lo, mine.hi) == (pytest.approx(low, abs=1e-6), pytest.approx(high, abs=1e-6))
        assert low < mine.score < high
    one = read_on(frame[(frame["layer"] == 3) & (frame["head"] == 7)], scratch_model.attend(user), replicates=1000)
    assert len(one) == 1 and one.iloc[0].to_dict() == got.iloc[3 * 12 + 7].to_dict()  # one card's head alone


def test_texts_attended_a_few_at_a_time_give_the_same_programs(scratch_model):
    """The texts are read as they are attended, ``batch_size`` at a time: three at a time gives the frame all at once
    gives (``explain_attentions`` on every text's attention), and the progress rises to 1."""
    whole = explain_attentions(scratch_model.attend(FIT), scratch_model.attend(HELD_OUT), replicates=50)
    said = []
    few = explain_heads(scratch_model, FIT, HELD_OUT, replicates=50, batch_size=3, progress=said.append)
    assert few[["rule", "program"]].equals(whole[["rule", "program"]])
    assert few.attrs == {**whole.attrs, "held_out_texts": "texts"}
    for name in ("score", "lo", "hi", "iou", "iou_full", "lift", "sink_weight"):
        np.testing.assert_allclose(few[name], whole[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert said == sorted(said) and said[-1] == 1.0 and len(said) > 6  # each batch of three, and each stage


def test_a_decoders_heads_set_the_first_token_aside(tmp_path):
    folder, _, _ = build("gpt2", tmp_path)
    model = load_model(folder)
    texts = ["The cat sat on the mat. The cat sat on the rug.", "A dog and a dog and a cat.", *CORPUS[:6]]
    fit, held = texts[0::2], texts[1::2]
    frame = explain_heads(model, fit, held, replicates=1000)
    assert frame.attrs["causal"] is True
    _check(frame, folder, model, fit, held, causal=True, heads=len(frame))


def test_the_halves_are_kept_apart_and_alternate(scratch_model):
    fit, held = corpus_halves()
    assert fit == list(CORPUS[0::2]) and held == list(CORPUS[1::2])  # every other sentence: both span the corpus
    fit, held = paragraph_halves()
    assert fit == list(PARAGRAPHS[0::2]) and held == list(PARAGRAPHS[1::2]) and not set(fit) & set(held)
    frame = pd.DataFrame({"score": [EXPLAINED, EXPLAINED - 1e-9, 0.99, 0.99], "lift": [3.0, 9.0, 2.99, 40.0]})
    assert explained(frame).tolist() == [True, False, False, True] and explained_share(frame) == 0.5
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
    assert same.sum() > 20  # a program fitted on other text is read on the same held-out text
    assert not np.allclose(np.concatenate(a["weights"][same].tolist()), np.concatenate(b["weights"][same].tolist()))
    c = explain_attentions(fit, other, replicates=50)  # and the fit is untouched by the held-out text
    assert (a["rule"] == c["rule"]).all() and a["weights"].tolist() == c["weights"].tolist()
    np.testing.assert_allclose(a["sink_weight"], c["sink_weight"], atol=1e-12)


# --- replacement ----------------------------------------------------------------------------------------------------

def _pattern(model, text: str, r, causal: bool) -> tuple[torch.Tensor, list[int]]:
    """By hand: each replaced row the program's whole row (``_rows``), and the rows replaced."""
    t = _text(model, text, causal)
    p = torch.zeros(t["n"], t["n"], dtype=torch.float64)
    rules = [RULES[name] for name in r.rule.split(" or ")]
    for q, _, whole, _ in _rows(model, t, rules, r.weights, r.fallback_weight, r.sink_weight, r.special_weight):
        p[q] = torch.as_tensor(whole)
    return p, t["queries"]


def _programs(rules: list[str], weights: list[tuple], fallback: list[float], sink: list[float],
              special: list[float], heads: list[tuple[int, int]]) -> pd.DataFrame:
    return pd.DataFrame({"layer": [h[0] for h in heads], "head": [h[1] for h in heads], "rule": rules,
                         "weights": weights, "fallback_weight": fallback, "sink_weight": sink,
                         "special_weight": special})


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
    frame = _programs(["previous token", "duplicate or recent 2", "punctuation"], [(0.9,), (0.5, 0.3), (1.0,)],
                      [0.1, 0.2, 0.0], [0.3, 0.55, 0.0], [0.0, 0.0, 0.0], [(0, 1), (1, 2), (1, 3)])
    heads = list(zip(frame["layer"], frame["head"]))
    replacer = Replacer(ours, frame, texts, means=np.zeros((2, 4, 8)))
    dh = 32 // 4
    total = count = 0.0
    for text in texts:
        ids = tok(text, return_tensors="pt")["input_ids"]
        n = ids.shape[1]
        edits = {}
        for r in frame.itertuples():
            edits.setdefault(r.layer, []).append((r.head, dh, *_pattern(ours, text, r, causal=True)))
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
    frame = _programs(["next token", "punctuation or itself", "focus: object"], [(0.8,), (0.6, 0.4), (0.7,)],
                      [0.2, 0.0, 0.3], [0.4, 0.1, 0.0], [0.3, 0.0, 0.5], [(0, 2), (3, 7), (5, 11)])
    replacer = Replacer(scratch_model, frame, texts, means=np.zeros((6, 12, 32)))
    cosines = []
    for text in texts:
        enc = scratch_model.tokenize(text, return_tensors="pt", return_special_tokens_mask=True)
        n = enc["input_ids"].shape[1]
        rows = [q for q in range(n) if not enc["special_tokens_mask"][0, q]]
        edits = {}
        for r in frame.itertuples():
            pattern, replaced = _pattern(scratch_model, text, r, causal=False)
            assert replaced == rows
            edits.setdefault(r.layer, []).append((r.head, 32, pattern, rows))
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


def _keys_by_hand(model, text: str, name: str) -> list[list[int]]:
    """The keys of an encoder's query under the two rules the misses test reads, from the tokenizer and spaCy alone:
    "previous token", the token before (none before the first); "first token or focus: object", the first token and
    every token of the words spaCy tags a noun, a proper noun or a pronoun (a special token's query names none of
    the object words). A word's tokens are those whose first character lies in it."""
    from analysis.roles.measure import load_spacy  # spaCy's English pipeline, the parse the rules read

    enc = model.tokenize(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    n, special = len(enc["input_ids"]), enc["special_tokens_mask"]
    if name == "previous token":
        return [[q - 1] if q else [] for q in range(n)]
    assert name == "first token or focus: object", name
    objects = [w for w in load_spacy()(text) if w.pos_ in ("NOUN", "PROPN", "PRON")]

    def tokens_of(word):
        return [t for t, (start, end) in enumerate(enc["offset_mapping"]) if not special[t] and end > start
                and word.idx <= start < word.idx + len(word.text)]
    named = sorted(t for w in objects for t in tokens_of(w))
    return [[0] + ([] if special[q] else named) for q in range(n)]


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
        keys = _keys_by_hand(scratch_model, text, name)
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
