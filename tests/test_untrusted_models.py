"""Model folders from anywhere: refused with a sentence before they can run code or take the memory.

(Pickle-only weights, ``auto_map`` in config.json and corrupt safetensors are in test_loading.)
"""
import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from models import HeadLensError, load_model
from models import limits
from tests.conftest import ROOT


def model_copy(src, dest, **config_changes):
    shutil.copytree(src, dest, dirs_exist_ok=True)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, **config_changes}))
    return dest


ABSURD = {
    "a billion-wide layer": ({"hidden_size": 10**9}, "hidden_size = 1,000,000,000; HeadLens accepts 1 to 65,536"),
    "negative layers": ({"num_hidden_layers": -3}, "num_hidden_layers = -3"),
    "a size in words": ({"hidden_size": "large"}, "gives hidden_size as 'large'; it must be a whole number"),
    "a fractional head": ({"num_attention_heads": 1.5}, "whole number"),
    "a size that is true": ({"num_hidden_layers": True}, "whole number"),
    "161 billion parameters": ({"num_hidden_layers": 200, "hidden_size": 8192, "num_attention_heads": 64,
                                "intermediate_size": 32768}, "would have 161,[0-9]{3} million parameters"),
    "a vocabulary of 4 billion weights": ({"vocab_size": 900_000, "hidden_size": 4096, "num_attention_heads": 16},
                                          "would have 4,[0-9]{3} million parameters"),
    "heads that do not divide the width": ({"num_attention_heads": 7}, "cannot be built from its config.json"),
    "a nested decoder asking for too much": ({"decoder": {"d_model": 10**7}}, r"config.json \(decoder\) asks for"),
}


@pytest.mark.parametrize("name", list(ABSURD))
@pytest.mark.parametrize("backend", ["transformers", "scratch"])
def test_a_config_asking_for_absurd_sizes_is_refused(name, backend, tmp_path, minilm_dir):
    changes, message = ABSURD[name]
    folder = model_copy(minilm_dir, tmp_path, **changes)
    with pytest.raises(HeadLensError, match=message):
        load_model(folder, backend=backend)


@pytest.mark.slow
def test_refusing_an_absurd_model_allocates_nothing(tmp_path, minilm_dir):
    """In a fresh process: the peak memory of refusing 161 billion parameters stays that of the imports."""
    folder = model_copy(minilm_dir, tmp_path, **ABSURD["161 billion parameters"][0])
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from models import HeadLensError, load_model
        import transformers
        def peak():
            return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) // 1024
        before = peak()
        for backend in ("transformers", "scratch"):
            try:
                load_model({str(folder)!r}, backend=backend)
            except HeadLensError as err:
                print("refused:", err)
        print("peak MiB", before, peak())
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert sum(line.startswith("refused:") and "million parameters" in line for line in lines) == 2
    before, after = map(int, lines[-1].split()[-2:])
    assert after - before < 300, lines[-1]  # 161 billion float32 parameters would be 600 GiB


def test_weight_files_over_the_limit_are_refused(tmp_path, tiny, monkeypatch):
    folder = model_copy(tiny("bert"), tmp_path)
    size = (folder / "model.safetensors").stat().st_size
    monkeypatch.setattr(limits, "MAX_WEIGHT_BYTES", size - 1)
    with pytest.raises(HeadLensError, match="GiB of weights, so it was not loaded"):
        load_model(folder)
    monkeypatch.setattr(limits, "MAX_WEIGHT_BYTES", size)
    assert load_model(folder).n_layers == 2


def test_parameter_limit_counts_the_real_model(tmp_path, tiny, monkeypatch):
    import transformers as tf

    folder = tiny("bert")
    n = sum(p.numel() for p in tf.BertModel.from_pretrained(folder).parameters())
    monkeypatch.setattr(limits, "MAX_PARAMETERS", n - 1)
    with pytest.raises(HeadLensError, match="million parameters"):
        load_model(folder)
    monkeypatch.setattr(limits, "MAX_PARAMETERS", n)
    assert load_model(folder).n_heads == 4


def test_broken_configs_get_a_sentence(tmp_path, tiny):
    folder = model_copy(tiny("bert"), tmp_path)
    for content, message in [("[1, 2]", "does not say which kind of model"),
                             ('{"hidden_size": 32}', "does not say which kind of model"),
                             ('{"model_type": "no-such-architecture"}', "could not be read"),
                             (b"\xff\xfe\x00garbage", "not valid JSON"),
                             ("", "not valid JSON")]:
        config = folder / "config.json"
        config.write_bytes(content) if isinstance(content, bytes) else config.write_text(content)
        with pytest.raises(HeadLensError, match=message):
            load_model(folder)


def test_tokenizer_asking_for_remote_code_is_refused(tmp_path, tiny):
    folder = model_copy(tiny("bert"), tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_evil.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(HeadLensError, match="never runs code"):
        load_model(folder)
    (folder / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(HeadLensError, match="tokenizer_config.json .* is not valid JSON"):
        load_model(folder)


def test_truncated_weights_and_a_lying_header_are_refused(tmp_path, tiny):
    import struct

    folder = model_copy(tiny("bert"), tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])  # cut in the middle of the tensors
    for backend in ("transformers", "scratch"):
        with pytest.raises(HeadLensError, match="could not be (loaded|read)"):
            load_model(folder, backend=backend)
    # a header that promises a 100 GB tensor the file does not hold
    header = json.dumps({"embeddings.word_embeddings.weight": {
        "dtype": "F32", "shape": [250_000, 100_000], "data_offsets": [0, 100_000_000_000]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\x00" * 64)
    for backend in ("transformers", "scratch"):
        with pytest.raises(HeadLensError, match="could not be (loaded|read)"):
            load_model(folder, backend=backend)
