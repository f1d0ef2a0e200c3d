"""Long prompts (``models.long.LongAttention``, ``analysis.attention.long``) on tiny random Llama-family decoders and a
BERT with a long context, 1,024 tokens and more: every weight, pooled block, zoom and per-head figure against
the full computation (transformers' eager attention and our ``attend``), ``attend(layers=...)``, layers run
only as high as asked, the cut at the model's context, and the memory a view takes."""
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torch
import transformers as tf

from analysis import head_stats, long_view, make_view, special_share
from analysis.attention.views import set_aside
from models import HeadLensError, load_model
from models.corpus import CORPUS
from tests.conftest import _bpe_vocab, block_max

LLAMA = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 3, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 2048, "initializer_range": 0.5, "bos_token_id": 0,
         "eos_token_id": 2, "pad_token_id": 1}
TEXT = " ".join(CORPUS)


def save_llama(folder, config_class=tf.LlamaConfig, model_class=tf.LlamaForCausalLM, **extra):
    vocab, merges = _bpe_vocab()
    torch.manual_seed(0)
    model_class(config_class(vocab_size=len(vocab), **{**LLAMA, **extra})).eval().save_pretrained(folder)
    tf.GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                         pad_token="<pad>").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["llama", "mistral"])
def decoder(request, tmp_path_factory):
    """(folder, our model, transformers' eager model): a Llama, and a Mistral whose sliding window (300) is
    shorter than the text."""
    folder = tmp_path_factory.mktemp(f"long-{request.param}")
    if request.param == "llama":
        save_llama(folder)
        hf = tf.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager")
    else:
        save_llama(folder, tf.MistralConfig, tf.MistralForCausalLM, sliding_window=300)
        hf = tf.MistralForCausalLM.from_pretrained(folder, attn_implementation="eager")
    return folder, load_model(folder, backend="scratch"), hf.eval()


def text_of(model, n_tokens: int) -> str:
    ids = model.tokenizer(TEXT)["input_ids"]
    assert len(ids) >= n_tokens
    return model.tokenizer.decode(ids[:n_tokens])


def eager(hf, model, text):
    ids = model.tokenizer(text, return_tensors="pt")
    with torch.inference_mode():
        return torch.stack(hf(**ids, output_attentions=True).attentions, dim=1)[0].numpy()


def assert_within_float32(ours, single, double, floor=1e-5):
    """``ours`` as near transformers' float64 weights (``double``) as its float32 ones (``single``) are, twice over
    (``floor`` at the least): a 5-layer model of large random weights drifts past 1e-4 in float32 by its top layer,
    in transformers' run as in ours, where a layer read from the wrong stream is off by a tenth or more."""
    off, noise = np.abs(ours - double).max(), np.abs(single - double).max()
    assert off <= max(2 * noise, floor), (off, noise)


def test_every_layer_equals_transformers_and_attend_at_1024_tokens(decoder):
    _, model, hf = decoder
    text = text_of(model, 1024)
    long = model.attend_long(text)
    full = model.attend(text)
    assert len(long.tokens) == len(full.tokens) == 1024 and long.tokens == full.tokens
    assert long.offsets == full.offsets and long.word_ids == full.word_ids
    reference = eager(hf, model, text)
    for layer in range(model.n_layers):
        exact = long.weights(layer)
        np.testing.assert_allclose(exact, reference[layer], atol=1e-4)
        np.testing.assert_allclose(exact, full.weights[layer], atol=1e-4)
        assert np.allclose(exact.sum(-1), 1, atol=1e-5)


def test_pooled_blocks_are_the_max_pooling_of_the_exact_weights(decoder):
    _, model, hf = decoder
    text = text_of(model, 1024)
    long = model.attend_long(text)
    reference = eager(hf, model, text)
    for layer in range(model.n_layers):
        g = long_view(long).grid(layer, [3, 0, 2])
        assert g.weights.shape == (3, 128, 128) and list(g.q_starts[:2]) == [0, 8]
        for i, head in enumerate([3, 0, 2]):
            np.testing.assert_allclose(g.weights[i], block_max(reference[layer, head]), atol=1e-4)
        # a causal block whose queries all come before its keys is drawn as not seen
        assert g.hidden[0, 1] and not g.hidden[1, 0] and not g.hidden[5, 5]


