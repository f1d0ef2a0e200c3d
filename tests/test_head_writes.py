"""What a head writes (its vocabulary, its OV circuit's copying) and the routes of a prediction, against
forward hooks on transformers' own modules (tiny random Llama, Qwen2 and Mistral), on hand-made heads
whose OV circuit is the identity or its negative, and on the bundled SmolLM2."""
import itertools

import numpy as np
import pytest
import torch

from analysis.defaults import PAIRS
from analysis.effects.routes import THRESHOLD, flow_graph, flow_heads, prediction_flow, strongest_route
from analysis.effects.vocabulary import copy_sample, copying_scores, head_vocabulary, ov_logits
from models import HeadLensError, load_model
from models.stacks.decoder import Decoder, DecoderConfig
from tests.test_effects import CLEAN, decoder, one_head_model, run_hf  # noqa: F401  (decoder: the tiny models' fixture)


def _hf_sizes(hf):
    c = hf.config
    H, Hkv = c.num_attention_heads, c.num_key_value_heads
    return H, Hkv, c.hidden_size // H


def test_a_heads_vocabulary_equals_its_output_through_transformers_norm_and_unembedding(decoder):
    family, ours, theirs, hf, tok = decoder
    ref = run_hf(hf, tok, CLEAN)
    H, _, Dh = _hf_sizes(hf)
    for model, (layer, head, position) in itertools.product((ours, theirs), [(0, 1, -1), (1, 3, 4)]):
        frame = head_vocabulary(model, CLEAN, layer, head, position=position, k=7)
        x = ref["out"][position]
        scale = hf.model.norm.weight / torch.sqrt(x.pow(2).mean() + hf.model.norm.variance_epsilon)
        w = hf.model.layers[layer].self_attn.o_proj.weight[:, head * Dh:(head + 1) * Dh]
        with torch.no_grad():
            logits = hf.lm_head.weight @ (w @ ref["z"][layer][position, head * Dh:(head + 1) * Dh] * scale)
        for direction, values in (("up", logits.topk(7)), ("down", (-logits).topk(7))):
            rows = frame[frame["direction"] == direction]
            assert rows["rank"].tolist() == list(range(1, 8))
            want = values.values if direction == "up" else -values.values
            np.testing.assert_allclose(rows["logit"], want.numpy(), atol=1e-5)
            np.testing.assert_allclose(rows["logit"], logits[rows["token"].tolist()].numpy(), atol=1e-5)
            assert rows["text"].tolist() == [tok.decode([t]) for t in rows["token"]]
        assert frame.attrs["position"] == position % len(ref["out"])
        assert frame.attrs["mean"] == pytest.approx(float(logits.mean()), abs=1e-5)


def test_the_ov_circuit_and_copying_equal_transformers_modules(decoder):
    family, ours, theirs, hf, tok = decoder
    H, Hkv, Dh = _hf_sizes(hf)
    sample = copy_sample(ours, size=60)
    assert len(sample) == 60 and not set(sample) & set(tok.all_special_ids)
    ids = torch.tensor(sample)
    copy, suppress = np.zeros((2, H)), np.zeros((2, H))
    with torch.no_grad():
        for layer in range(2):
            block = hf.model.layers[layer]
            v = block.self_attn.v_proj(block.input_layernorm(hf.model.embed_tokens(ids)))     # (S, Hkv * Dh)
            for head in range(H):
                g = head // (H // Hkv)
                out = block.self_attn.o_proj.weight[:, head * Dh:(head + 1) * Dh] @ v[:, g * Dh:(g + 1) * Dh].T
                logits = hf.lm_head(hf.model.norm(out.T))                                        # (S, vocab)
                np.testing.assert_allclose(ov_logits(theirs, layer, head, sample).numpy(), logits.numpy(), atol=1e-5)
                own = logits.gather(1, ids.view(-1, 1))
                copy[layer, head] = ((logits > own).sum(1) < 3).double().mean()
                suppress[layer, head] = ((logits < own).sum(1) < 3).double().mean()
    for model in (ours, theirs):
        frame = copying_scores(model, tokens=sample, k=3)
        np.testing.assert_array_equal(frame["copying"].to_numpy().reshape(2, H), copy)
        np.testing.assert_array_equal(frame["suppression"].to_numpy().reshape(2, H), suppress)
        assert frame.attrs["chance"] == pytest.approx(3 / hf.config.vocab_size)


