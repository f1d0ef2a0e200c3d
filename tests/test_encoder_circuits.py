"""Circuits and the QK split on a post-LayerNorm encoder, against transformers' ``BertModel`` run with hooks: EAP edges
are each sender's change passed through transformers' own LayerNorms (their scales read by hooks on the clean run)
times the gradient at the receiver's input; an edge patched is the receiver's input rebuilt by transformers with
every sender's output frozen but that one's; a circuit of every edge or none is the clean or the corrupted run; a
head's score split sums to transformers' query times key."""
import numpy as np
import pytest
import torch
import transformers as tf

from analysis.circuits import graph as C
from analysis.circuits.scores import edge_scores, exact_edges, faithfulness, path_patching
from analysis.effects.readouts import SentenceEmbedding
from analysis.qk_attribution import qk_attribution
from analysis.tasks.build import make_task
from tests.test_encoder_effects import CLEAN, CORRUPTED, PROBES, metric, tiny_encoder


class HFGraph:
    """transformers' BERT run with hooks, as our graph names its nodes: the senders' outputs (the embeddings, each
    head's slice of the output projection through its columns, each feed-forward's write), each norm's input, each
    receiver's input; senders' outputs can be fixed and a receiver's input replaced or moved by ``extra``."""

    def __init__(self, hf, graph):
        self.hf, self.graph = hf, graph
        self.layers = hf.encoder.layer
        self.H = hf.config.num_attention_heads
        self.Dh = hf.config.hidden_size // self.H

    def run(self, ids, *, fix=None, replace=None, extra=None, grad=False):
        """``fix``: sender index -> its output (B, n, E) to write instead; ``replace``: receiver index -> its input
        (B, n, E); ``extra``: receiver index -> what is added to its input. Returns (last hidden state, senders'
        outputs (S, B, n, E), norm inputs per norm, each receiver level's stream: layer inputs, MLP inputs, output)."""
        fix, replace, extra = fix or {}, replace or {}, extra or {}
        g, H, Dh = self.graph, self.H, self.Dh
        outs, norms, handles = {}, [], []
        streams = {"layer": [], "mlp": []}

        def sender(kind, layer, index=-1):
            return g.senders.index((kind, layer, index))

        def input_of(kind, layer, index, x):  # a receiver's input: replaced, or moved by extra
            r = g.receivers.index((kind, layer, index))
            x = replace.get(r, x)
            return x + extra[r] if r in extra else x

        def emb_hook(m, args, out):
            outs[0] = out
            return fix.get(0, out)
        handles.append(self.hf.embeddings.register_forward_hook(emb_hook))
        for i, layer in enumerate(self.layers):
            att = layer.attention

            def pre_layer(m, args, kwargs, i=i):
                x = args[0] if args else kwargs["hidden_states"]
                streams["layer"].append(x)
            handles.append(layer.register_forward_pre_hook(pre_layer, with_kwargs=True))
            for kind, lin in (("q", att.self.query), ("k", att.self.key), ("v", att.self.value)):
                def proj(m, args, out, kind=kind, i=i):
                    x = args[0]
                    parts = []
                    for h in range(H):
                        mine = input_of(kind, i, h, x)
                        y = out if mine is x else torch.nn.functional.linear(mine, m.weight, m.bias)
                        parts.append(y[..., h * Dh:(h + 1) * Dh])
                    return torch.cat(parts, -1)
                handles.append(lin.register_forward_hook(proj))

            def pre_out(m, args, i=i):
                z = args[0]
                w = m.weight.view(-1, H, Dh)
                zs = []
                for h in range(H):
                    s = sender("head", i, h)
                    outs[s] = z[..., h * Dh:(h + 1) * Dh] @ w[:, h].T
                    if s in fix:  # the write is linear in z: solve for the z that writes the fixed output
                        zs.append(torch.linalg.lstsq(w[:, h], fix[s].reshape(-1, w.shape[0]).T).solution.T
                                  .reshape(*z.shape[:-1], Dh))
                    else:
                        zs.append(z[..., h * Dh:(h + 1) * Dh])
                return (torch.cat(zs, -1),)
            handles.append(att.output.dense.register_forward_pre_hook(pre_out))

            def pre_mlp(m, args, i=i):
                streams["mlp"].append(args[0])
                return (input_of("mlp", i, -1, args[0]),)
            handles.append(layer.intermediate.dense.register_forward_pre_hook(pre_mlp))

            def mlp_out(m, args, out, i=i):
                s = sender("mlp", i)
                outs[s] = out
                return fix.get(s, out)
            handles.append(layer.output.dense.register_forward_hook(mlp_out))
            for norm in (att.output.LayerNorm, layer.output.LayerNorm):
                handles.append(norm.register_forward_pre_hook(lambda m, args: norms.append((m, args[0]))))
        try:
            with torch.set_grad_enabled(grad):
                last = self.hf(input_ids=ids).last_hidden_state
        finally:
            for h in handles:
                h.remove()
        out = input_of("logits", g.n_layers, -1, last)
        streams["out"] = last
        return out, torch.stack([outs[s] for s in range(len(g.senders))]), norms, streams

    def levels(self) -> tuple[list[int], list[int]]:
        """Where each sender writes and each receiver reads, counted in norms (attention's, then the MLP's, in each
        layer): a sender's output first passes norm ``2l`` (a head of layer l), ``2l + 1`` (its MLP) or 0 (the
        embeddings); a receiver reads the stream after norms ``0 … 2l - 1`` (a head's q/k/v), ``… 2l`` (layer l's
        MLP), or all ``2L`` (the last hidden state)."""
        senders = [0 if kind == "input" else 2 * layer + (kind == "mlp") for kind, layer, _ in self.graph.senders]
        receivers = [2 * layer + (kind == "mlp") for kind, layer, _ in self.graph.receivers]
        return senders, receivers

    def eap(self, clean, bad, metric) -> np.ndarray:
        """``(senders, receivers)``: each edge's EAP score by transformers, ``metric(last hidden state)`` ``(B,)``'s
        derivative along the sender's clean - corrupted change, passed through the norms between (their scales
        frozen at the clean run) and added to the receiver's input."""
        _, out_clean, norms, _ = self.run(clean)
        _, out_bad, _, _ = self.run(bad)
        delta = (out_clean - out_bad).detach()
        norms = [(m, u.detach()) for m, u in norms]
        s_level, r_level = self.levels()
        want = np.zeros((len(self.graph.senders), len(self.graph.receivers)))
        for r in range(len(self.graph.receivers)):
            m = int(self.graph.reach[r])
            parts = torch.stack([self.through(delta[s], norms, s_level[s], r_level[r]) for s in range(m)])
            eps = torch.zeros(m, dtype=torch.float64, requires_grad=True)
            last, *_ = self.run(clean, extra={r: torch.einsum("s,sbne->bne", eps, parts)}, grad=True)
            want[:m, r] = torch.autograd.grad(metric(last).sum(), eps)[0].numpy()
        return want

    def through(self, part, norms, first, stop):
        """``part`` passed through norms ``first`` to ``stop`` (exclusive), transformers' own, their scales frozen
        at the inputs ``norms`` a run gave them; no bias."""
        for m, u in norms[first:stop]:
            part = (part - part.mean(-1, keepdim=True)) * m.weight / torch.sqrt(
                u.var(-1, unbiased=False, keepdim=True) + m.eps)
        return part


