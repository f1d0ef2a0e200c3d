"""Attention as files: .npz and .json for a whole result, CSV for one head."""
from __future__ import annotations

import csv
import io
import json

import numpy as np

from models.result import Attention

from .views import View


def metadata(att: Attention) -> dict:
    return {"text": att.text, "model": att.model_name, "backend": att.backend, "device": att.device,
            "component": att.component, "causal": att.causal, "truncated": att.truncated,
            "n_tokens_original": att.n_tokens_original, "layers": att.n_layers, "heads": att.n_heads,
            **({} if att.layers is None else {"model_layers": list(att.layers)}),
            "pruned_heads": [] if att.pruned is None else [[int(l), int(h)] for l, h in zip(*np.nonzero(att.pruned))]}


def attention_npz(att: Attention) -> bytes:
    """``weights`` (layers, heads, queries, keys) float32, ``tokens``, ``key_tokens``, ``word_ids``
    (-1 for special tokens), ``special``, ``offsets`` and ``metadata`` (a JSON string)."""
    buf = io.BytesIO()
    np.savez_compressed(
        buf, weights=att.weights, tokens=np.array(att.tokens, dtype=str), key_tokens=np.array(att.key_tokens, dtype=str),
        word_ids=np.array([-1 if w is None else w for w in att.word_ids], dtype=np.int64),
        special=np.asarray(att.special, dtype=bool), offsets=np.array(att.offsets, dtype=np.int64).reshape(-1, 2),
        metadata=np.array(json.dumps(metadata(att))))
    return buf.getvalue()


def attention_json(att: Attention, decimals: int = 6) -> str:
    """The same content as JSON; weights as nested lists rounded to ``decimals``."""
    return json.dumps({
        **metadata(att), "tokens": att.tokens, "key_tokens": att.key_tokens, "word_ids": att.word_ids,
        "special": [bool(s) for s in att.special], "offsets": [list(o) for o in att.offsets],
        "weights": np.round(att.weights.astype(np.float64), decimals).tolist()}, ensure_ascii=False)


def head_csv(view: View, layer: int, head: int) -> str:
    """One head: a row per query, a column per key, labelled with the view's tokens or words."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["query \\ key", *view.key_labels])
    for label, row in zip(view.query_labels, view.head(layer, head)):
        writer.writerow([label, *(f"{x:.6g}" for x in row)])
    return out.getvalue()
