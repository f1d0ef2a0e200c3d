"""The networks the from-scratch engine runs, one file each.

Each module here defines a ``Stack`` subclass naming the config.json ``model_types`` it opens; a
new architecture is a new file, which ``for_model_type`` finds without a list to update.
"""
from __future__ import annotations

import importlib
import pkgutil

from .base import Stack, StackOutput


def architectures() -> list[type[Stack]]:
    """Every ``Stack`` subclass of this package's modules, in module-name order."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")
    return [cls for cls in Stack.__subclasses__() if cls.model_types]


def for_model_type(model_type: str) -> type[Stack] | None:
    return next((cls for cls in architectures() if model_type in cls.model_types), None)


__all__ = ["Stack", "StackOutput", "architectures", "for_model_type"]