@pytest.fixture(scope="module")
def bert(tmp_path_factory, minilm_dir):
    name, ours, hooked, tok = tiny_encoder("bert", tmp_path_factory.mktemp("encoder-circuits"), minilm_dir)
    stack = ours.stack
    graph = C.graph_of(stack)
    ids = [tok(t, return_tensors="pt")["input_ids"] for t in (CLEAN, CORRUPTED)]
    w = hooked.along(tok, PROBES)
    measure = SentenceEmbedding(ours).probes([PROBES])
    return ours, stack, graph, HFGraph(hooked.hf, graph), ids, w, measure


def test_eap_edges_are_each_senders_change_through_frozen_norms_times_the_receivers_gradient(bert):
    ours, stack, graph, hf, (clean, bad), w, measure = bert
    rows = torch.zeros(1, dtype=torch.long)
    scores, run, bad_run = C.edge_attribution(stack, graph, clean, bad, measure, rows)
    want = hf.eap(clean, bad, lambda last: metric(last, w))
    np.testing.assert_allclose(scores.numpy(), want, atol=1e-9)
    assert np.abs(want).max() > 2e-3 and (np.abs(want) > 1e-5).sum() > 50  # edges that carry something


def test_an_encoders_edges_patched_are_the_receivers_input_rebuilt_with_that_sender_corrupted(bert):
    ours, stack, graph, hf, (clean, bad), w, measure = bert
    rows = torch.zeros(1, dtype=torch.long)
    with torch.inference_mode():
        bad_run = C.run_ids(stack, graph, bad, measure, rows)
        clean_run = C.run_ids(stack, graph, clean, measure, rows)
    last, out_clean, _, _ = hf.run(clean)
    _, out_bad, _, _ = hf.run(bad)
    m_clean, m_bad = float(metric(last, w)), float(metric(hf.run(bad)[0], w))
    assert float(clean_run.value) == pytest.approx(m_clean, abs=1e-10)
    assert float(bad_run.value) == pytest.approx(m_bad, abs=1e-10)
    every = C.all_edges(graph).double()
    with torch.inference_mode():
        assert float(C.circuit_values(stack, graph, clean, bad_run, every, measure, rows)) == \
            pytest.approx(m_clean, abs=1e-10)
        assert float(C.circuit_values(stack, graph, clean, bad_run, every * 0, measure, rows)) == \
            pytest.approx(m_bad, abs=1e-10)
    names = [graph.receiver_name(r) for r in range(len(graph.receivers))]
    chosen = [names.index(n) for n in ("embedding", "MLP 1", "L1 H2.q", "L1 H1.k", "L1 H3.v", "MLP 0")]
    fixed = {s: out_clean[s].detach() for s in range(len(graph.senders))}
    moved = []
    for r in chosen:
        kind, layer, _ = graph.receivers[r]
        for s in range(int(graph.reach[r])):
            with torch.inference_mode():
                got = float(C.patched_values(stack, graph, clean_run, bad_run, [(s, r)], measure, rows))
            # transformers: every sender's output frozen at the clean run's but s's, the corrupted one's
            _, _, _, streams = hf.run(clean, fix={**fixed, s: out_bad[s].detach()})
            x = streams["out"] if kind == "logits" else streams["mlp"][layer] if kind == "mlp" else \
                streams["layer"][layer]
            last, *_ = hf.run(clean, replace={r: x.detach()})
            want = float(metric(last, w))
            assert got == pytest.approx(want, abs=1e-9), (graph.sender_name(s), names[r])
            moved.append(abs(want - m_clean))
    assert max(moved) > 1e-3  # edges that move the metric (a span of about 0.01 on this tiny model)


