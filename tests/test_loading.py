"""load_model and AttentionModel.attend: tokens, weights, batching, truncation, families, errors."""
import json
import shutil

import numpy as np
import pytest
import torch
import transformers as tf

from models import Attention, HeadLensError, load_model, pick_device
from tests.conftest import SENTENCES

TOL = 1e-5


def reference(folder, text, target=None):
    """Attention straight from transformers, one text, no padding: what every result must equal."""
    model = tf.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    tok = tf.AutoTokenizer.from_pretrained(folder)
    enc = tok(text, return_tensors="pt")
    inputs = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")
              and k in tok.model_input_names}
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = tok(target or text, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model(**inputs, output_attentions=True)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
    return tok, tokens, out


def stacked(attentions):
    return torch.stack(attentions, dim=1)[0].numpy()  # (layers, H, Lq, Lk)


def test_default_model_result(hf_model, minilm_dir):
    text = SENTENCES[0]
    res = hf_model.attend(text)
    tok, tokens, out = reference(minilm_dir, text)
    assert isinstance(res, Attention)
    assert res.tokens == tokens == ["[CLS]", "which", "do", "you", "like", "better", ",", "coffee", "or", "tea",
                                    "?", "[SEP]"]
    assert res.weights.dtype == np.float32 and res.weights.shape == (6, 12, 12, 12)
    np.testing.assert_allclose(res.weights, stacked(out.attentions), atol=TOL)
    assert res.word_ids == tok(text).word_ids()
    assert res.special.tolist() == [True] + [False] * 10 + [True]
    assert [text[s:e].lower() for s, e in res.offsets[1:-1]] == tokens[1:-1]
    assert (res.model_name, res.backend, res.device) == ("sentence-transformers/all-MiniLM-L6-v2", "transformers",
                                                         pick_device("auto").type)  # "auto": CUDA where there is one
    assert not res.truncated and res.n_tokens_original == 12 and not res.causal


def test_scratch_backend_equals_transformers(hf_model, scratch_model):
    a, b = hf_model.attend(SENTENCES), scratch_model.attend(SENTENCES)
    for x, y in zip(a, b):
        assert x.tokens == y.tokens and y.backend == "scratch"
        np.testing.assert_allclose(y.weights, x.weights, atol=TOL)


def test_subword_pieces_share_a_word_id(hf_model):
    res = hf_model.attend("Tokenization is unbelievably interesting")
    pieces = [t for t, w in zip(res.tokens, res.word_ids) if w == 0]
    assert len(pieces) > 1 and "".join(p.removeprefix("##") for p in pieces) == "tokenization"


@pytest.mark.parametrize("backend", ["transformers", "scratch"])
def test_batch_equals_single_and_padding_never_shows(backend, hf_model, scratch_model):
    model = hf_model if backend == "transformers" else scratch_model
    texts = ["Hi", "A considerably longer sentence, with several more tokens in it than the first.", "Mid length."]
    batch = model.attend(texts, batch_size=8)
    assert [r.text for r in batch] == texts
    for text, res in zip(texts, batch):
        alone = model.attend(text)
        assert res.tokens == alone.tokens and res.weights.shape == alone.weights.shape
        np.testing.assert_allclose(res.weights, alone.weights, atol=TOL)
        np.testing.assert_allclose(res.weights.sum(-1), 1.0, atol=1e-5)


def test_progress_reports_each_batch(hf_model):
    seen = []
    hf_model.attend(SENTENCES * 3, batch_size=4, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 9), (8, 9), (9, 9)]


def test_long_text_is_truncated_and_says_so(hf_model):
    text = "attention " * 600
    res = hf_model.attend(text)
    full = hf_model.tokenizer(text, verbose=False)["input_ids"]
    assert res.truncated and res.n_tokens_original == len(full) == 602
    assert len(res.tokens) == 512 and res.weights.shape[-1] == 512 and res.tokens[-1] == "[SEP]"


