"""The networks the from-scratch engine runs, one file each.

Each module here defines a ``Stack`` subclass naming the config.json ``model_types`` it opens (a decoder family
subclasses ``family.FamilyDecoder`` with its declaration); a new architecture is a new file, which
``for_model_type`` finds without a list to update.
"""
from __future__ import annotations

import importlib
import pkgutil

from .base import Stack, StackOutput


def architectures() -> list[type[Stack]]:
    """Every ``Stack`` subclass of this package's modules: the encoders, then the decoders, each in module-name order."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")
    found, todo = [], list(Stack.__subclasses__())
    while todo:  # a family's stack subclasses FamilyDecoder, which subclasses Stack
        cls = todo.pop(0)
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted((cls for cls in found if cls.model_types), key=lambda cls: (cls.language_model, cls.__module__))


def for_model_type(model_type: str) -> type[Stack] | None:
    return next((cls for cls in architectures() if model_type in cls.model_types), None)


__all__ = ["Stack", "StackOutput", "architectures", "for_model_type"]
