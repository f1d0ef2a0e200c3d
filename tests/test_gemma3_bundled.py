"""The bundled Gemma 3 270M (a Q4_K_M GGUF in four chunk packages) on both engines: the converted weights
against transformers' own reading of the same file, every attention weight and the logits against
transformers' eager Gemma3ForCausalLM on unseen text inside and past the 512-token window, what it
predicts, and crafted Gemma 3 GGUF files refused with a sentence."""
import copy
import os

import numpy as np
import pytest
import torch
import transformers as tf

from models import HeadLensError, load_model
from models.gguf import bundled_file, gguf_folder

pytestmark = pytest.mark.bundled  # every test opens the bundled decoder

NAME = "google/gemma-3-270m"
UNSEEN = ["Seven purple kites drifted over the harbour while the ferry waited.",
          " ".join(f"Line {i}: the lighthouse keeper counted {i * 7} gulls and wrote the number down." for i in range(40))]


@pytest.fixture(scope="module")
def gemma_cache(tmp_path_factory):
    """The file converted as a first load does (``first_load``: into the run's cache while it has none, this module
    running early in its group so that the run's later loads read it; else a fresh one): ``(folder, progress)``."""
    from tests.conftest import first_load

    before = os.environ.get("HEADLENS_CACHE")
    yield first_load(bundled_file(NAME), tmp_path_factory.mktemp("cache"))
    os.environ.pop("HEADLENS_CACHE", None) if before is None else os.environ.__setitem__("HEADLENS_CACHE", before)


@pytest.fixture(scope="module")
def read_once():
    """transformers' own reading of the file parses it once for the module: its config, its weights and its
    tokenizer each build the gguf package's reader of the same file (17 to 30 s each), which holds the same fields."""
    import functools

    import gguf

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.cache(gguf.GGUFReader))
        yield


@pytest.fixture(scope="module")
def reference(gemma_cache, read_once):
    path = bundled_file(NAME)
    return tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="eager",
                                                   dtype=torch.float32).eval()