def test_head_mask_and_causal_leave_the_shared_model_unchanged(scratch_model):
    before = {k: v.clone() for k, v in scratch_model.encoder.state_dict().items()}
    plain = scratch_model.attend(SENTENCES[0])
    mask = np.ones((6, 12))
    mask[2, 5] = 0
    masked = scratch_model.attend(SENTENCES[0], head_mask=mask, causal=True)
    assert np.all(masked.weights[2, 5] == 0) and masked.causal
    assert np.all(np.triu(masked.weights[0, 0], 1) == 0)
    again = scratch_model.attend(SENTENCES[0])
    np.testing.assert_array_equal(again.weights, plain.weights)
    for k, v in scratch_model.encoder.state_dict().items():
        assert torch.equal(v, before[k])


def test_untrained_model(minilm_dir):
    m = load_model(backend="scratch", untrained=True, seed=3)
    assert "untrained" in m.name and m.backend == "scratch"
    res = m.attend(SENTENCES[0])
    again = load_model(backend="scratch", untrained=True, seed=3).attend(SENTENCES[0])
    np.testing.assert_array_equal(res.weights, again.weights)
    assert res.weights.std() < load_model(backend="scratch").attend(SENTENCES[0]).weights.std()


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "albert", "electra", "gpt2"])
def test_family_loads_and_matches_transformers(family, tiny):
    folder = tiny(family)
    model = load_model(folder)
    text = SENTENCES[0]
    res = model.attend(text)
    _, tokens, out = reference(folder, text)
    assert res.tokens == tokens
    np.testing.assert_allclose(res.weights, stacked(out.attentions), atol=TOL)
    assert res.weights.shape == (2, 4, len(tokens), len(tokens))
    batch = model.attend([text, "Hi there"])
    np.testing.assert_allclose(batch[0].weights, res.weights, atol=TOL)
    assert res.causal == (family == "gpt2")
    if family == "gpt2":
        assert np.all(np.triu(res.weights, 1) == 0)


def test_max_tokens_follow_the_model(tiny):
    model = load_model(tiny("roberta"))  # 66 positions, two of them reserved by RoBERTa's offset
    res = model.attend("coffee " * 100)
    assert model.max_tokens == 64 and len(res.tokens) == 64 and res.truncated


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_encoder_decoder_parts(family, tiny):
    folder = tiny(family)
    model = load_model(folder)
    text, target = "The cat sat on the mat.", "Hello world!"
    res = model.attend(text, target=target)
    _, tokens, out = reference(folder, text, target)
    assert res.component == "encoder" and res.tokens == tokens
    np.testing.assert_allclose(res.weights, stacked(out.encoder_attentions), atol=TOL)
    dec, cross = res.decoder, res.cross
    assert dec.component == "decoder" and dec.causal and dec.text == target
    np.testing.assert_allclose(dec.weights, stacked(out.decoder_attentions), atol=TOL)
    assert cross.component == "cross" and cross.key_tokens == res.tokens and cross.tokens == dec.tokens
    np.testing.assert_allclose(cross.weights, stacked(out.cross_attentions), atol=TOL)
    assert cross.weights.shape == (2, 4, len(dec.tokens), len(res.tokens))
    # without a target the decoder reads the input itself
    assert model.attend(text).decoder.tokens == res.tokens


