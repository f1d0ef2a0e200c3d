"""Limits that keep one model folder or one text from taking the machine down.

A model folder may come from anywhere, and its ``config.json`` decides how much memory the model
takes: a config asking for a billion-wide layer would be allocated (and randomly initialised)
before any weight is read. So sizes are checked first, as plain numbers, and then the model is
built on PyTorch's ``meta`` device, which allocates nothing, to count its parameters exactly.

Attention weights grow with the square of the text: ``layers x heads x tokens^2`` floats per
text. One text's weights are capped, and batches are cut so that one forward pass stays small.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from .errors import HeadLensError

MAX_PARAMETERS = 1_000_000_000  # 4 GB in float32; BERT-large has 335 million, GPT-2 large 774 million
MAX_WEIGHT_BYTES = 8 * 2**30  # all weight files of one folder together
MAX_ATTENTION_BYTES = 512 * 2**20  # one text's attention weights, every layer and head
MAX_BATCH_BYTES = 256 * 2**20  # attention weights of one forward pass over a batch

# Plain-number limits on a config's sizes, checked before anything is built (and inside nested
# configs such as an encoder-decoder's "encoder" and "decoder").
SIZE_LIMITS = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers",
                     "encoder_layers", "decoder_layers"), 256),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads"), 256),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embedding_size", "intermediate_size", "n_inner",
                     "d_ff", "d_kv", "encoder_ffn_dim", "decoder_ffn_dim"), 65_536),
    "vocab_size": 1_000_000,
    **dict.fromkeys(("max_position_embeddings", "n_positions"), 1_048_576),
    "type_vocab_size": 1_024,
}


def check_config_sizes(config: dict, where: str = "config.json") -> None:
    """Every size the config names is a whole number from 1 to its limit."""
    for key, value in config.items():
        if isinstance(value, dict):
            check_config_sizes(value, f"{where} ({key})")
            continue
        limit = SIZE_LIMITS.get(key)
        if limit is None or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise HeadLensError(f"The model's {where} gives {key} as {value!r}; it must be a whole number.")
        if not 1 <= value <= limit:
            raise HeadLensError(f"The model's {where} asks for {key} = {value:,}; HeadLens accepts 1 to "
                                f"{limit:,}, so this is not a model it can load.")


def check_parameter_count(build, name: str) -> int:
    """Build the model with ``build()`` on the meta device (no memory) and count its parameters."""
    try:
        with torch.device("meta"):
            skeleton = build()
    except HeadLensError:
        raise
    except Exception as err:  # noqa: BLE001 - a config transformers cannot build raises many types
        raise HeadLensError(f"The model {name} cannot be built from its config.json: {err}") from err
    count = sum(p.numel() for p in skeleton.parameters())
    if count > MAX_PARAMETERS:
        raise HeadLensError(f"The model {name} would have {count / 1e6:,.0f} million parameters; HeadLens "
                            f"loads at most {MAX_PARAMETERS / 1e6:,.0f} million, so it was not loaded.")
    return count


def check_weight_files(folder: Path, patterns: tuple[str, ...]) -> None:
    total = sum(f.stat().st_size for pattern in patterns for f in folder.glob(pattern) if f.is_file())
    if total > MAX_WEIGHT_BYTES:
        raise HeadLensError(f"The weights in {folder} take {total / 2**30:.1f} GiB; HeadLens loads at most "
                            f"{MAX_WEIGHT_BYTES / 2**30:.0f} GiB of weights, so it was not loaded.")


def token_limit(bytes_per_token_pair: int) -> int:
    """The most tokens one text may have for its attention to fit ``MAX_ATTENTION_BYTES``."""
    return max(1, math.isqrt(MAX_ATTENTION_BYTES // max(1, bytes_per_token_pair)))


def batches(lengths: list[int], batch_size: int, bytes_per_token_pair: int) -> list[list[int]]:
    """Indices of texts grouped by similar length, each group within ``batch_size`` and ``MAX_BATCH_BYTES``.

    A group is padded to its longest text, so its attention takes
    ``len(group) x longest^2 x bytes_per_token_pair``; a single text always makes a group.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups:
            group = groups[-1]
            longest = max(lengths[group[-1]], lengths[i])
            if len(group) < batch_size and (len(group) + 1) * longest**2 * bytes_per_token_pair <= MAX_BATCH_BYTES:
                group.append(i)
                continue
        groups.append([i])
    return groups