def test_an_encoders_circuits_run_over_a_focus_task_as_transformers_hooks(scratch_model, minilm_hf):
    """MiniLM's objects task, each pair against transformers' BertModel run with hooks: the clean and corrupted
    metrics (and so the span path patching divides by), the top edge patched exactly, the circuit of every edge but
    that one, the circuit of every edge but the last-ranked one (through ``circuit_values``, whose faithfulness is
    read from them), and a head's paths into every query, key and value of the last layer."""
    from analysis.circuits.scores import circuit_values
    from analysis.tasks.effects import measure_for
    from tests.test_encoder_effects import Hooked

    task = make_task(scratch_model, "objects", 8, seed=2)
    scores = edge_scores(scratch_model, task, "eap_ig", steps=3)
    graph = scores.graph
    assert scores.metric == "embedding" and np.isfinite(scores.scores).all()
    hf, hooked, tok = HFGraph(minilm_hf, graph), Hooked("bert", minilm_hf), scratch_model.tokenizer
    (s, r), = zip(*(a[:1] for a in scores.ranked()))
    last = np.argwhere(C.all_edges(graph).numpy() * (1 - scores.top(graph.n_edges - 1)) > 0)
    (s_last, r_last), = last
    sender = graph.senders.index(("head", 3, 11))
    paths = [graph.receivers.index((kind, 5, h)) for h in range(12) for kind in "qkv"]

    def rebuilt(ids, out_clean, out_bad, corrupted_senders, receivers):
        """The metric with ``receivers`` reading the stream rebuilt from every sender's clean output but the
        ``corrupted_senders``', the corrupted run's."""
        fix = {i: out_clean[i].detach() for i in range(len(graph.senders))}
        fix.update({i: out_bad[i].detach() for i in corrupted_senders})
        _, _, _, streams = hf.run(ids, fix=fix)
        replace = {}
        for rec in receivers:
            kind, layer, _ = graph.receivers[rec]
            replace[rec] = (streams["out"] if kind == "logits" else streams["mlp"][layer] if kind == "mlp" else
                            streams["layer"][layer]).detach()
        return replace

    into_out = graph.receivers.index(("logits", 6, -1))
    last_layer = [graph.senders.index(("head", 5, h)) for h in range(12)]  # every last-layer head into the output
    want = {k: [] for k in ("clean", "bad", "top", "last", "path", "group")}
    for pair in task.pairs:
        w = hooked.along(tok, pair.probes)
        ids = [torch.tensor([p]) for p in (pair.clean_ids, pair.corrupted_ids)]
        out, out_clean, _, _ = hf.run(ids[0])
        bad_last, out_bad, _, _ = hf.run(ids[1])
        m = lambda replace: float(metric(hf.run(ids[0], replace=replace)[0], w))  # noqa: E731
        want["clean"].append(float(metric(out, w)))
        want["bad"].append(float(metric(bad_last, w)))
        want["top"].append(m(rebuilt(ids[0], out_clean, out_bad, [s], [r])))
        want["last"].append(m(rebuilt(ids[0], out_clean, out_bad, [s_last], [r_last])))
        want["path"].append(m(rebuilt(ids[0], out_clean, out_bad, [sender], paths)))
        want["group"].append(m(rebuilt(ids[0], out_clean, out_bad, last_layer, [into_out])))
    want = {k: np.array(v) for k, v in want.items()}
    span = want["clean"] - want["bad"]
    np.testing.assert_allclose(scores.clean, want["clean"], atol=1e-5)
    np.testing.assert_allclose(scores.corrupted, want["bad"], atol=1e-5)
    assert span.mean() > 0.05
    exact = exact_edges(scratch_model, task, [(s, r)])[:, 0]
    np.testing.assert_allclose(exact, want["clean"] - want["top"], atol=1e-5)
    assert np.abs(exact).max() > 1e-3
    # circuits run by the model, not copied: every edge; every edge but the top one, which alone carries the
    # corrupted output; every edge but the last layer's heads' into the output
    measure = measure_for(scratch_model, task, "embedding")
    every = C.all_edges(graph).double()
    but_top, but_group = every.clone(), every.clone()
    but_top[s, r] = 0
    but_group[last_layer, into_out] = 0
    for k, pair in enumerate(task.pairs):  # a pair at a time: their lengths differ
        rows = torch.tensor([k])
        with torch.inference_mode():
            bad = C.run_ids(scratch_model.stack, graph, torch.tensor([pair.corrupted_ids]), measure, rows)
            for keep, name in ((every, "clean"), (but_top, "top"), (but_group, "group")):
                got = C.circuit_values(scratch_model.stack, graph, torch.tensor([pair.clean_ids]), bad, keep,
                                       measure, rows)
                assert float(got) == pytest.approx(want[name][k], abs=1e-5), name
    assert np.abs(want["group"] - want["clean"]).max() > 1e-2
    values, clean, corrupted = circuit_values(scratch_model, scores, [0, graph.n_edges - 1])
    np.testing.assert_allclose(values[:, 0], want["bad"], atol=1e-5)
    np.testing.assert_allclose(values[:, 1], want["last"], atol=1e-5)
    curve = faithfulness(scratch_model, scores, sizes=[0, graph.n_edges - 1])
    np.testing.assert_allclose(curve.faithfulness, [0.0, (want["last"] - want["bad"]).mean() / span.mean()],
                               atol=1e-4)
    path = path_patching(scratch_model, task, (3, 11), [(5, h) for h in range(12)], kinds="qkv")
    assert len(path.receivers) == 36 and path.low <= path.share <= path.high
    np.testing.assert_allclose(path.span, span, atol=1e-5)
    np.testing.assert_allclose(path.effects, want["clean"] - want["path"], atol=1e-5)
    assert path.share == pytest.approx((want["clean"] - want["path"]).mean() / span.mean(), abs=1e-4)