def test_model_id_from_local_cache(tmp_path, tiny, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "models--tiny-org--tiny-bert" / "snapshots" / ("a" * 40)
    shutil.copytree(tiny("bert"), snapshot)
    (tmp_path / "models--tiny-org--tiny-bert" / "refs").mkdir()
    (tmp_path / "models--tiny-org--tiny-bert" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    model = load_model("tiny-org/tiny-bert")
    assert model.name == "tiny-org/tiny-bert" and model.n_layers == 2


# --- errors a person can act on ---------------------------------------------------------------

@pytest.mark.parametrize("text,message", [("", "The text is empty"), ("  \n\t ", "The text is empty"),
                                          (["fine", " "], "Text 2 is empty"), ([], "no text")])
def test_empty_text(hf_model, text, message):
    with pytest.raises(HeadLensError, match=message):
        hf_model.attend(text)
    assert hf_model.attend("still works").tokens[1:3] == ["still", "works"]


def test_unknown_name_says_where_it_looked(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(HeadLensError) as err:
        load_model("nobody/no-such-model")
    msg = str(err.value)
    assert "nobody/no-such-model" in msg and str(tmp_path) in msg and "downloads nothing unless asked" in msg


def test_folder_without_model(tmp_path):
    with pytest.raises(HeadLensError, match="holds no model: there is no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(HeadLensError, match="holds no model weights"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(HeadLensError, match="not valid JSON"):
        load_model(tmp_path)


def test_pickle_weights_refused_unless_allowed(tmp_path, tiny):
    src = tiny("bert")
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp_path)
    model = tf.BertModel.from_pretrained(src)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(HeadLensError, match="only in pickle format.*allow_pickle=True"):
        load_model(tmp_path)
    res = load_model(tmp_path, allow_pickle=True).attend(SENTENCES[0])
    np.testing.assert_allclose(res.weights, load_model(src).attend(SENTENCES[0]).weights, atol=TOL)


def test_remote_code_is_never_run(tmp_path, tiny):
    shutil.copytree(tiny("bert"), tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(HeadLensError, match="never runs code"):
        load_model(tmp_path)


def test_corrupt_weights(tmp_path, tiny):
    shutil.copytree(tiny("bert"), tmp_path, dirs_exist_ok=True)
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    for backend in ("transformers", "scratch"):
        with pytest.raises(HeadLensError, match="could not be (loaded|read)"):
            load_model(tmp_path, backend=backend)


def test_the_transformers_engine_hands_head_masks_and_causal_masks_to_its_twin(hf_model, scratch_model):
    mask = np.ones((6, 12))
    mask[1, 3] = mask[4, 0] = 0
    for options in ({"head_mask": mask}, {"causal": True}):
        got, want = hf_model.attend("Which do you like better?", **options), scratch_model.attend(
            "Which do you like better?", **options)
        np.testing.assert_array_equal(got.weights, want.weights)
        assert got.backend == "scratch"  # the result says which engine computed it
    assert not got.weights[0, 0][np.triu_indices(len(got.tokens), 1)].any()
    assert hf_model.scratch() is hf_model.scratch()  # loaded once, then kept


def test_options_a_backend_does_not_have(hf_model, tiny):
    bloom = load_model(tiny("bloom"))
    with pytest.raises(HeadLensError, match="the from-scratch engine, which does not implement"):
        bloom.attend("hi", head_mask=np.ones((2, 4)))
    with pytest.raises(HeadLensError, match="the from-scratch engine, which does not implement"):
        bloom.embed("hi", head_mask=np.ones((2, 4)))
    with pytest.raises(HeadLensError, match="implements BERT encoders"):
        load_model(tiny("bloom"), backend="scratch")
    with pytest.raises(HeadLensError, match="backend='scratch'"):
        load_model(untrained=True)
    with pytest.raises(HeadLensError, match="Unknown backend"):
        load_model(backend="onnx")
    with pytest.raises(HeadLensError, match="encoder-decoder"):
        hf_model.attend("hi", target="there")


def test_bad_head_mask(scratch_model):
    with pytest.raises(HeadLensError, match=r"shape \(6, 12\)"):
        scratch_model.attend("hi", head_mask=np.ones((12, 6)))
    with pytest.raises(HeadLensError, match="only 0"):
        scratch_model.attend("hi", head_mask=np.full((6, 12), 0.5))


def test_devices():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type in ("cuda", "mps", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(HeadLensError, match="no CUDA GPU"):
            pick_device("cuda")
    with pytest.raises(HeadLensError, match="not a device"):
        pick_device("gpu please")
