"""``load_model``: the one way to open a model, offline, on one of the engines.

``backend="transformers"`` runs a Hugging Face model (``models.hf``); ``backend="scratch"`` runs
our own network for the folder's model_type (``models.scratch``, architectures in
``models/stacks``), from its weights or untrained. Nothing is downloaded unless asked
(``download=True``) and no model code is ever run.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import torch

from .base import AttentionModel
from .errors import HeadLensError
from .files import check_model_dir, pick_device, resolve_model_dir
from .engine import open_scratch
from .hf import open_transformers
from .memory import release_memory

ENGINES = {"transformers": open_transformers, "scratch": open_scratch}

# Sessions of the app load models on threads of one process. transformers imports its classes
# lazily on first use, and two threads doing that at once can find a half-imported module
# ("cannot import name 'AutoTokenizer'"), so loads take turns.
_LOAD_LOCK = threading.Lock()


def load_model(name: str | os.PathLike | None = None, *, backend: str = "transformers",
               device: str | torch.device = "auto", untrained: bool = False, seed: int = 0,
               allow_pickle: bool = False, download: bool = False, progress=None) -> AttentionModel:
    """Load a model for attention, from local files only.

    Args:
        name: None for the bundled all-MiniLM-L6-v2; a folder; or a model id in the local
            Hugging Face cache.
        backend: "transformers" (any supported family) or "scratch" (our own networks: BERT
            encoders and the decoders HeadLens trains).
        device: "auto" (CUDA, then MPS, then CPU), "cpu", "cuda", "cuda:1", "mps".
        untrained: from-scratch engine only: random weights of the model's shape, seeded by ``seed``.
        allow_pickle: accept weights stored only as a pickle (``pytorch_model.bin``).
        download: a model id not in the local cache is fetched from the Hub (``HF_ENDPOINT``), its
            listing and config checked first, safetensors only (``models.download``); off by default.
        progress: ``progress(bytes done, bytes in all)`` while it downloads.
    """
    if backend not in ENGINES:
        raise HeadLensError(f"Unknown backend '{backend}': choose {' or '.join(repr(b) for b in ENGINES)}.")
    with _LOAD_LOCK:
        dev = pick_device(device)
        folder, display = resolve_model_dir(name, download=download, progress=progress)
        config = check_model_dir(folder, allow_pickle=allow_pickle or untrained)
        options = {"allow_pickle": allow_pickle} if backend == "transformers" else {}
        model = ENGINES[backend](folder, config, display, dev, untrained=untrained, seed=seed, **options)
    # what reading the files held (parsing Gemma 3's 33 MB tokenizer.json left 315 MB free but not given back)
    release_memory()
    return _with_embed_length(model, folder)


def _with_embed_length(model: AttentionModel, folder: Path) -> AttentionModel:
    """The model cutting texts to embed where sentence-transformers does (``sentence_bert_config.json``)."""
    try:
        length = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return model
    if isinstance(length, int) and not isinstance(length, bool) and length > 0:
        model.embed_max_tokens = min(length, model.max_tokens)
    return model
