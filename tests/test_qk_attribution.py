"""Why a head attends there, on tiny random Llama (attention biases, grouped key/value heads), Gemma 3 (QK-norm, a
sliding window, norms after each part), Gemma 2 (soft-capped scores) and OLMo-2 (no norm before the attention, a
norm over the whole query and key projections) decoders in float64: each (query-side writer, key-side writer)
pair's part of a score against the same part computed through transformers' own modules with hooks (norm scales
frozen at the run's), the parts' sum against the model's score and its (capped) softmax against transformers'
attention; taking a writer out of the query or the key input by hand with hooks against the split's prediction;
the frames against transformers; the task form against the single-prompt form; a hand-set previous-token head
feeding an induction head; the sentences for what cannot be split."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from analysis import qk_attribution as QA
from analysis.tasks.build import Task, TaskPair
from models import HeadLensError, load_model
from analysis.circuits import graph as C
from analysis.qk_attribution import split as Q
from tests import test_families, test_gemma3
from tests.test_llama import build as build_llama

N = 12  # tokens a prompt: past Gemma 3's window of 6


@pytest.fixture(scope="module", params=["llama", "gemma3", "gemma2", "olmo2"])
def family(request, tmp_path_factory):
    """(name, ours in float64, transformers' CausalLM in float64, the model as loaded)."""
    folder = tmp_path_factory.mktemp(f"qk-{request.param}")
    if request.param == "llama":
        _, folder, hf, _ = build_llama("llama", folder)      # q/k/v/o biases, 4 heads on 2 key/value heads
        with torch.no_grad():  # biases and norms away from their start at 0 and 1, so that a lost or flipped one shows
            for p in hf.parameters():
                if p.dim() == 1:
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
        hf.save_pretrained(folder)
    elif request.param == "gemma3":
        folder, hf, _ = test_gemma3.build(folder, 2)
    else:  # test_families' Gemma 2 (scores capped at 2, a window of 5) and OLMo-2
        folder, hf, _ = test_families.build(request.param, folder)
    model = load_model(folder, backend="scratch")
    return request.param, copy.deepcopy(model.stack).double(), copy.deepcopy(hf).double(), model


GEMMA = ("gemma3", "gemma2")  # norms scale by 1 + weight


def _eps(norm) -> float:
    return getattr(norm, "variance_epsilon", getattr(norm, "eps", None))


def _gain(name: str, norm) -> torch.Tensor:
    return (1 + norm.weight) if name in GEMMA else norm.weight


def ids_for(vocab: int, seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.randint(5, vocab, (batch, N), generator=torch.Generator().manual_seed(seed))


# --- the reference: transformers' own modules, hooked ------------------------------------------------------------

def hf_writers(name: str, hf, emb: torch.Tensor) -> torch.Tensor:
    """``(writers, B, n, E)``: every writer's output in transformers' run of ``emb`` with hooks: the input, then per
    layer each head (its slice of o_proj's input times its columns of o_proj's weight, through the norm after the
    attention where the family has one, its scale frozen at the whole output) and the MLP (its output, through the
    norm after it)."""
    cfg = hf.config
    H = cfg.num_attention_heads
    Dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    after = name != "llama"  # a norm after each part: Gemma 3, Gemma 2, OLMo-2
    got = {"z": [], "o": [], "mlp": []}
    handles = []
    for layer in hf.model.layers:
        attn = layer.self_attn
        handles += [attn.o_proj.register_forward_pre_hook(lambda m, a: got["z"].append(a[0])),
                    attn.o_proj.register_forward_hook(lambda m, a, out: got["o"].append(out)),
                    (layer.post_feedforward_layernorm if after else layer.mlp).register_forward_hook(
                        lambda m, a, out: got["mlp"].append(out))]
    try:
        with torch.no_grad():
            hf(inputs_embeds=emb)
    finally:
        for h in handles:
            h.remove()
    writers = [emb]
    for i, layer in enumerate(hf.model.layers):
        z, o, w = got["z"][i], got["o"][i], layer.self_attn.o_proj.weight
        scale = 1.0
        if after:
            norm = layer.post_attention_layernorm
            scale = _gain(name, norm) * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + _eps(norm))
        writers += [F.linear(z[..., h * Dh:(h + 1) * Dh], w[:, h * Dh:(h + 1) * Dh]) * scale for h in range(H)]
        writers.append(got["mlp"][i])
    return torch.stack(writers)


def hf_sides(name: str, hf, ids: torch.Tensor, layer: int, head: int, minus: dict | None = None):
    """Each writer's part of head ``head``'s query and key at every position (``(writers + 1, B, n, Dh)``, the
    constant last), through transformers' norm weights, projections, QK-norm and rotary with every norm's scale
    frozen at the run's; the model's own scores ``(B, n, n)`` from its projections' outputs; its attention."""
    cfg = hf.config
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    Dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    g = head // (H // G)
    emb = hf.model.embed_tokens(ids).detach()
    senders = hf_writers(name, hf, emb)
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
    norm = getattr(block, "input_layernorm", None)  # OLMo-2 reads the stream as it is
    frozen = 1.0 if norm is None else torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps(norm)) * _gain(name, norm)
    cos, sin = got["position_embeddings"]
    module = __import__(type(attn).__module__, fromlist=["apply_rotary_pos_emb"])
    sides, wholes = [], []
    for kind, index in (("q", head), ("k", g)):
        proj = getattr(attn, f"{kind}_proj")
        rows = slice(index * Dh, (index + 1) * Dh)
        side = F.linear(parts * frozen, proj.weight[rows])                           # (writers + 1, B, n, Dh)
        if proj.bias is not None:
            side[-1] += proj.bias[rows]
        whole = got[kind][..., rows]
        qk = getattr(attn, f"{kind}_norm", None)
        if name == "gemma3":  # QK-norm over each head, its scale frozen at the head's whole projection
            side = side * torch.rsqrt(whole.pow(2).mean(-1, keepdim=True) + qk.eps) * (1 + qk.weight)
            whole = qk(whole)
        elif name == "olmo2":  # a norm of the whole projection, every head's, frozen at the run's
            full = got[kind]
            side = side * (torch.rsqrt(full.pow(2).mean(-1, keepdim=True) + _eps(qk)) * qk.weight)[..., rows]
            whole = qk(full)[..., rows]
        sides.append(side)
        wholes.append(whole)
    q, k = sides
    q, _ = module.apply_rotary_pos_emb(q, q, cos, sin, unsqueeze_dim=0)
    _, k = module.apply_rotary_pos_emb(k, k, cos, sin, unsqueeze_dim=0)
    q = q * attn.scaling
    wq, wk = module.apply_rotary_pos_emb(wholes[0].unsqueeze(1), wholes[1].unsqueeze(1), cos, sin)
    scores = (wq @ wk.transpose(-1, -2))[:, 0] * attn.scaling                         # (B, n, n)
    return q.detach(), k.detach(), scores.detach(), out.attentions[layer][:, head].detach()


