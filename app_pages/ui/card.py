"""A head's card and the atlas, gathered from the results the other pages share, and the ways to open a card.

The card computes nothing another page computes: its parts are those pages' shared results (the Head roles
profile, the decoder detector, Effects' pairs, copying scores and task, Pruning's importance, Queries & keys'
pictures), asked with the arguments those pages open with, so the server's preparation has them ready. Its own
two measures, each head's strongest examples and what it writes, are declared here and prepared with them.
"""
from __future__ import annotations

import time

import pandas as pd

from models.catalog import CATALOG, bundled
from models.files import resolve_model_dir

from ..results.card import atlas
from ..results.models import ModelRef
from ..results.store import Store, folder_digest


_ON_DISK: dict = {}  # (choice, device) -> (when looked, the atlas found on disk or None)
LOOK_AGAIN_S = 30.0


def stored_atlas(choice: str, device: str) -> pd.DataFrame | None:
    """Another bundled model's atlas when some session or its preparation has made it (kept in memory or on
    disk), without loading that model; else None. The disk is read once a process (looked at again every
    ``LOOK_AGAIN_S`` while the atlas is not there)."""
    from .warm_up import results_root

    ref = ModelRef(choice, device=device)
    found = atlas.peek(ref)
    if found is None:
        looked, found = _ON_DISK.get((choice, device), (-LOOK_AGAIN_S, None))
        if found is None and time.monotonic() - looked >= LOOK_AGAIN_S:
            folder, _ = resolve_model_dir(bundled(choice).name)
            found = Store(results_root(), folder_digest(folder)).load(atlas.file_key(ref))
            _ON_DISK[(choice, device)] = (time.monotonic(), found)
    return None if found is None else found.copy()


def same_kind(ref: ModelRef) -> list[str]:
    """The other bundled models offering what ``ref``'s offers (``models.catalog``: a decoder's detector and
    vocabulary, an encoder's embedding), so measured alike, each by its first engine's key."""
    here = bundled(ref.choice)
    return [b.key for b in CATALOG if here is not None and b.offers == here.offers and b.key != here.key]
