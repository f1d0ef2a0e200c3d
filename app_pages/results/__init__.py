"""What the app computes, apart from what it draws: every result shared by all sessions, declared once with
``@shared`` beside the first arguments a page and the server's preparation ask for it with, and the model a
page names (``ModelRef``, ``cached_model``).

Nothing here imports ``app_pages.ui``: the widgets, views and page state there read results from here. The
server's preparation reads its steps from these declarations (``steps``); ``python -m
app_pages.results.preparation`` runs them from the command line.
"""
from __future__ import annotations

import importlib
import pkgutil

from .shared import DECLARED


def declarations() -> list:
    """Every ``@shared`` declaration, each module here imported so that it has declared its own."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return list(DECLARED.values())


def steps(ref) -> list[tuple]:
    """(result, arguments) of what ``ref``'s pages ask for first, in the order the declarations give (``Warm``),
    each result once (both engines of a model ask for the same one)."""
    found = sorted((d for d in declarations() if d.warm is not None), key=lambda d: d.warm.step)
    out, keys = [], set()
    for d in found:
        for args in d.warm.calls(ref):
            key = d.key(*args)
            if key not in keys:
                keys.add(key)
                out.append((d, tuple(args)))
    return out
