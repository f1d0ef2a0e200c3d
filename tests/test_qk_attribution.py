"""Why a head attends there, on tiny random Llama (attention biases, grouped key/value heads) and Gemma 3 (QK-norm,
a sliding window, norms after each part) decoders in float64: each (query-side writer, key-side writer) pair's part
of a score against the same part computed through transformers' own modules with hooks (norm scales frozen at the
run's), the parts' sum against the model's score and its softmax against transformers' attention; taking a writer
out of the query or the key input by hand with hooks against the split's prediction; the task form against the
single-prompt form; a hand-set previous-token head feeding an induction head."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from analysis import qk_attribution as QA
from analysis.tasks import Task, TaskPair
from models import HeadLensError, load_model
from analysis.circuits import graph as C
from analysis.qk_attribution import split as Q
from tests import test_gemma3
from tests.test_circuits import hf_run
from tests.test_llama import build as build_llama

N = 12  # tokens a prompt: past Gemma 3's window of 6


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def family(request, tmp_path_factory):
    """(name, ours in float64, transformers' CausalLM in float64, the model as loaded)."""
    folder = tmp_path_factory.mktemp(f"qk-{request.param}")
    if request.param == "llama":
        _, folder, hf, _ = build_llama("llama", folder)      # q/k/v/o biases, 4 heads on 2 key/value heads
    else:
        folder, hf, _ = test_gemma3.build(folder, 2)
    model = load_model(folder, backend="scratch")
    return request.param, copy.deepcopy(model.stack).double(), copy.deepcopy(hf).double(), model


def ids_for(vocab: int, seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.randint(5, vocab, (batch, N), generator=torch.Generator().manual_seed(seed))


# --- the reference: transformers' own modules, hooked ------------------------------------------------------------

def hf_sides(name: str, hf, ids: torch.Tensor, layer: int, head: int, minus: dict | None = None):
    """Each writer's part of head ``head``'s query and key at every position (``(writers + 1, B, n, Dh)``, the
    constant last), through transformers' norm weights, projections, QK-norm and rotary with every norm's scale
    frozen at the run's; the model's own scores ``(B, n, n)`` from its projections' outputs; its attention."""
    cfg = hf.config
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    Dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    g = head // (H // G)
    emb = hf.model.embed_tokens(ids).detach()
    senders, _, _ = hf_run(name, hf, emb)
    got = {}
    block = hf.model.layers[layer]
    attn = block.self_attn
    hooks = [attn.register_forward_pre_hook(lambda m, a, kw: got.update(kw), with_kwargs=True),
             attn.q_proj.register_forward_hook(lambda m, a, out: got.__setitem__("q", out)),
             attn.k_proj.register_forward_hook(lambda m, a, out: got.__setitem__("k", out))]
    try:
        with torch.no_grad():
            out = hf(inputs_embeds=emb, output_hidden_states=True, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    x = out.hidden_states[layer]                                                      # (B, n, E)
    m = 1 + layer * (H + 1)
    parts = torch.cat([senders[:m], (x - senders[:m].sum(0)).unsqueeze(0)])           # (writers + 1, B, n, E)
    norm = block.input_layernorm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    gain = (1 + norm.weight) if name == "gemma3" else norm.weight
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    cos, sin = got["position_embeddings"]
    module = __import__(type(attn).__module__, fromlist=["apply_rotary_pos_emb"])
    sides = []
    for kind, index in (("q", head), ("k", g)):
        proj = getattr(attn, f"{kind}_proj")
        rows = slice(index * Dh, (index + 1) * Dh)
        side = F.linear(parts * r * gain, proj.weight[rows])                         # (writers + 1, B, n, Dh)
        if proj.bias is not None:
            side[-1] += proj.bias[rows]
        if name == "gemma3":  # QK-norm, its scale frozen at the whole projection's
            qk = getattr(attn, f"{kind}_norm")
            whole = got[kind][..., rows]
            side = side * torch.rsqrt(whole.pow(2).mean(-1, keepdim=True) + qk.eps) * (1 + qk.weight)
        sides.append(side)
    q, k = sides
    q, _ = module.apply_rotary_pos_emb(q, q, cos, sin, unsqueeze_dim=0)
    _, k = module.apply_rotary_pos_emb(k, k, cos, sin, unsqueeze_dim=0)
    q = q * attn.scaling
    whole_q, whole_k = got["q"][..., head * Dh:(head + 1) * Dh], got["k"][..., g * Dh:(g + 1) * Dh]
    if name == "gemma3":
        whole_q, whole_k = attn.q_norm(whole_q), attn.k_norm(whole_k)
    wq, wk = module.apply_rotary_pos_emb(whole_q.unsqueeze(1), whole_k.unsqueeze(1), cos, sin)
    scores = (wq @ wk.transpose(-1, -2))[:, 0] * attn.scaling                         # (B, n, n)
    return q.detach(), k.detach(), scores.detach(), out.attentions[layer][:, head].detach()


def test_every_writer_pair_equals_transformers_modules_and_sums_to_the_score(family):
    name, stack, hf, _ = family
    graph = C.graph_of(stack)
    ids = ids_for(hf.config.vocab_size)
    run = Q.writers_run(stack, graph, ids)
    for layer, head in ((1, 3), (stack.n_layers - 1, 0)):
        sides = Q.head_sides(stack, graph, run, layer, head)
        q, k, scores, weights = hf_sides(name, hf, ids, layer, head)
        assert sides.q.shape == q.shape and sides.q.shape[0] == 1 + layer * (stack.n_heads + 1) + 1
        for query in (N - 1, 4):
            split = sides.split(query)                                               # (W, W, B, keys)
            theirs = torch.einsum("sbd,tbjd->stbj", q[:, :, query], k[:, :, :query + 1])
            top = float(theirs.abs().max())
            # transformers' RMSNorm and rotary angles run in float32 even in a float64 model: 1e-5 of the largest part
            torch.testing.assert_close(split, theirs, atol=1e-5 * top, rtol=1e-4)
            # the parts sum to the model's own score, and its softmax over the keys it sees is the model's attention
            total = split.sum((0, 1))
            size = float(scores[:, query, :query + 1].abs().max())
            torch.testing.assert_close(total, scores[:, query, :query + 1], atol=1e-5 * size, rtol=1e-5)
            visible = sides.visible(query)
            masked = total.masked_fill(~visible, float("-inf"))
            torch.testing.assert_close(torch.softmax(masked, -1), weights[:, query, :query + 1], atol=1e-6, rtol=0)
    if name == "gemma3":  # a sliding-window layer past its window: the last query sees only its last keys
        assert stack.layers[0].attn.window == test_gemma3.WINDOW
        assert int(Q.head_sides(stack, graph, run, 0, 0).visible(N - 1).sum()) == test_gemma3.WINDOW


def hf_weights_without(name: str, hf, ids, layer: int, head: int, part: torch.Tensor, side: str, query: int,
                       frozen: bool) -> torch.Tensor:
    """transformers' attention of ``head`` from ``query`` with ``part`` ``(B, n, E)`` taken out of the stream its
    queries (at ``query``) or its keys (everywhere) read, put in by a hook on ``q_proj`` or ``k_proj``'s input;
    ``frozen``: the input norm's scale (and the QK-norm's) kept at the run's, else recomputed."""
    block = hf.model.layers[layer]
    norm = block.input_layernorm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    gain = (1 + norm.weight) if name == "gemma3" else norm.weight
    seen = {}

    def take_out(m, a):
        h, x = a[0].clone(), seen["x"]
        seen["h"] = a[0]
        rows = slice(query, query + 1) if side == "q" else slice(None)
        if frozen:
            h[:, rows] -= part[:, rows] * torch.rsqrt(x[:, rows].pow(2).mean(-1, keepdim=True) + eps) * gain
        else:
            less = x.clone()
            less[:, rows] -= part[:, rows]
            h[:, rows] = norm(less)[:, rows]
        return (h,)

    def frozen_qk_norm(m, a, out):  # Gemma 3's QK-norm at the scale of the projection the run made
        B, n, _ = seen["h"].shape
        proj = getattr(block.self_attn, f"{side}_proj")  # called without its hook, on the run's own input
        whole = F.linear(seen["h"], proj.weight, proj.bias).view(B, n, -1, out.shape[-1]).transpose(1, 2)
        return a[0] * torch.rsqrt(whole.pow(2).mean(-1, keepdim=True) + m.eps) * (1 + m.weight)

    hooks = [block.register_forward_pre_hook(lambda m, a, kw: seen.__setitem__("x", a[0] if a else
                                                                               kw["hidden_states"]), with_kwargs=True),
             getattr(block.self_attn, f"{side}_proj").register_forward_pre_hook(take_out)]
    if frozen and name == "gemma3":
        hooks.append(getattr(block.self_attn, f"{side}_norm").register_forward_hook(frozen_qk_norm))
    try:
        with torch.no_grad():
            out = hf(input_ids=ids, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    return out.attentions[layer][:, head, query]


def test_taking_a_writer_out_changes_the_score_by_its_parts_and_the_weight_as_the_split_says(family):
    name, stack, hf, _ = family
    graph = C.graph_of(stack)
    ids = ids_for(hf.config.vocab_size, seed=1)
    layer, head, query = stack.n_layers - 1, 1, N - 1
    run = Q.writers_run(stack, graph, ids)
    sides = Q.head_sides(stack, graph, run, layer, head)
    split = sides.split(query)                                                        # (W, W, B, keys)
    scores = split.sum((0, 1))
    visible = sides.visible(query)
    key = int(torch.softmax(scores[0].masked_fill(~visible, -torch.inf), -1).argmax())
    m = split.shape[0] - 1
    s, t = np.unravel_index(int(split[:m, :m, 0, key].abs().argmax()), (m, m))  # the top pair of two nodes
    for side, writer, less in (("q", s, split[s].sum(0)), ("k", t, split[:, t].sum(0))):
        predicted = torch.softmax((scores - less).masked_fill(~visible, -torch.inf), -1)
        part = run.outs[writer].double()
        frozen = hf_weights_without(name, hf, ids, layer, head, part, side, query, frozen=True)
        torch.testing.assert_close(predicted, frozen[:, :query + 1], atol=1e-6, rtol=0)
        # the score by exactly the split's amount: the log-weights' differences between keys move by it
        theirs = torch.log(frozen[0, :query + 1][visible]) - torch.log(
            hf_weights_without(name, hf, ids, layer, head, part * 0, side, query, frozen=True)[0, :query + 1][visible])
        ours = -less[0][visible]
        torch.testing.assert_close(theirs - theirs[0], ours - ours[0], atol=1e-5 * float(less.abs().max()), rtol=0)
        # the run with the norm recomputed, which the frames set beside the split's prediction
        real = Q.scores_without(stack, graph, run, layer, head, query, int(writer), side)
        recomputed = hf_weights_without(name, hf, ids, layer, head, part, side, query, frozen=False)
        torch.testing.assert_close(torch.softmax(real.masked_fill(~visible, -torch.inf), -1),
                                   recomputed[:, :query + 1], atol=1e-6, rtol=0)


def test_the_frames_on_a_prompt(family):
    name, _, hf, model = family
    text = "the cat sat on the mat and the cat ran"
    split = QA.qk_attribution(model, text, 1, 2, query=-1)
    assert split.query == len(split.tokens) - 1 and split.tokens == model.tokenizer.convert_ids_to_tokens(
        model.tokenizer(text)["input_ids"])
    assert split.key == int(np.argmax(split.weights))
    att = model.attend(text)
    np.testing.assert_allclose(split.weights, att.weights[1, 2, split.query, :split.query + 1], atol=1e-5)
    pairs = split.pairs()
    assert len(pairs) == len(split.writers) ** 2 and split.writers[-1] == Q.CONSTANT
    assert abs(pairs.part.sum() - split.scores[split.key]) < 1e-4 * max(1, abs(split.scores[split.key]))
    assert abs(pairs.share.sum() - 1) < 1e-4 and pairs.part.abs().is_monotonic_decreasing
    rows, cols, grid = split.grid(n=3)
    assert rows[-1] == cols[-1] == QA.REST and grid.shape == (4, 4)
    assert abs(grid.sum() - split.scores[split.key]) < 1e-4 * max(1, abs(split.scores[split.key]))
    q = split.query_writers()
    assert abs(q.part.sum() - split.scores[split.key]) < 1e-4 * max(1, abs(split.scores[split.key]))
    assert q.weight_without_run.notna().sum() == min(QA.REMOVED, len(split.writers) - 1)
    keys = split.keys()
    assert len(keys) == split.query + 1 and keys.weight.idxmax() == split.key
    assert split.to_json()["pairs"][0]["query_writer"] == pairs.query_writer[0]
    with pytest.raises(HeadLensError, match="not a position"):
        QA.qk_attribution(model, text, 1, 2, query=99)
    with pytest.raises(HeadLensError, match="no head 9"):
        QA.qk_attribution(model, text, 1, 9)


def test_the_task_form_equals_the_prompt_form_pair_by_pair(family):
    name, _, hf, model = family
    vocab = hf.config.vocab_size
    ids = ids_for(vocab, seed=3, batch=3).tolist()
    bad = [row[:4] + [(row[4] + 1) % vocab] + row[5:] for row in ids]
    tok = model.tokenizer
    pairs = tuple(TaskPair(tok.decode(a), tok.decode(b), tuple(a), tuple(b), 7, 9, (("A", 2), ("END", N - 1)))
                  for a, b in zip(ids, bad))
    task = Task("mine", "hand-made", pairs)
    got = QA.qk_attribution_task(model, task, 2 if name == "gemma3" else 1, 0, "END", "A", batch_pairs=2)
    ours = model.scratch()
    for i, (a, b) in enumerate(zip(ids, bad)):
        for which, row in (("clean", a), ("corrupted", b)):
            run = Q.writers_run(ours.stack, C.graph_of(ours.stack), torch.tensor([row]))
            one = Q.head_sides(ours.stack, C.graph_of(ours.stack), run, got.layer, 0).split(N - 1)[:, :, 0, 2]
            np.testing.assert_allclose(got.parts(which)[i], one.double().numpy(), atol=1e-5)
    frame = got.frame("difference", n=5)
    diff = got.parts("difference").reshape(3, -1)
    top = np.argsort(-np.abs(diff.mean(0)), kind="stable")[:5]
    np.testing.assert_allclose(frame.part, diff.mean(0)[top])
    assert (frame.part_lo <= frame.part + 1e-12).all() and (frame.part <= frame.part_hi + 1e-12).all()
    with pytest.raises(HeadLensError, match="roles"):
        QA.qk_attribution_task(model, task, 1, 0, "END", "S2")


WORDS = ["the", "apple", "river", "stone", "cloud", "green", "house", "light", "music", "night", "paper", "quiet",
         "sugar", "table", "water", "yellow", "bread", "chair", "dream", "field", "glass", "horse", "juice", "lemon",
         "money", "ocean", "plant", "queen", "radio", "sheep"]


@pytest.fixture(scope="module")
def induction_pair(tmp_path_factory):
    """A two-layer attention-only decoder set by hand: layer 0 head 0 attends to the previous token and writes its
    identity into a subspace of its own; layer 1 head 0 matches the current token against that subspace in its
    keys, an induction head. Tokens, positions and the previous token each have their own dimensions."""
    from models.stacks.decoder import Decoder, DecoderConfig
    from models.vocab import word_tokenizer

    P = 32
    tokenizer = word_tokenizer(WORDS, lowercase=True, max_len=P)
    V = len(tokenizer)
    E = 2 * V + P + (2 * V + P) % 2
    Dh = E // 2
    stack = Decoder.untrained(DecoderConfig(vocab_size=V, max_len=P, n_layers=2, n_heads=2, d_model=E), seed=2)
    eye = torch.eye
    with torch.no_grad():
        stack.tok_emb.weight.zero_()
        stack.tok_emb.weight[:, :V] = 6 * eye(V)
        stack.pos_emb.weight.zero_()
        stack.pos_emb.weight[:, V:V + P] = 6 * eye(P)
        first, second = stack.layers[0].attn, stack.layers[1].attn
        for attn in (first, second):
            attn.in_proj_weight[:Dh].zero_()
            attn.in_proj_weight[E:E + Dh].zero_()
        w = first.in_proj_weight
        w[:P, V:V + P] = 4 * eye(P)                                   # query: its own position
        w[E + 1:E + P, V:V + P - 1] = 4 * eye(P - 1)                  # key at j: position j + 1
        w[2 * E:2 * E + Dh].zero_()
        w[2 * E:2 * E + V, :V] = eye(V)                               # value: the token
        first.out_proj.weight[:, :Dh] = 0
        first.out_proj.weight[V + P:2 * V + P, :V] = 6 * eye(V)       # written as "the token before me"
        w = second.in_proj_weight
        w[:V, :V] = 4 * eye(V)                                        # query: the current token
        w[E:E + V, V + P:2 * V + P] = 4 * eye(V)                      # key: the token before it
        gen = torch.Generator().manual_seed(3)                         # small biases, which the split names
        for p in (first.in_proj_bias, first.out_proj.bias, second.in_proj_bias, stack.layers[1].ln_attn.bias):
            p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    folder = tmp_path_factory.mktemp("induction-pair")
    stack.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return load_model(folder, backend="scratch")


def test_an_induction_heads_key_is_made_by_the_previous_token_head(induction_pair):
    from analysis import head_detector
    from analysis.detector import detector_labels
    from analysis.qk_attribution.induction import induction_key_writers

    model = induction_pair
    detector = head_detector(model, n_sequences=8, length=8, sentences=["the apple and the river"] * 4)
    labels = dict(zip(zip(detector.layer, detector["head"]), detector_labels(detector)))
    assert labels[(0, 0)] == "previous token" and labels[(1, 0)] == "induction"
    found = induction_key_writers(model, detector, prompts=10, length=8)
    assert set(found.frame["head"]) == {f"L1 H{h}" for (layer, h), lab in labels.items()
                                        if layer == 1 and lab == "induction"}
    mine = found.frame[found.frame["head"] == "L1 H0"]
    assert len(mine) == 10 and (mine.writer == "L0 H0").all() and mine.previous_token.all()
    share, low, high = found.share_previous_token()
    assert share == found.frame.previous_token.mean() and low <= share <= high and low > 0.6
    # on one prompt: the induction key's largest key-side part is the previous-token head's, the query's the token's
    text = "the apple river stone cloud apple river"
    split = QA.qk_attribution(model, text, 1, 0, query=-2)
    # a trained decoder's LayerNorm (centred, with a bias) and attention biases: the parts still make its attention
    weights = model.attend(text).weights[1, 0, split.query, :split.query + 1]
    np.testing.assert_allclose(split.weights, weights, atol=1e-5)
    assert split.key == 2                                             # "apple" again attends to what followed it
    assert split.key_writers().writer.iloc[0] == "L0 H0" and split.query_writers().writer.iloc[0] == "input"
    assert split.pairs().iloc[0][["query_writer", "key_writer"]].tolist() == ["input", "L0 H0"]
    assert split.pairs().query_writer.eq(Q.CONSTANT).any()
    assert abs(split.side("k").set_index("writer").part[Q.CONSTANT]) > 0