def identity_head_model(tmp_path, sign: float):
    """A one-head, attention-only decoder whose embeddings and unembedding are the identity and whose OV
    circuit is ``sign`` times it: attending to a token writes (minus) that token's own direction."""
    from tests.conftest import _bpe_vocab
    import transformers as tf

    vocab, merges = _bpe_vocab()
    V = len(vocab)
    stack = Decoder.untrained(DecoderConfig(vocab_size=V, max_len=16, n_layers=1, n_heads=1, d_model=V,
                                            attention_only=True), seed=1)
    eye = torch.eye(V)
    with torch.no_grad():
        stack.tok_emb.weight.copy_(eye)
        stack.unembed.weight.copy_(eye)
        stack.layers[0].attn.in_proj_weight.copy_(torch.cat([torch.zeros(2 * V, V), eye]))
        stack.layers[0].attn.out_proj.weight.copy_(sign * eye)
    stack.save_pretrained(tmp_path)
    tf.GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                         pad_token="<pad>").save_pretrained(tmp_path)
    return load_model(tmp_path, backend="scratch")


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_head_whose_ov_circuit_is_the_identity_copies_every_token(tmp_path, sign):
    model = identity_head_model(tmp_path, sign)
    frame = copying_scores(model, k=1)
    assert frame.attrs["tokens"] == len(copy_sample(model)) >= 100
    copying, suppression = frame["copying"].item(), frame["suppression"].item()
    assert (copying, suppression) == ((1.0, 0.0) if sign > 0 else (0.0, 1.0))
    vocabulary = head_vocabulary(model, "cat sat on the mat", 0, 0, k=3)
    assert vocabulary.attrs["at"] == "mat" or vocabulary.attrs["at"].endswith("mat")


