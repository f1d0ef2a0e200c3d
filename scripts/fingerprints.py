"""What the API gives on the bundled models, hashed: run before and after a change that should alter no figure,
and compare the two files (``diff``). Each model's card parts (Head roles, explanations, the detector, what heads
write, copying, the built-in pairs attributed and patched, the first task, importance) and each built-in task's
pairs, on four sentences to stay within minutes on two cores.

    python scripts/fingerprints.py minilm smollm2 gemma3 > before.txt
"""
from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from analysis.cards.build import card_parts  # noqa: E402
from analysis.effects import own_readout  # noqa: E402
from analysis.tasks.build import make_task  # noqa: E402
from models import load_model  # noqa: E402
from models.catalog import BY_KEY  # noqa: E402
from models.corpus import CORPUS  # noqa: E402

TASK_NAMES = ("ioi", "facts", "greater_than", "induction", "objects", "relation", "sentence_type", "sentiment")


def digest(value) -> str:
    """A short hash of a frame (its values, index and columns), an array or tensor, a dataclass, list or dict (their
    parts'), or anything else's ``repr``."""
    if isinstance(value, pd.DataFrame):
        raw = pd.util.hash_pandas_object(value, index=True).to_numpy().tobytes() + repr(list(value.columns)).encode()
    elif isinstance(value, pd.Series):
        raw = pd.util.hash_pandas_object(value, index=True).to_numpy().tobytes()
    elif isinstance(value, torch.Tensor):
        raw = value.detach().cpu().numpy().tobytes()
    elif isinstance(value, np.ndarray):
        raw = value.tobytes()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        raw = repr([(f.name, digest(getattr(value, f.name))) for f in dataclasses.fields(value)]).encode()
    elif isinstance(value, list | tuple):
        raw = repr([digest(v) for v in value]).encode()
    elif isinstance(value, dict):
        raw = repr([(repr(k), digest(v)) for k, v in value.items()]).encode()
    else:
        raw = repr(value).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def prints(key: str):
    model = load_model(BY_KEY[key].name, backend="scratch", device="cpu")
    yield "builtin pairs", digest(sorted((k, repr(p)) for k, p in own_readout(model).builtin_pairs().items()))
    for name in TASK_NAMES:
        try:
            task = make_task(model, name, n=6)
            yield f"task {name}", digest((task.metric, task.pairs))
        except Exception as err:  # noqa: BLE001
            yield f"task {name}", f"refused: {type(err).__name__}"
    first = own_readout(model).first_task
    parts = card_parts(model, sentences=list(CORPUS[:4]), task=(first[0], 8) if first else None)
    yield "decoder", bool(getattr(parts, "decoder", False) or "vocabulary" in getattr(parts, "offers", ()))
    for what in ("profile", "writes", "detector", "copying", "importance", "explanations", "task"):
        value = getattr(parts, what)
        yield what, None if value is None else digest(value)
    for name, (attribution, patched) in sorted(parts.pairs.items()):
        yield f"pair {name}", (None if attribution is None else digest(attribution), digest(patched))
    yield "left out", sorted(parts.left_out)


if __name__ == "__main__":
    for key in sys.argv[1:] or ["minilm"]:
        for what, value in prints(key):
            print(f"{key}\t{what}\t{value}", flush=True)
