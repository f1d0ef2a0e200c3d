"""Memory given back to the system after a long computation, and a model's mapped weights read in at once."""
from __future__ import annotations

import ctypes
import ctypes.util

import torch


def _libc_trim():
    """glibc's ``malloc_trim``, or None elsewhere. A long forward pass frees hundreds of MB of temporaries
    between the inputs it keeps; glibc keeps the freed heap until asked to give it back."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _libc_trim()


def release_memory() -> None:
    """Give the memory freed by a long computation back to the system (glibc), so that a server's
    resident memory follows what it holds."""
    if _TRIM is not None:
        _TRIM(0)


def page_in(module) -> None:
    """Read every weight and buffer of ``module`` (a ``torch.nn.Module``) once. Weights mapped from a file are
    paged in the first time they are read. A server whose results come from disk does this in the background
    as soon as a page has opened the model, so that the pages' next passes do not wait on the file."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.numel() and tensor.device.type == "cpu":
                tensor.sum()


def held_bytes(value, seen: set | None = None) -> int:
    """The bytes of the arrays, tensors and frames ``value`` holds, through its containers and attributes, each
    buffer counted once across the calls that share ``seen``. A model (a ``torch.nn.Module``, or whatever carries a
    tokenizer) is not walked: a result refers to the model it came from, which it does not hold."""
    import numpy as np
    import pandas as pd

    seen = set() if seen is None else seen
    total, todo = 0, [value]
    while todo:
        item = todo.pop()
        if id(item) in seen or item is None or isinstance(item, (int, float, bool, str, bytes, type)):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if ("storage", storage.data_ptr()) not in seen:
                seen.add(("storage", storage.data_ptr()))
                total += storage.nbytes()
        elif isinstance(item, np.ndarray):
            base = item
            while isinstance(base.base, np.ndarray):
                base = base.base
            if id(base) not in seen or base is item:
                seen.add(id(base))
                total += base.nbytes
        elif isinstance(item, (pd.DataFrame, pd.Series, pd.Index)):
            total += int(np.sum(item.memory_usage(deep=False)))  # a column of strings as its pointers
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
        elif isinstance(item, torch.nn.Module) or hasattr(item, "tokenizer") or callable(item):
            continue
        elif hasattr(item, "__dict__") or hasattr(item, "__slots__"):
            todo.extend(getattr(item, "__dict__", {}).values())
            todo.extend(getattr(item, name) for name in getattr(type(item), "__slots__", ()) if hasattr(item, name))
    return total
