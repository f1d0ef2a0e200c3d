"""Fetching a model a user names from the Hugging Face Hub, on request only (``load_model(name, download=True)``).

Offline is the default: nothing here runs unless asked. What is fetched is checked first, from the
Hub's listing and the config alone: safetensors weights only (a pickle can run code), no model code
(``auto_map``), the config's sizes and the weights' total size against ``limits``. Then only the
config, the tokenizer's files and the safetensors are fetched, into the Hugging Face cache, where
later loads find them offline. The Hub is ``HF_ENDPOINT`` when set (a mirror, or a test's server).
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from .errors import HeadLensError
from .limits import MAX_WEIGHT_BYTES, check_config_sizes

# the files a model folder needs besides its weights (config and tokenizer); never code, never pickles
KEEP = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model",
        "sentencepiece.bpe.model", "spiece.model", "added_tokens.json", "sentence_bert_config.json",
        "model.safetensors.index.json"}

Progress = Callable[[int, int], None]


def endpoint() -> str:
    """The Hub's address: ``HF_ENDPOINT`` as it is now (the hub library reads it once, at import)."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


def cache_dir() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def download(name: str, progress: Progress | None = None) -> Path:
    """The folder of model ``name`` fetched from the Hub into its cache, checked before anything large is
    fetched; ``progress(bytes done, bytes in all)`` after each file."""
    from huggingface_hub import HfApi, hf_hub_download

    where = endpoint()
    try:
        info = HfApi(endpoint=where).model_info(name, files_metadata=True)
    except Exception as err:  # noqa: BLE001 - no network, no such model, a refusal: each is "not found there"
        raise HeadLensError(f"The model '{name}' could not be looked up on the Hub ({where}): {err}") from err
    files = {s.rfilename: int(s.size or 0) for s in (info.siblings or [])}
    weights = sorted(f for f in files if f.endswith(".safetensors") and "/" not in f)
    if not weights:
        pickles = [f for f in files if f.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        raise HeadLensError(f"'{name}' has no safetensors weights{' (only ' + ', '.join(pickles[:2]) + ')' if pickles else ''}"
                            "; HeadLens fetches safetensors only, since loading a pickle can run code.")
    total = sum(files[f] for f in weights)
    if total > MAX_WEIGHT_BYTES:
        raise HeadLensError(f"'{name}' has {total / 2**30:.1f} GiB of weights; HeadLens loads at most "
                            f"{MAX_WEIGHT_BYTES / 2**30:.0f} GiB, so nothing was fetched.")
    if "config.json" not in files:
        raise HeadLensError(f"'{name}' has no config.json on the Hub; it is not a transformers model.")
    fetch = lambda file: hf_hub_download(name, file, endpoint=where,  # noqa: E731  (main, so refs/main is written)
                                         cache_dir=cache_dir())
    try:
        config_path = Path(fetch("config.json"))
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except Exception as err:  # noqa: BLE001 - a network failure or a config that is not JSON
        raise HeadLensError(f"The config.json of '{name}' could not be fetched or read: {err}") from err
    if not isinstance(config, dict) or config.get("auto_map"):
        raise HeadLensError(f"'{name}' needs Python code of its own (auto_map), and HeadLens never runs code that "
                            "comes with a model; nothing else was fetched.")
    check_config_sizes(config, f"config.json of '{name}'")
    wanted = sorted(f for f in files if f in KEEP and f != "config.json") + weights
    done, size = files["config.json"], sum(files[f] for f in wanted) + files["config.json"]
    if progress is not None:
        progress(done, size)
    for file in wanted:
        try:
            fetch(file)
        except Exception as err:  # noqa: BLE001
            raise HeadLensError(f"{file} of '{name}' could not be fetched: {err}") from err
        done += files[file]
        if progress is not None:
            progress(done, size)
    return config_path.parent