def capped_softmax(scores: torch.Tensor, visible: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """The weights of ``scores`` over the ``visible`` keys, capped first where the model caps them (Gemma 2)."""
    capped = scores if softcap is None else torch.tanh(scores / softcap) * softcap
    return torch.softmax(capped.masked_fill(~visible, -torch.inf), -1)


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
            weights_ours = capped_softmax(total, sides.visible(query), sides.softcap)
            # its attention agrees to about 1e-6 (transformers' RMSNorm in float32): held to 1e-5
            torch.testing.assert_close(weights_ours, weights[:, query, :query + 1], atol=1e-5, rtol=0)
    window = {"gemma3": test_gemma3.WINDOW, "gemma2": 5}.get(name)
    if window:  # a sliding-window layer past its window: the last query sees only its last keys
        assert stack.layers[0].attn.window == window
        assert int(Q.head_sides(stack, graph, run, 0, 0).visible(N - 1).sum()) == window


def hf_weights_without(name: str, hf, ids, layer: int, head: int, part: torch.Tensor, side: str, query: int,
                       frozen: bool) -> torch.Tensor:
    """transformers' attention of ``head`` from ``query`` with ``part`` ``(B, n, E)`` taken out of the stream its
    queries (at ``query``) or its keys (everywhere) read, put in by a hook on ``q_proj`` or ``k_proj``'s input;
    ``frozen``: the input norm's scale (and the QK-norm's) kept at the run's, else recomputed."""
    block = hf.model.layers[layer]
    norm = getattr(block, "input_layernorm", None)  # OLMo-2's attention reads the stream as it is
    seen = {}

    def take_out(m, a):
        h, x = a[0].clone(), seen["x"]
        seen["h"] = a[0]
        rows = slice(query, query + 1) if side == "q" else slice(None)
        if norm is None:
            h[:, rows] -= part[:, rows]
        elif frozen:
            h[:, rows] -= part[:, rows] * torch.rsqrt(x[:, rows].pow(2).mean(-1, keepdim=True) + _eps(norm)) * \
                _gain(name, norm)
        else:
            less = x.clone()
            less[:, rows] -= part[:, rows]
            h[:, rows] = norm(less)[:, rows]
        return (h,)

    def frozen_qk_norm(m, a, out):  # the QK-norm at the scale of the projection the run made
        proj = getattr(block.self_attn, f"{side}_proj")  # called without its hook, on the run's own input
        whole = F.linear(seen["h"], proj.weight, proj.bias)
        if name == "gemma3":  # over each head
            B, n, _ = seen["h"].shape
            whole = whole.view(B, n, -1, out.shape[-1]).transpose(1, 2)
        return a[0] * torch.rsqrt(whole.pow(2).mean(-1, keepdim=True) + _eps(m)) * _gain(name, m)

    hooks = [block.register_forward_pre_hook(lambda m, a, kw: seen.__setitem__("x", a[0] if a else
                                                                               kw["hidden_states"]), with_kwargs=True),
             getattr(block.self_attn, f"{side}_proj").register_forward_pre_hook(take_out)]
    if frozen and name in ("gemma3", "olmo2"):
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
    key = int(capped_softmax(scores[0], visible, sides.softcap).argmax())
    m = split.shape[0] - 1
    s, t = np.unravel_index(int(split[:m, :m, 0, key].abs().argmax()), (m, m))  # the top pair of two nodes
    for side, writer, less in (("q", s, split[s].sum(0)), ("k", t, split[:, t].sum(0))):
        predicted = capped_softmax(scores - less, visible, sides.softcap)
        part = run.outs[writer].double()
        frozen = hf_weights_without(name, hf, ids, layer, head, part, side, query, frozen=True)
        torch.testing.assert_close(predicted, frozen[:, :query + 1], atol=1e-6, rtol=0)
        if sides.softcap is None:  # the score by exactly the split's amount: log-weights' differences move by it
            theirs = torch.log(frozen[0, :query + 1][visible]) - torch.log(hf_weights_without(
                name, hf, ids, layer, head, part * 0, side, query, frozen=True)[0, :query + 1][visible])
            ours = -less[0][visible]
            torch.testing.assert_close(theirs - theirs[0], ours - ours[0], atol=1e-5 * float(less.abs().max()),
                                       rtol=0)
        # the run with the norm recomputed, which the frames set beside the split's prediction
        real = Q.scores_without(stack, graph, run, layer, head, query, int(writer), side)
        recomputed = hf_weights_without(name, hf, ids, layer, head, part, side, query, frozen=False)
        torch.testing.assert_close(capped_softmax(real, visible, sides.softcap), recomputed[:, :query + 1], atol=1e-6,
                                   rtol=0)
        assert (predicted - capped_softmax(scores, visible, sides.softcap)).abs().max() > 1e-4  # the writer mattered


def test_the_frames_on_a_prompt_are_transformers_parts(family):
    """What each frame shows of a prompt's split is read from transformers' own parts (``hf_sides``): the strongest
    writer pairs, a grid's named cells and what it sums as the rest, each side's writers, the keys' weights."""
    name, _, hf, model = family
    text = "the cat sat on the mat and the cat ran"
    split = QA.qk_attribution(model, text, 1, 2, query=-1)
    ids = model.tokenizer(text)["input_ids"]
    assert split.query == len(ids) - 1 and split.tokens == model.tokenizer.convert_ids_to_tokens(ids)
    q, k, scores, weights = hf_sides(name, hf, torch.tensor([ids]), 1, 2)
    n, key = split.query, split.key
    theirs = torch.einsum("sd,tjd->stj", q[:, 0, n], k[:, 0, :n + 1]).numpy()             # (W, W, keys)
    close = dict(atol=1e-4 * float(np.abs(theirs).max()), rtol=0)  # the frames' model is float32, theirs float64
    np.testing.assert_allclose(split.weights, weights[0, n, :n + 1].numpy(), atol=1e-5)
    np.testing.assert_allclose(split.keys().weight, weights[0, n, :n + 1].numpy(), atol=1e-5)
    np.testing.assert_allclose(split.keys().score, scores[0, n, :n + 1].numpy(), **close)
    pairs = split.pairs(n=6)
    np.testing.assert_allclose(pairs.part, theirs[pairs.query_index, pairs.key_index, key], **close)
    m = theirs[:, :, key]
    assert abs(pairs.part.iloc[0]) == pytest.approx(np.abs(m).max(), abs=close["atol"])  # the strongest first
    rows, cols, grid = split.grid(n=3)
    where = {w: i for i, w in enumerate(split.writers)}
    r, c = [where[w] for w in rows[:-1]], [where[w] for w in cols[:-1]]
    r_rest, c_rest = np.setdiff1d(np.arange(len(m)), r), np.setdiff1d(np.arange(len(m)), c)
    want = np.block([[m[np.ix_(r, c)], m[np.ix_(r, c_rest)].sum(1, keepdims=True)],
                     [m[np.ix_(r_rest, c)].sum(0, keepdims=True), m[np.ix_(r_rest, c_rest)].sum(keepdims=True)]])
    assert rows[-1] == cols[-1] == QA.REST
    np.testing.assert_allclose(grid, want, **close)
    for frame, parts in ((split.query_writers(), m.sum(1)), (split.key_writers(), m.sum(0))):
        np.testing.assert_allclose(frame.part.head(5), parts[frame["index"].head(5)], **close)
        assert frame.weight_without_run.notna().sum() == min(QA.REMOVED, len(split.writers) - 1)


def test_what_a_split_cannot_read_gets_a_sentence(family, hf_model):
    name, stack, hf, model = family
    text = "the cat sat on the mat and the cat ran"
    n = len(model.tokenizer(text)["input_ids"])
    with pytest.raises(HeadLensError, match="not a position"):
        QA.qk_attribution(model, text, 1, 2, query=99)
    with pytest.raises(HeadLensError, match="no head 9"):
        QA.qk_attribution(model, text, 1, 9)
    with pytest.raises(HeadLensError, match=f"The key 7 comes after the query 3: a query sees only the keys up to it"):
        QA.qk_attribution(model, text, 1, 2, query=3, key=7)
    with pytest.raises(HeadLensError, match=f"The key 99 is not a position of the prompt's {n} tokens"):
        QA.qk_attribution(model, text, 1, 2, key=99)
    split = QA.qk_attribution(model, text, 1, 2, query=3)
    with pytest.raises(HeadLensError, match=r"Key 4 is not among the query's keys \(0 to 3\)"):
        split.grid(key=4)
    long = " ".join(["the cat sat on the mat"] * 120)
    with pytest.raises(HeadLensError, match=f"at most {QA.MAX_TOKENS}"):
        QA.qk_attribution(model, long, 1, 2)
    window = stack.layers[0].attn.window
    if window is not None:  # a sliding layer: the last query does not see the first key
        with pytest.raises(HeadLensError, match="outside this layer's window"):
            QA.qk_attribution(model, text, 0, 0, key=0)
    encoder = QA.qk_attribution(hf_model, "Which do you like better, coffee or tea?", 0, 0, query=2, key=9)
    assert encoder.n_keys == 12 and encoder.key == 9  # an encoder's query sees the keys after it too
    with pytest.raises(HeadLensError, match="The key 12 is not a position of the prompt's 12 tokens"):
        QA.qk_attribution(hf_model, "Which do you like better, coffee or tea?", 0, 0, query=2, key=12)


def hand_task(model, vocab: int) -> tuple[Task, list, list]:
    """Three pairs of random tokens one token apart (at 4), roles A (2) and END (the last)."""
    ids = ids_for(vocab, seed=3, batch=3).tolist()
    bad = [row[:4] + [(row[4] + 1) % vocab] + row[5:] for row in ids]
    tok = model.tokenizer
    pairs = tuple(TaskPair(tok.decode(a), tok.decode(b), tuple(a), tuple(b), 7, 9, (("A", 2), ("END", N - 1)))
                  for a, b in zip(ids, bad))
    return Task("mine", "hand-made", pairs), ids, bad


def test_the_task_form_equals_the_prompt_form_pair_by_pair(family):
    name, _, hf, model = family
    task, ids, bad = hand_task(model, hf.config.vocab_size)
    got = QA.qk_attribution_task(model, task, 2 if name == "gemma3" else 1, 0, "END", "A", batch_pairs=2)
    ours = model.scratch()
    graph = C.graph_of(ours.stack)
    one = {}
    for i, (a, b) in enumerate(zip(ids, bad)):
        for which, row in (("clean", a), ("corrupted", b)):
            run = Q.writers_run(ours.stack, graph, torch.tensor([row]))
            one[which, i] = Q.head_sides(ours.stack, graph, run, got.layer, 0).split(N - 1)[:, :, 0, 2].double().numpy()
            np.testing.assert_allclose(got.parts(which)[i], one[which, i], atol=1e-5)
    # the frame's rows: the writer pairs of largest mean |difference| first, each the mean of the prompt forms'
    frame = got.frame("difference", n=5)
    mean = np.mean([one["clean", i] - one["corrupted", i] for i in range(3)], 0)
    np.testing.assert_allclose(frame.part, mean[frame.query_index, frame.key_index], atol=1e-5)
    assert frame.part.abs().is_monotonic_decreasing and abs(frame.part.iloc[0]) == pytest.approx(np.abs(mean).max())
    assert (frame.part_lo <= frame.part + 1e-12).all() and (frame.part <= frame.part_hi + 1e-12).all()


def test_what_a_task_split_cannot_read_gets_a_sentence(family):
    name, _, hf, model = family
    task, _, _ = hand_task(model, hf.config.vocab_size)
    with pytest.raises(HeadLensError, match="roles"):
        QA.qk_attribution_task(model, task, 1, 0, "END", "S2")
    with pytest.raises(HeadLensError, match="A pair's END comes after its A: a query sees no later key"):
        QA.qk_attribution_task(model, task, 1, 0, "A", "END")
    with pytest.raises(HeadLensError, match="The task has no pairs"):
        QA.qk_attribution_task(model, Task("none", "empty", ()), 1, 0)
    found = QA.qk_attribution_task(model, task.subset([0]), 1, 0, "END", "A")
    with pytest.raises(HeadLensError, match="Choose clean, corrupted or difference, not 'x'"):
        found.parts("x")


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


@pytest.fixture(scope="module")
def induction_detector(induction_pair):
    from analysis import head_detector

    return head_detector(induction_pair, n_sequences=8, length=8, sentences=["the apple and the river"] * 4)


def test_an_induction_heads_key_is_made_by_the_previous_token_head(induction_pair, induction_detector):
    from analysis.roles.detector import detector_labels
    from analysis.qk_attribution.induction import induction_key_writers

    model, detector = induction_pair, induction_detector
    labels = dict(zip(zip(detector.layer, detector["head"]), detector_labels(detector)))
    assert labels[(0, 0)] == "previous token" and labels[(1, 0)] == "induction"
    seen = []
    found = induction_key_writers(model, detector, prompts=10, length=8,
                                  progress=lambda done, total: seen.append((done, total)))
    assert seen == [(8, 10), (10, 10)]  # batches of eight prompts
    assert list(found.frame.columns) == ["prompt", "head", "writer", "label", "previous_token_score", "part", "share",
                                         "previous_token"]
    assert found.frame.prompt.tolist()[:10] == list(range(10))
    row = detector.set_index(["layer", "head"]).loc[(0, 0)]
    mine = found.frame[found.frame["head"] == "L1 H0"]
    np.testing.assert_allclose(mine.previous_token_score, row.previous_token)  # the writer's own detector score
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


def test_a_writer_the_detector_did_not_measure_is_other_and_a_ragged_tokenizer_gets_a_sentence(
        induction_pair, induction_detector, monkeypatch):
    from analysis.qk_attribution import induction

    only = induction_detector[(induction_detector.layer == 1) & (induction_detector["head"] == 0)]
    found = induction.induction_key_writers(induction_pair, only, prompts=3, length=8)
    assert (found.frame.writer == "L0 H0").all() and (found.frame.label == "other").all()
    assert found.frame.previous_token_score.isna().all() and not found.frame.previous_token.any()
    monkeypatch.setattr(induction, "repeated_sequences", lambda tok, n, length, seed: ["the apple", "the apple river"])
    with pytest.raises(HeadLensError, match="^The repeated sequences did not come back from the tokenizer at one"):
        induction.induction_key_writers(induction_pair, induction_detector, prompts=2, length=8)


def test_a_splits_frames_read_the_key_asked_and_name_their_columns(induction_pair):
    model = induction_pair
    text = "the apple river stone cloud apple river"
    split = QA.qk_attribution(model, text, 1, 0, query=-2)
    graph = C.graph_of(model.scratch().stack)
    assert split.nodes == list(graph.senders[:len(split.writers) - 1]) + [("constant", -1, -1)]
    assert split.writers[-1] == Q.CONSTANT and len(split.nodes) == len(split.writers)
    assert list(split.pairs().columns) == ["rank", "query_writer", "key_writer", "part", "share", "query_index",
                                           "key_index"]
    assert split.pairs()["rank"].tolist() == list(range(1, len(split.writers) ** 2 + 1))
    assert list(split.key_writers().columns) == ["writer", "part", "share", "weight", "weight_without",
                                                 "weight_without_run", "index"]
    other = 4
    assert other != split.key
    for frame, axis in ((split.key_writers(other), 0), (split.query_writers(other), 1)):
        parts = split.split[:, :, other].sum(axis)
        np.testing.assert_allclose(frame.part, parts[frame["index"]])
        assert frame.part.sum() == pytest.approx(split.scores[other])
        assert (frame.weight == split.weights[other]).all()
    with pytest.raises(HeadLensError, match="^The prompt is empty; type a sentence."):
        QA.qk_attribution(model, "   ", 1, 0)
    saved = split.to_json(other)
    assert (saved["model"], saved["layer"], saved["head"], saved["query"], saved["key"]) == (
        model.name, 1, 0, split.query, other)
    assert saved["tokens"] == split.tokens[:split.query + 1]
    assert saved["score"] == pytest.approx(split.scores[other]) and saved["weight"] == pytest.approx(
        split.weights[other])
    assert len(saved["pairs"]) == min(200, len(split.writers) ** 2) and "query_index" not in saved["pairs"][0]
    assert saved["pairs"][0]["part"] == pytest.approx(split.pairs(other).part.iloc[0])
    assert [w["writer"] for w in saved["key_writers"]] == split.key_writers(other).writer.tolist()
    assert "index" not in saved["query_writers"][0]


def test_a_heads_sides_split_the_keys_asked_and_a_pruned_head_has_none(induction_pair):
    stack = induction_pair.scratch().stack
    graph = C.graph_of(stack)
    run = Q.writers_run(stack, graph, torch.tensor([[3, 4, 5, 6, 3, 4]]))
    sides = Q.head_sides(stack, graph, run, 1, 0)
    # the keys asked alone, as in the whole split: to float32's rounding (a product over fewer keys may sum in
    # another order on another CPU's kernels)
    np.testing.assert_allclose(sides.split(5, slice(1, 3)), sides.split(5)[..., 1:3], rtol=1e-5, atol=1e-6)
    text = induction_pair.tokenizer.decode([3, 4, 5, 6, 3, 4])
    assert induction_pair.tokenizer(text)["input_ids"] == [3, 4, 5, 6, 3, 4]
    weights = induction_pair.attend(text).weights[1, 0]                   # the model's own attention
    for query in (2, 5):
        np.testing.assert_allclose(torch.softmax(sides.scores(query)[0].double(), -1).numpy(),
                                   weights[query, :query + 1], atol=1e-5)
    pruned = induction_pair.pruned([(1, 1)]).scratch().stack
    with pytest.raises(ValueError, match="^Head 1 of layer 1 was pruned away.$"):
        Q.head_sides(pruned, C.graph_of(pruned), Q.writers_run(pruned, C.graph_of(pruned), torch.tensor([[3, 4]])),
                     1, 1)


def test_a_task_split_reports_each_batch_and_keeps_its_writers(induction_pair):
    model = induction_pair
    V = len(model.tokenizer)
    ids = torch.randint(3, V, (3, 8), generator=torch.Generator().manual_seed(0)).tolist()
    bad = [row[:2] + [(row[2] + 1) % V or 3] + row[3:] for row in ids]
    task = Task("mine", "hand-made", tuple(TaskPair("", "", tuple(a), tuple(b), 7, 9, (("A", 2), ("END", 7)))
                                           for a, b in zip(ids, bad)))
    seen = []
    got = QA.qk_attribution_task(model, task, 1, 0, "END", "A", batch_pairs=2,
                                 progress=lambda done, total: seen.append((done, total)))
    assert seen == [(2, 3), (3, 3)]
    graph = C.graph_of(model.scratch().stack)
    assert got.nodes == list(graph.senders[:len(got.writers) - 1]) + [("constant", -1, -1)]
    assert got.parts() is got.clean and got.parts("corrupted") is got.corrupted
    np.testing.assert_array_equal(got.parts("difference"), got.clean - got.corrupted)
    assert np.abs(got.parts("difference")).max() > 1e-3  # the corruption at A changed the key's writers
    for side, axis in (("q", 2), ("k", 1)):  # each writer of a side, summed over the other side's, pair by pair
        per_pair = got.clean.sum(axis)                                          # (pairs, writers)
        frame = got.side(side, n=4)
        assert list(frame.columns) == ["rank", "writer", "part", "part_lo", "part_hi", "index"]
        assert frame["rank"].tolist() == [1, 2, 3, 4] and frame.part.abs().is_monotonic_decreasing
        np.testing.assert_allclose(frame.part, per_pair[:, frame["index"]].mean(0))
        assert frame.writer.tolist() == [got.writers[i] for i in frame["index"]]
        assert (frame.part_lo <= frame.part + 1e-12).all() and (frame.part <= frame.part_hi + 1e-12).all()
        assert (frame.part_hi - frame.part_lo > 0).any()
    frame = got.frame("clean", n=3)
    flat = got.clean.reshape(3, -1)
    np.testing.assert_allclose(frame.share, (flat[:, frame.query_index * len(got.writers) + frame.key_index]
                                             / flat.sum(1, keepdims=True)).mean(0))
    assert list(frame.columns) == ["rank", "query_writer", "key_writer", "part", "part_lo", "part_hi", "share",
                                   "share_lo", "share_hi", "query_index", "key_index"]
    assert (frame.share_lo <= frame.share + 1e-12).all() and (frame.share <= frame.share_hi + 1e-12).all()


def test_an_induction_heads_key_writers_are_summed_over_the_second_copys_queries(induction_pair, induction_detector):
    """The frame's part: the top key-side writer's part summed over the second copy's queries, each at its induction
    key (the token after its first occurrence), as the single-prompt split gives each."""
    from analysis.qk_attribution.induction import induction_key_writers
    from analysis.roles.detector import repeated_sequences

    model, length = induction_pair, 8
    found = induction_key_writers(model, induction_detector, prompts=1, length=length, heads=[(1, 0)])
    for prompt, text in enumerate(repeated_sequences(model.tokenizer, 1, length, 0)):
        n = len(model.tokenize(text, verbose=False)["input_ids"])
        total = 0
        for query in range(n - length, n - 1):
            one = QA.qk_attribution(model, text, 1, 0, query=query, key=query - length + 1)
            total = total + one.split[:, :, one.key].sum(0)                 # the key side's writers
        row = found.frame.iloc[prompt]
        w = int(np.argmax(total))
        assert row.writer == one.writers[w] == "L0 H0"
        assert row.part == pytest.approx(total[w], rel=1e-4)
        assert row.share == pytest.approx(total[w] / total.sum(), rel=1e-4)


def test_an_induction_heads_writers_by_head_count_their_prompts_with_wilsons_interval():
    """``by_head`` from a frame set by hand: each (head, writer) pair's prompts, its share of the head's prompts
    with Wilson's 95% interval worked here, its label and score, its mean share of the scores."""
    import pandas as pd
    from analysis.qk_attribution.induction import KeyWriters

    frame = pd.DataFrame({
        "prompt": [0, 1, 2, 3, 0, 1], "head": ["L1 H0"] * 4 + ["L1 H1"] * 2,
        "writer": ["input", "L0 H0", "L0 H0", "L0 H0", "L0 H1", "L0 H1"],
        "label": ["input", "previous token", "previous token", "previous token", "other", "other"],
        "previous_token_score": [np.nan, 0.8, 0.8, 0.8, 0.1, 0.1], "part": [1.0, 2.0, 3.0, 4.0, 1.0, 1.0],
        "share": [0.2, 0.5, 0.6, 0.7, 0.9, 0.3], "previous_token": [False, True, True, True, False, False]})
    rows = KeyWriters(frame).by_head()
    assert rows[["head", "writer", "prompts"]].values.tolist() == [["L1 H0", "L0 H0", 3], ["L1 H0", "input", 1],
                                                                   ["L1 H1", "L0 H1", 2]]
    assert rows.label.tolist() == ["previous token", "input", "other"]
    np.testing.assert_allclose(rows.previous_token_score, [0.8, np.nan, 0.1])
    np.testing.assert_allclose(rows.share_of_score, [0.6, 0.2, 0.6])
    np.testing.assert_allclose(rows.of_prompts, [0.75, 0.25, 1.0])
    z = 1.959963984540054
    for (k, n), low, high in zip([(3, 4), (1, 4), (2, 2)], rows.of_prompts_lo, rows.of_prompts_hi):
        p = k / n
        centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z / (1 + z * z / n) * np.sqrt(
            p * (1 - p) / n + z * z / (4 * n * n))
        assert (low, high) == pytest.approx((centre - half, centre + half), abs=1e-9)
    share, low, high = KeyWriters(frame).share_previous_token()
    assert share == 0.5 and low < 0.5 < high
