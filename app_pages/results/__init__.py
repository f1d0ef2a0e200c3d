"""What the app computes, apart from what it draws: every result shared by all sessions, declared once with
``@shared`` beside the first arguments a page and the server's preparation ask for it with, and the model a
page names (``ModelRef``, ``cached_model``).

Nothing here imports ``app_pages.ui``: the widgets, views and page state there read results from here. The
warm-up reads its steps from these declarations (``declarations``).
"""
from __future__ import annotations

import importlib
import pkgutil


def declarations() -> list:
    """Every ``@shared`` declaration, each module here imported so that it has declared its own."""
    from .shared import DECLARED

    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return list(DECLARED.values())