def _hf_shares(hf, tok, text):
    """The shares of every update recomputed from transformers' modules with hooks, float64."""
    H, Hkv, Dh = _hf_sizes(hf)
    ids = tok(text, return_tensors="pt")["input_ids"]
    got = {"resid": [], "attn": [], "mlp": []}
    handles = []
    for layer in hf.model.layers:
        handles.append(layer.register_forward_pre_hook(
            lambda m, args, kw: got["resid"].append((args[0] if args else kw["hidden_states"])[0].double()),
            with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(lambda m, a, out: got["attn"].append(out[0][0].double())))
        handles.append(layer.mlp.register_forward_hook(lambda m, a, out: got["mlp"].append(out[0].double())))
    try:
        with torch.no_grad():
            weights = hf(ids, output_attentions=True).attentions
    finally:
        for h in handles:
            h.remove()
    L, n = len(hf.model.layers), ids.shape[1]
    heads, res_a, bias_a, mlp, res_m = np.zeros((L, H, n, n)), *np.zeros((4, L, n))

    def prox(y, part):
        return max(0.0, float(y.abs().sum() - (y - part).abs().sum()))

    with torch.no_grad():
        for l, block in enumerate(hf.model.layers):
            x = got["resid"][l].float()
            v = block.self_attn.v_proj(block.input_layernorm(x)).double()                    # (n, Hkv * Dh)
            o = block.self_attn.o_proj
            b = o.bias.double() if o.bias is not None else torch.zeros(x.shape[-1], dtype=torch.float64)
            mid = got["resid"][l] + got["attn"][l]
            for i in range(n):
                p = np.zeros((H, n))
                for h in range(H):
                    g = h // (H // Hkv)
                    write = o.weight[:, h * Dh:(h + 1) * Dh].double() @ v[:, g * Dh:(g + 1) * Dh].T   # (E, n)
                    for j in range(n):
                        p[h, j] = prox(mid[i], weights[l][0, h, i, j].double() * write[:, j])
                r, c = prox(mid[i], got["resid"][l][i]), prox(mid[i], b)
                total = p.sum() + r + c
                heads[l, :, i], res_a[l, i], bias_a[l, i] = p / total, r / total, c / total
                out = mid[i] + got["mlp"][l][i]
                r, m = prox(out, mid[i]), prox(out, got["mlp"][l][i])
                res_m[l, i], mlp[l, i] = r / (r + m), m / (r + m)
    return heads, res_a, bias_a, mlp, res_m


def test_the_flow_shares_equal_a_recomputation_with_hooks_and_sum_to_one(decoder):
    family, ours, theirs, hf, tok = decoder
    flow = prediction_flow(theirs, CLEAN)
    s = flow.shares
    want = _hf_shares(hf, tok, CLEAN)
    for got, expected in zip((s.heads, s.attn_residual, s.attn_bias, s.mlp, s.mlp_residual), want):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(s.heads.sum((1, 3)) + s.attn_residual + s.attn_bias, 1, atol=1e-9)
    np.testing.assert_allclose(s.mlp + s.mlp_residual, 1, atol=1e-9)
    assert np.all(np.triu(s.heads, 1) == 0)  # no head brings anything from a later token
    if family == "mistral":  # sliding window of 5: nothing from 5 or more tokens back
        n = len(flow.tokens)
        far = np.tril(np.ones((n, n), dtype=bool), -5)
        assert np.all(s.heads[..., far] == 0)
    if family == "llama":  # o_proj has a bias, which takes a share of its own
        assert s.attn_bias.max() > 0.01


def test_the_graph_keeps_every_edge_above_the_threshold_that_reaches_the_prediction(decoder):
    family, ours, theirs, hf, tok = decoder
    heads, res_a, bias_a, mlp, res_m = _hf_shares(hf, tok, CLEAN)
    flow = prediction_flow(ours, CLEAN)
    n = len(flow.tokens)
    for position, threshold in ((-1, THRESHOLD), (6, 0.1)):
        graph = flow_graph(flow, position, threshold)
        want, reached = [], {position % n}
        for l in (1, 0):  # independently: every edge at or above the threshold into a state that is reached
            after_mlp = set()
            for i in reached:
                want += [("mlp", l, -1, i, i, mlp[l, i])] * int(mlp[l, i] >= threshold)
                want += [("residual", l, -1, i, i, res_m[l, i])] * int(res_m[l, i] >= threshold)
                after_mlp |= {i} if max(mlp[l, i], res_m[l, i]) >= threshold else set()
            reached = set()
            for i in after_mlp:
                if res_a[l, i] >= threshold:
                    want.append(("residual", l, -1, i, i, res_a[l, i]))
                    reached.add(i)
                for h, j in zip(*np.nonzero(heads[l, :, i] >= threshold)):
                    want.append(("head", l, int(h), int(j), i, heads[l, h, i, j]))
                    reached.add(int(j))
        key = lambda e: e[:5]  # noqa: E731
        rows = sorted(graph[["kind", "layer", "head", "source", "target", "share"]].itertuples(index=False, name=None),
                      key=key)
        want = sorted(want, key=key)
        assert [r[:5] for r in rows] == [w[:5] for w in want]
        np.testing.assert_allclose([r[5] for r in rows], [w[5] for w in want], atol=1e-5)
        assert graph["share"].min() >= threshold
        np.testing.assert_allclose(flow_heads(flow, position, threshold), _through_heads(graph), atol=1e-9)


def _through_heads(graph):
    """By brute force: every path from the graph's end down to each head's edge, its shares multiplied, summed."""
    out = np.zeros((2, 4))
    top, end = int(graph["to_level"].max()), graph.attrs["position"]
    rows = list(graph.itertuples())

    def down(level, token, product):
        for e in rows:
            if e.to_level == level and e.target == token:
                if e.kind == "head":
                    out[e.layer, e.head] += product * e.share
                down(level - 1, e.source, product * e.share)

    down(top, end, 1.0)
    return out


def _all_routes(graph):
    """Every route from an embedding to the graph's end, by brute force: lists of row positions."""
    top, end = int(graph["to_level"].max()), graph.attrs["position"]
    routes = []

    def down(level, token, path):
        if level == 0:
            routes.append(path[::-1])
            return
        for k, e in enumerate(graph.itertuples()):
            if e.to_level == level and e.target == token:
                down(level - 1, e.source, path + [k])

    down(top, end, [])
    return routes


def test_the_strongest_route_is_the_best_product_through_a_head(decoder):
    family, ours, theirs, hf, tok = decoder
    graph = flow_graph(prediction_flow(ours, CLEAN), threshold=0.05)
    routes = _all_routes(graph)
    assert routes

    def product(route):
        return float(np.prod(graph["share"].to_numpy()[route]))

    with_head = [r for r in routes if (graph["kind"].to_numpy()[r] == "head").any()]
    best = max(with_head or routes, key=product)
    found = strongest_route(graph)
    assert float(np.prod(found["share"])) == pytest.approx(product(best), rel=1e-9)
    assert found["to_level"].tolist() == list(range(1, int(graph["to_level"].max()) + 1))
    assert (found["kind"] == "head").any() == bool(with_head)
    for below, above in zip(found.itertuples(), found.iloc[1:].itertuples()):
        assert below.target == above.source  # one connected route


def test_what_cannot_be_read_gets_a_sentence(decoder, hf_model):
    family, ours, theirs, hf, tok = decoder
    with pytest.raises(HeadLensError, match="no head L2 H0"):
        head_vocabulary(ours, CLEAN, 2, 0)
    with pytest.raises(HeadLensError, match="no position 99"):
        head_vocabulary(ours, CLEAN, 0, 0, position=99)
    with pytest.raises(HeadLensError, match="at least one token"):
        head_vocabulary(ours, CLEAN, 0, 0, k=0)
    flow = prediction_flow(ours, CLEAN)
    with pytest.raises(HeadLensError, match="above 0 and at most 1"):
        flow_graph(flow, threshold=0)
    with pytest.raises(HeadLensError, match="encoder"):
        prediction_flow(hf_model, CLEAN)


def test_a_pruned_head_writes_nothing(tmp_path):
    model = one_head_model(tmp_path, pruned=True)
    with pytest.raises(HeadLensError, match="L0 H1 was pruned"):
        head_vocabulary(model, "cat sat on the mat", 0, 1)
    frame = copying_scores(model)
    assert np.isnan(frame.query("head == 1")["copying"].item())
    assert 0 <= frame.query("head == 0")["copying"].item() <= 1
    shares = prediction_flow(model, "cat sat on the mat").shares
    assert np.all(shares.heads[0, 1] == 0) and shares.heads[0, 0].sum() > 0


def test_smollm2s_heads_on_the_indirect_object_pair(smollm2):
    pair = PAIRS["Indirect object: Mary and John"]
    words = head_vocabulary(smollm2, pair.clean, 23, 3)
    down = [w.strip() for w in words.query("direction == 'down'")["text"].head(3)]
    assert "John" in down  # the head that attends to the repeated subject writes against it
    flow = prediction_flow(smollm2, pair.clean)
    graph = flow_graph(flow)
    route = strongest_route(graph)
    moved = route[route["kind"] == "head"]
    assert len(moved) == 1 and flow.tokens[int(moved["source"].iloc[0])] == "ĠMary"
    assert int(moved["layer"].iloc[0]) == 23