@pytest.fixture(scope="module")
def minilm_hf(minilm_dir):
    return tf.AutoModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()


@pytest.mark.parametrize("layer, head, query", [(3, 11, 1), (5, 11, 9), (2, 0, 4)])
def test_minilms_qk_split_sums_to_transformers_scores_and_removing_a_writer_frozen_is_its_prediction(
        scratch_model, minilm_hf, layer, head, query):
    split = qk_attribution(scratch_model, CLEAN, layer, head, query)
    graph = C.graph_of(scratch_model.stack)
    hf = HFGraph(minilm_hf, graph)
    ids = scratch_model.tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    attentions = minilm_hf(input_ids=ids, output_attentions=True).attentions[layer][0, head, query].detach()
    _, outs, norms, streams = hf.run(ids)
    x = streams["layer"][layer][0].detach()
    att = minilm_hf.encoder.layer[layer].attention.self
    Dh = hf.Dh
    sl = slice(head * Dh, (head + 1) * Dh)
    q = att.query(x)[query, sl].detach()
    k = att.key(x)[:, sl].detach()
    scores = (k @ q / Dh ** 0.5).double().numpy()
    assert split.n_keys == len(split.tokens) == x.shape[0]  # an encoder's query sees every key
    np.testing.assert_allclose(split.scores, scores, atol=1e-4 * np.abs(scores).max())
    np.testing.assert_allclose(split.weights, attentions.double().numpy(), atol=1e-5)
    # each of the query side's largest writers taken out of the query's stream, passed through the norms frozen
    norms = [(m, u.detach()) for m, u in norms]
    s_level, _ = hf.levels()
    fixed = {i: outs[i].detach() for i in range(len(graph.senders))}

    def part_of(writer):  # a writer's output as the head reads it: through the norms above it, frozen
        i = split.writers.index(writer)
        return hf.through(outs[i].detach(), norms, int(s_level[i]), 2 * layer)[0]

    def weight_of(q_in, k_in):  # the key's weight from the query's and the keys' streams
        less = (att.key(k_in)[:, sl] @ att.query(q_in)[sl] / Dh ** 0.5).double()
        return torch.softmax(less.detach(), 0)[split.key].item()

    def without(writer):  # transformers' layer input with the writer's output zeroed, every norm recomputed
        i = split.writers.index(writer)
        _, _, _, streams = hf.run(ids, fix={**fixed, i: torch.zeros_like(fixed[i])})
        return streams["layer"][layer][0].detach()

    checked = 0
    for side, frame in (("q", split.query_writers()), ("k", split.key_writers())):
        for row in frame.head(4).itertuples():
            if row.writer == "biases":
                continue
            part = part_of(row.writer)
            if side == "q":
                frozen_out, run_out = weight_of(x[query] - part[query], x), weight_of(without(row.writer)[query], x)
            else:
                frozen_out, run_out = weight_of(x[query], x - part), weight_of(x[query], without(row.writer))
            assert row.weight_without == pytest.approx(frozen_out, abs=1e-5), (side, row.writer)
            if not np.isnan(row.weight_without_run):
                assert row.weight_without_run == pytest.approx(run_out, abs=1e-5), (side, row.writer)
                checked += 1
    assert checked >= 2  # the runs with a writer taken out, on both sides
    # each of the largest writer pairs: the query writer's part projected by the query, the key writer's by the key
    pairs = [row for row in split.pairs(n=8).itertuples() if "biases" not in (row.query_writer, row.key_writer)]
    for row in pairs:
        q_part = part_of(row.query_writer)[query] @ att.query.weight[sl].detach().T
        k_part = part_of(row.key_writer)[split.key] @ att.key.weight[sl].detach().T
        assert row.part == pytest.approx(float((q_part @ k_part).detach()) / Dh ** 0.5, abs=1e-4 * np.abs(scores).max())
    assert len(pairs) >= 3
