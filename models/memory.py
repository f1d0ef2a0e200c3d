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