def test_a_zoom_is_the_exact_slice_and_hiding_the_sink_renormalises_as_make_view_does(decoder):
    _, model, _ = decoder
    text = text_of(model, 1024)
    long, full = model.attend_long(text), model.attend(text)
    v = long_view(long)
    np.testing.assert_allclose(v.exact(1, 2, (700, 828), (90, 218)), full.weights[1, 2, 700:828, 90:218], atol=1e-4)
    hide = np.zeros(len(long.tokens), dtype=bool)
    hide[[0, 5]] = True  # hidden tokens, as "hide special tokens" leaves a sink and specials out
    hidden = type(v)(long, [v.labels[i] for i in np.flatnonzero(~hide)], np.flatnonzero(~hide),
                     v.special[~hide], hide, True)
    keep = np.flatnonzero(~hide)
    shown = full.weights[2][:, keep][:, :, keep]
    shown = shown / shown.sum(-1, keepdims=True)
    np.testing.assert_allclose(hidden.exact(2, 1, (500, 628), (0, 128)), shown[1, 500:628, :128], atol=1e-4)
    g = hidden.grid(2, [0, 1, 2, 3])
    for head in range(4):
        np.testing.assert_allclose(g.weights[head], block_max(shown[head]), atol=1e-4)
    rows = -(-len(keep) // 128)
    last = hidden.grid(2, [1], last=40)
    assert last.rows == (len(keep) - 40, len(keep)) and last.figures is None
    np.testing.assert_allclose(last.weights[0], np.maximum.reduceat(shown[1, -40:], np.arange(0, len(keep), rows),
                                                                    axis=1), atol=1e-4)
    # per-head figures: as the views compute them from the whole layer
    entropy = -(np.where(shown > 0, shown * np.log(np.where(shown > 0, shown, 1)), 0)).sum(-1).mean(-1)
    np.testing.assert_allclose(g.figures.entropy, entropy, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g.figures.max_weight, shown.max(axis=(1, 2)), atol=1e-4)
    np.testing.assert_allclose(g.figures.aside, full.weights[2][..., set_aside(full)].sum(-1).mean(-1), atol=1e-4)
    position = np.arange(len(long.tokens))
    distance = (full.weights[2] * np.abs(position[:, None] - position[None, :])).sum(-1).mean(-1)
    np.testing.assert_allclose(g.figures.distance, distance, rtol=1e-4)
    np.testing.assert_allclose(g.figures.first, full.weights[2][:, 1:, 0].mean(-1), atol=1e-6)


def test_figures_of_a_view_equal_head_stats_of_make_view(decoder):
    _, model, _ = decoder
    text = text_of(model, 300)
    long, full = model.attend_long(text), model.attend(text)
    for hide in (False, True):
        v = long_view(long, hide_special=hide)
        stats = head_stats(make_view(full, hide_special=hide), special_share(full), layers=slice(1, 2))
        f = v.grid(1, [0, 1, 2, 3]).figures
        np.testing.assert_allclose(f.entropy, stats["entropy"][0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(f.max_weight, stats["max_weight"][0], atol=1e-4)
        np.testing.assert_allclose(f.aside, stats["to_special"][0], atol=1e-4)


def test_a_layer_needs_only_the_layers_below_it(decoder):
    _, model, _ = decoder
    long = model.attend_long(text_of(model, 1024))
    assert long.layers_done == 0
    long_view(long).grid(0, [0])
    assert long.layers_done == 1
    before = long.nbytes
    long.weights(2, [1], queries=(0, 8))
    assert long.layers_done == 3 and long.nbytes > before


def test_a_climb_beside_a_view_runs_each_layer_once_and_gives_transformers_weights(decoder, monkeypatch):
    """The server's climb to the top (a thread asking for each layer in turn, as ``app_pages.results.long.climb``)
    and a session's view of a layer share the pass: each layer runs once, a layer already known is read while the
    climb goes on above it, and every layer's weights are transformers'."""
    _, model, hf = decoder
    text = text_of(model, 1024)
    long = model.attend_long(text)
    runs, go_on, at_layer_1 = [], threading.Event(), threading.Event()
    run_layers = long.stack.run_layers

    def counted(x, *args, start=0, stop=None, **kwargs):
        runs.append(start)
        return run_layers(x, *args, start=start, stop=stop, **kwargs)

    monkeypatch.setattr(long.stack, "run_layers", counted)

    def pause():  # the climb waits before layer 2 until the view of layer 1 is drawn
        if long.layers_done == 2:
            at_layer_1.set()
            assert go_on.wait(30)

    def climb():
        for layer in range(model.n_layers):
            pause()
            long.run_to(layer)

    climber = threading.Thread(target=climb, daemon=True)
    climber.start()
    try:
        assert at_layer_1.wait(30)
        reference = eager(hf, model, text)
        np.testing.assert_allclose(long.weights(1), reference[1], atol=1e-4)  # known: nothing runs
        assert runs == [0] and long.layers_done == 2  # layer 1's input is layer 0's output
    finally:
        go_on.set()
    climber.join(300)
    assert not climber.is_alive(), "the climb did not end"
    assert long.layers_done == model.n_layers and sorted(runs) == list(range(model.n_layers - 1))
    for layer in range(model.n_layers):
        np.testing.assert_allclose(long.weights(layer), reference[layer], atol=1e-4)
    assert runs == list(range(model.n_layers - 1))  # the top layer's output is never needed


def test_a_layer_between_the_kept_streams_runs_from_the_one_below_it(tmp_path, monkeypatch):
    """The pass keeps the stream entering every third layer and no attention input; a view of a layer between runs
    from the stream below it, or from one made between, kept while its span is read (layers read up or down run
    once), and the last two layers viewed keep their inputs. Every layer's weights are transformers'."""
    save_llama(tmp_path, num_hidden_layers=5)
    model = load_model(tmp_path, backend="scratch")
    hf = tf.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    text = text_of(model, 1024)
    long = model.attend_long(text)
    runs = []
    run_layers = long.stack.run_layers
    monkeypatch.setattr(long.stack, "run_layers", lambda x, *a, start=0, stop=None, **k: runs.append((start, stop))
                        or run_layers(x, *a, start=start, stop=stop, **k))
    long.run_to(4)
    assert runs == [(0, 1), (1, 2), (2, 3), (3, 4)] and sorted(long._streams) == [0, 3] and not long._recent
    assert long.nbytes == 3 * long.layer_bytes  # the streams entering layers 0 and 3, and the pass's, entering 4
    reference = eager(hf, model, text)
    double = eager(tf.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager",
                                                       dtype=torch.float64).eval(), model, text)
    # 2 from the stream made for 1; 4 from the pass's, 3 from the kept one; 2 and 1 again from those made for them
    for layer, ran in ((1, [(0, 1)]), (2, [(1, 2)]), (4, []), (3, []), (2, []), (1, []), (0, [])):
        del runs[:]
        assert_within_float32(long.weights(layer), reference[layer], double[layer])
        assert runs == ran, (layer, runs)
    assert list(long._recent) == [1, 0] and sorted(long._between) == [1, 2]
    long.release()
    long.run_to(4)
    for layer, ran in ((2, [(0, 1), (1, 2)]), (1, [])):  # down, as a rollout reads: each layer runs once
        del runs[:]
        assert_within_float32(long.weights(layer), reference[layer], double[layer])
        assert runs == ran, (layer, runs)


def test_the_climb_gives_way_to_a_session_asking_for_a_layer(decoder, monkeypatch):
    """While a session's view runs the layers it needs, the server's climb (``behind``) runs none and returns; then
    it goes on from where the session left off."""
    _, model, _ = decoder
    long = model.attend_long(text_of(model, 1024))
    runs, tried = [], []
    run_layers = long.stack.run_layers
    monkeypatch.setattr(long.stack, "run_layers", lambda x, *a, start=0, **k: runs.append(start) or
                        run_layers(x, *a, start=start, **k))

    def progress(done, total):  # the session between two of its layers: the climb tries in another thread
        if done == 2 and not tried:
            climber = threading.Thread(target=long.run_to, args=(model.n_layers - 1,), kwargs={"behind": True})
            climber.start()
            climber.join(120)  # it returns at once, giving way; a climb still running fails below
            tried.append((list(runs), climber.is_alive()))

    long.run_to(1, progress=progress)
    assert tried == [([0], False)]  # the climb ended, having run nothing while the session asked
    assert runs == [0] and long.layers_done == 2
    long.run_to(model.n_layers - 1, behind=True)  # nobody asks now: it climbs on from there
    assert long.layers_done == model.n_layers and runs == [0, 1]


def test_attend_with_layers_equals_the_full_result_on_both_engines(decoder):
    folder, model, _ = decoder
    texts = [text_of(model, 200), "Which do you like better, coffee or tea?"]
    full = model.attend(texts)
    some = model.attend(texts, layers=[2, 0])
    hf = load_model(folder, backend="transformers")
    theirs = hf.attend(texts, layers=[2])
    for f, s, t in zip(full, some, theirs):
        assert s.layers == (2, 0) and s.n_layers == 2 and t.layers == (2,) and f.layers is None
        np.testing.assert_allclose(s.weights, f.weights[[2, 0]], atol=1e-4)
        np.testing.assert_allclose(t.weights[0], f.weights[2], atol=1e-4)
    with pytest.raises(HeadLensError, match="from 0 to 2"):
        model.attend(texts[1], layers=[3])


def test_a_prompt_past_the_context_is_cut_and_says_so(tmp_path, monkeypatch):
    model = load_model(save_llama(tmp_path, max_position_embeddings=1500), backend="scratch")
    assert model.max_tokens == 1024 and model.long_max_tokens == 1500
    long = model.attend_long(TEXT)
    assert len(long.tokens) == 1500 and long.truncated and long.n_tokens_original == len(model.tokenizer(TEXT)["input_ids"])
    assert model.is_long(TEXT) and not model.is_long("Which do you like better, coffee or tea?")
    with pytest.raises(HeadLensError, match="empty"):
        model.attend_long("   ")
    with pytest.raises(HeadLensError, match="no layer 3"):
        long.weights(3)
    monkeypatch.setattr("models.long.MAX_EXACT_BYTES", 16 * 2**20)
    assert long.weights(0, [1]).shape == (1, 1500, 1500)  # 9 MiB
    with pytest.raises(HeadLensError, match="34 MiB"):
        long.weights(0)


def test_an_encoder_with_a_long_context_and_the_transformers_engine(tmp_path, minilm_dir):
    torch.manual_seed(0)
    wordpiece = tf.AutoTokenizer.from_pretrained(minilm_dir)
    tf.BertModel(tf.BertConfig(vocab_size=wordpiece.vocab_size, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=37, max_position_embeddings=1400)
                 ).eval().save_pretrained(tmp_path)
    wordpiece.model_max_length = 1400
    wordpiece.save_pretrained(tmp_path)
    model = load_model(tmp_path, backend="scratch")
    text = " ".join(CORPUS[:170])
    long, full = model.attend_long(text), model.attend(text)
    n = len(long.tokens)
    assert n == 1400 and long.truncated and model.max_tokens == 1024 and len(full.tokens) == 1024
    assert not long.causal and long.special[0] and long.special[-1]  # [CLS] and the [SEP] after the cut
    hf = tf.BertModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.inference_mode():
        ref = hf(**wordpiece(text, return_tensors="pt", truncation=True, max_length=1400), output_attentions=True)
    np.testing.assert_allclose(long.weights(1, [2], queries=(0, 600))[0], ref.attentions[1][0, 2, :600].numpy(),
                               atol=1e-4)
    f = long.figures(1)
    position = np.arange(n)
    w = ref.attentions[1][0].numpy()
    np.testing.assert_allclose(f.distance, (w * np.abs(position[:, None] - position[None, :])).sum(-1).mean(-1),
                               rtol=1e-4)
    assert long.sink_share is None
    via_twin = load_model(tmp_path).attend_long(text)  # the transformers engine hands it to its twin
    np.testing.assert_array_equal(via_twin.weights(1, [2], queries=(0, 50))[0], long.weights(1, [2], queries=(0, 50))[0])


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _view_of_4096_tokens(folder) -> tuple[int, int, tuple, bool]:
    """In a process of its own: the bytes a 4,096-token prompt holds once run, and the peak of resident memory,
    above what it was before, while a pooled view of every head with its figures and a zoom are drawn."""
    model = load_model(folder, backend="scratch")
    long = model.attend_long(" ".join([TEXT] * 3))
    assert len(long.tokens) == 4096
    long.run_to(1)
    v = long_view(long, hide_special=True)
    peak, stop = [rss()], threading.Event()

    def watch():
        while not stop.wait(0.002):
            peak.append(rss())

    base = rss()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        g = v.grid(1, list(range(8)))
        v.exact(1, 3, (3000, 3128), (2900, 3028))
    finally:
        stop.set()
        watcher.join()
    return long.nbytes, max(peak) - base, g.weights.shape, bool(np.isfinite(g.figures.entropy).all())


@pytest.mark.slow
def test_a_view_of_4096_tokens_never_holds_a_whole_layer_of_weights(tmp_path):
    """8 heads x 4,096² float32 is 512 MiB a layer; a pooled view with its figures, and a zoom, stay far below.
    Measured in a fresh process: threads that earlier tests left in this one would count in its memory."""
    folder = save_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=2,
                        max_position_embeddings=4096)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        held, peak, shape, finite = pool.submit(_view_of_4096_tokens, folder).result(timeout=600)
    assert held <= 2 * 4096 * 32 * 4 + 2 * 8 * 4096 * 4 * 4 + 4096 * 32 * 4  # inputs, one layer's q and k, the stream
    assert shape == (8, 128, 128) and finite
    assert peak < 200 * 2**20, f"{peak / 2**20:.0f} MiB for a view"


def test_rollout_of_one_query_through_a_window_equals_the_full_rollout(decoder):
    from analysis.attention.flow import layer_matrices

    _, model, _ = decoder
    text = text_of(model, 700)
    long, full = model.attend_long(text), model.attend(text)
    for hide in (False, True):
        v, shown = long_view(long, hide_special=hide), make_view(full, hide_special=hide)
        a = layer_matrices(shown, residual=0.3)
        q = len(v) - 1
        np.testing.assert_allclose(v.rollout(q, (0, 2), residual=0.3), a[2][q] @ a[1] @ a[0], atol=1e-4)
        np.testing.assert_allclose(v.rollout(100, (1, 2), residual=0.3), (a[2] @ a[1])[100], atol=1e-4)
        assert v.rollout(q, (2, 2)).sum() == pytest.approx(1, abs=1e-4)


def test_long_prompts_keep_their_layers_within_a_budget_the_least_recently_used_giving_way(decoder, monkeypatch):
    """Three prompts, a budget for two run to the top and a little more: the third's layers take the least recently
    used prompt's, which runs again when asked and gives transformers' weights; the server runs a prompt ahead of
    the sessions only within the budget, taking no other prompt's layers."""
    from models import long as long_module

    _, model, hf = decoder
    kept = long_module.Kept()
    monkeypatch.setattr(long_module, "KEPT", kept)
    texts = [text_of(model, n) for n in (1024, 1000, 990)]
    a, b, c = (model.attend_long(t) for t in texts)
    top, layer = model.n_layers - 1, a.layer_bytes
    a.run_to(top)
    assert a.nbytes == 2 * layer  # the streams entering its first layer and its top one
    kept.budget = 2 * a.nbytes + 4 * layer
    b.run_to(top)
    a.weights(0, [0], queries=(0, 4))  # a, used again, keeps an input and its queries and keys: b is the oldest
    c.run_to(top)
    assert (a.layers_done, b.layers_done, c.layers_done) == (model.n_layers, 0, model.n_layers)
    assert kept.released == 1 and b.releases == 1 and kept.nbytes <= kept.budget
    np.testing.assert_allclose(b.weights(2), eager(hf, model, texts[1])[2], atol=1e-4)  # run again: a is the oldest
    assert (a.layers_done, b.layers_done, c.layers_done) == (0, model.n_layers, model.n_layers)
    assert kept.nbytes == b.nbytes + c.nbytes > kept.budget - 2 * layer  # room for a's embeddings, not one more
    a.run_to(top, behind=True)  # ahead of the sessions: its embeddings fill the room, then it stops
    assert a.layers_done == 1 and kept.nbytes <= kept.budget and not a.may_run_ahead
    assert (b.layers_done, c.layers_done, kept.released) == (model.n_layers, model.n_layers, 2)
    np.testing.assert_allclose(a.weights(top), eager(hf, model, texts[0])[top], atol=1e-4)
    # what a server's report of its results counts for a prompt: its layers and token ids, not the model's weights
    from models.memory import held_bytes
    ids = sum(t.numel() * t.element_size() for t in a._ids.values())
    weights = sum(p.numel() * p.element_size() for p in model.stack.parameters())
    extra = held_bytes(a) - a.nbytes - ids
    assert 0 <= extra < 16 * len(a.tokens) < weights