def test_the_weights_are_transformers_own_reading_of_the_file(gemma_cache, reference):
    from safetensors.torch import load_file

    folder, seen = gemma_cache
    assert gguf_folder(bundled_file(NAME)) == folder  # found in the cache from then on
    assert seen[-1] == (236, 236) and [d for d, _ in seen] == list(range(1, 237))  # read here, tensor by tensor
    ours = load_file(str(folder / "model.safetensors"))
    theirs = reference.state_dict()
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied to the embeddings
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name].float(), atol=0, rtol=0, msg=name)
    config = tf.AutoConfig.from_pretrained(folder)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
            config.hidden_size, config.vocab_size, config.sliding_window) == (18, 4, 1, 256, 640, 262144, 512)
    assert [i for i, t in enumerate(config.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert config.architectures == [type(reference).__name__] == ["Gemma3ForCausalLM"]  # as a Hub folder names it
    path = bundled_file(NAME)
    tokenizer = tf.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    mine = tf.AutoTokenizer.from_pretrained(folder)
    for text in UNSEEN:
        assert mine(text)["input_ids"] == tokenizer(text)["input_ids"]
        assert mine(text)["input_ids"][0] == 2  # <bos> first


def test_both_engines_equal_transformers_eager_inside_and_past_the_window(gemma_cache, reference):
    """The weights within 1e-4 of transformers' eager ones; the logits, through 18 layers of float32, within 1e-3 of
    transformers' own run in float64 (3e-3 on some machines' BLAS), or no further from it than twice transformers'
    float32 run is (past the window, either float32 run is 1e-3 to 3e-3 from it and from the other)."""
    engines = [load_model(NAME, backend=b) for b in ("scratch", "transformers")]
    assert all(m.causal and (m.n_layers, m.n_heads) == (18, 4) for m in engines)
    exact = copy.deepcopy(reference).double()
    stack = engines[0].stack
    for text in UNSEEN:
        ids = engines[0].tokenizer(text, return_tensors="pt")["input_ids"]
        # the logits at every 16th position and the last: the 262,144-token unembedding at every one of 814
        # positions is most of the float64 run's time
        keep = torch.tensor(sorted({*range(0, ids.shape[1], 16), ids.shape[1] - 1}))
        with torch.inference_mode():
            out = reference(ids, output_attentions=True, logits_to_keep=keep)
            logits = stack.logits(stack(ids, need_weights=False, need_logits=False).last_hidden_state[:, keep])
            truth = exact(ids, logits_to_keep=keep).logits
        want = torch.stack(out.attentions, dim=1)[0].numpy()
        for model in engines:
            np.testing.assert_allclose(model.attend(text).weights, want, atol=1e-4)
        ours, theirs = ((x.double() - truth).abs().max().item() for x in (logits, out.logits))
        assert ours <= max(2 * theirs, 3e-3), (ours, theirs)  # BLAS kernels differ by machine: 2.7e-3 against 1.4e-3
        np.testing.assert_allclose(logits.numpy(), out.logits.numpy(), atol=3e-3)
    n = ids.shape[1]
    assert n > 600
    far = np.tril(np.ones((n, n), dtype=bool), -512)       # keys 512 or more tokens behind the query
    sliding = [i for i in range(18) if i not in (5, 11, 17)]
    assert not want[sliding][..., far].any() and want[[5, 11, 17]][..., far].sum() > 1


def test_it_knows_paris_and_parks_attention_on_the_first_token(gemma_cache):
    model = load_model(NAME, backend="scratch")
    ids = model.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        top = model.stack(ids).logits[0, -1].topk(3).indices.tolist()
    assert " Paris" in [model.tokenizer.decode([t]) for t in top]
    res = model.attend(UNSEEN[0])
    first = res.weights[:, :, 1:, 0].mean(axis=(1, 2))                       # each layer's share on <bos>
    uniform = np.mean(1 / np.arange(2, len(res.tokens) + 1))               # its share if all keys were equal
    assert first.min() > 1.5 * uniform and first.max() > 0.85


def write_gemma_gguf(path, *, tensors=None, width=8, blocks=1):
    import gguf

    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(blocks)
    w.add_embedding_length(width)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(4)
    w.add_value_length(4)
    w.add_context_length(32)
    w.add_sliding_window(4)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    for name, shape in (tensors or {}).items():
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("craft,message", [
    ("huge", "asks for num_hidden_layers = 1,000,000,000; HeadLens accepts 1 to 256"),
    ("shape", r"holds blk.0.attn_q.weight of shape \(4, 8\), which its own config does not give"),
    ("unknown tensor", "a tensor HeadLens does not know"),
    ("no embeddings", "lacks token_embd.weight"),
])
def test_a_crafted_gemma3_gguf_gets_a_sentence(craft, message, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    embedding = {"token_embd.weight": (10, 8)}
    if craft == "huge":
        import gguf

        write_gemma_gguf(path, tensors={**embedding, "output_norm.weight": (8,)})
        field = gguf.GGUFReader(path, "r+").fields["gemma3.block_count"]
        field.parts[field.data[0]][0] = 1_000_000_000
    elif craft == "shape":
        write_gemma_gguf(path, tensors={**embedding, "output_norm.weight": (8,), "blk.0.attn_q.weight": (4, 8)})
    elif craft == "unknown tensor":
        write_gemma_gguf(path, tensors={**embedding, "blk.0.surprise.weight": (2,)})
    else:
        write_gemma_gguf(path, tensors={"output_norm.weight": (8,)})
    for backend in ("scratch", "transformers"):
        with pytest.raises(HeadLensError, match=message):
            load_model(path, backend=backend)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.safetensors"))


def test_compare_puts_a_smollm2_head_beside_a_gemma3_head_each_on_its_own_tokens(gemma_cache, new_app):
    from tests.conftest import figures, tick_text, title_text

    text = "Which do you like better, coffee or tea?"
    at = new_app({"model": "smollm2_scratch", "text": text, "p1_model": "smollm2_scratch", "p2_model": "gemma3_scratch",
                  "p2_layer": "5", "p2_head": "1"}, page="app_pages/compare.py")
    assert not at.error, [e.value for e in at.error]
    charts = {title_text(f): f for f in figures(at)}
    smol, gemma = (load_model(name, backend="scratch").attend(text) for name in
                   ("HuggingFaceTB/SmolLM2-135M-Instruct", NAME))
    assert len(smol.tokens) != len(gemma.tokens) and gemma.tokens[0] == "<bos>"
    assert len(tick_text(charts["2: Gemma 3 270M · L5 H1"])) == len(gemma.tokens)
    assert len(tick_text(charts["1: SmolLM2-135M-Instruct · L0 H0"])) == len(smol.tokens)
    caption = next(c.value for c in at.caption if "different tokens" in c.value)
    assert f"(Gemma 3 270M): {len(gemma.tokens)} tokens" in caption
    assert any("different tokens" in i.value for i in at.info)  # no cell-by-cell difference
    assert at.selectbox(key="p2_layer").format_func(5) == "5 global"


def test_head_roles_puts_smollm2s_role_grid_beside_gemma3s(gemma_cache, new_app):
    from analysis.roles.detector import detector_labels
    from app_pages.ui.detector import LENGTH, SENTENCES, SEQUENCES
    from app_pages.ui.pruning import corpus_sample
    from analysis import head_detector
    from tests.conftest import figures, title_text

    at = new_app({"model": "smollm2_scratch", "roles_beside": "true"}, page="app_pages/roles.py")
    assert not at.error, [e.value for e in at.error]
    grids = {title_text(f): f for f in figures(at) if "layers × " in title_text(f)}
    assert set(grids) == {"SmolLM2-135M-Instruct · 30 layers × 9 heads", "Gemma 3 270M · 18 layers × 4 heads"}
    gemma = head_detector(load_model(NAME, backend="scratch"), sentences=corpus_sample(SENTENCES),
                          n_sequences=SEQUENCES, length=LENGTH)
    import pandas as pd

    labels = pd.Series(detector_labels(gemma))
    counts = next(d.value for d in at.dataframe if "Gemma 3 270M" in d.value.columns)
    assert counts.loc["heads", "Gemma 3 270M"] == 72 and counts.loc["heads", "SmolLM2-135M-Instruct"] == 270
    for label, n in labels.value_counts().items():
        assert counts.loc[label, "Gemma 3 270M"] == n


def test_gemma3_generates_on_the_page_and_pruning_runs_on_it(gemma_cache, new_app):
    from tests.conftest import figures

    prompt = "The capital of France is"
    at = new_app({"model": "gemma3", "text": prompt}, page="app_pages/generate.py")
    at.slider(key="gen_tokens").set_value(6).run()
    at.button(key="gen_go").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    model = load_model(NAME, backend="scratch")
    continuation = "".join(model.generate(prompt, max_new_tokens=6))
    assert at.code[0].value == continuation and figures(at)
    pruned = model.pruned([(0, 1), (5, 2)])                                   # a copy; the shared model keeps them
    mask = np.ones((18, 4), dtype=np.float32)
    mask[0, 1] = mask[5, 2] = 0
    np.testing.assert_allclose(pruned.attend(prompt).weights, model.attend(prompt, head_mask=mask).weights, atol=1e-5)
    assert model.stack.kept[0] == [0, 1, 2, 3]
