"""How a prediction flows: the routes by which information reaches a token (Ferrando & Voita 2024).

A decoder's residual stream at token ``i`` is updated twice a layer: by the attention, with a part
from each head and each earlier token (the head's weight on it times what it writes from there),
and by the MLP. ``prediction_flow`` splits every update into the shares of its parts in one
forward pass (``effects.parts.shares``: each part's L1 proximity to the updated stream, over
the sum of the parts'). ``flow_graph`` then starts at one token's last residual and walks down,
keeping each edge (a head from an earlier token, the MLP, the stream passing through) whose share
is at least a threshold, and only what connects to the start: the routes of that prediction.

The nodes are residual states: ``(0, i)`` the embeddings, ``(2l + 1, i)`` token ``i`` after layer ``l``'s
attention, ``(2l + 2, i)`` after its MLP.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from models import AttentionModel, HeadLensError

from . import parts as P
from .traced import Traced, as_traced

THRESHOLD = 0.04  # the LLM Transparency Tool's default: an edge with less of an update is left out
EDGE_COLUMNS = ["kind", "layer", "head", "source", "target", "share", "from_level", "to_level"]


@dataclass(frozen=True)
class Flow:
    """A prompt's update shares (``effects.parts.Shares``) and its tokens."""

    shares: P.Shares
    tokens: list[str]

    @property
    def n_layers(self) -> int:
        return self.shares.heads.shape[0]

    @property
    def n_heads(self) -> int:
        return self.shares.heads.shape[1]


def prediction_flow(model: AttentionModel, prompt: str | Traced) -> Flow:
    """Every residual update of ``prompt`` split into the shares of what wrote it, from its one forward pass."""
    t = as_traced(model, prompt)
    return Flow(P.shares(t.model, t.trace, torch.tensor(t.weights())), t.tokens)


def flow_graph(flow: Flow, position: int = -1, threshold: float = THRESHOLD) -> pd.DataFrame:
    """The edges with a share of at least ``threshold`` that lead to token ``position``'s last residual state:
    one row each, ``kind`` ("head", "mlp", "residual"), ``layer``, ``head`` (-1 but for a head), ``source`` and
    ``target`` (token positions), ``share``, and the levels of the two states it joins (``from_level``,
    ``to_level``: 0 the embeddings, ``2l + 1`` after layer ``l``'s attention, ``2l + 2`` after its MLP).
    ``frame.attrs``: ``position``, ``threshold``, ``tokens``."""
    n, L = len(flow.tokens), flow.n_layers
    if not -n <= position < n:
        raise HeadLensError(f"The prompt has {n} tokens; there is no position {position}.")
    if not 0 < threshold <= 1:
        raise HeadLensError(f"The threshold is a share of an update, above 0 and at most 1 (not {threshold}).")
    position %= n
    s = flow.shares
    rows = []
    live = {position}                                   # tokens whose state at the current level is reached
    for layer in reversed(range(L)):
        mid, out = 2 * layer + 1, 2 * layer + 2
        below = set()                                   # tokens reached after this layer's attention
        for i in sorted(live):
            for kind, share in (("mlp", s.mlp[layer, i]), ("residual", s.mlp_residual[layer, i])):
                if share >= threshold:
                    rows.append((kind, layer, -1, i, i, float(share), mid, out))
                    below.add(i)
        live, below = below, set()
        for i in sorted(live):
            if s.attn_residual[layer, i] >= threshold:
                rows.append(("residual", layer, -1, i, i, float(s.attn_residual[layer, i]), mid - 1, mid))
                below.add(i)
            heads, sources = np.nonzero(s.heads[layer, :, i, :] >= threshold)
            for h, j in zip(heads.tolist(), sources.tolist()):
                rows.append(("head", layer, h, j, i, float(s.heads[layer, h, i, j]), mid - 1, mid))
                below.add(j)
        live = below
    frame = pd.DataFrame(rows, columns=EDGE_COLUMNS)
    frame.attrs.update(position=position, threshold=threshold, tokens=flow.tokens)
    return frame


def flow_heads(flow: Flow, position: int = -1, threshold: float = 0.0) -> np.ndarray:
    """``(layers, heads)``: how much of token ``position``'s last state passes through each head: every route
    from it down to one of the head's edges, its shares multiplied, summed over the routes (edges below
    ``threshold`` left out; 0 keeps them all, and then the MLP stage passes on whatever reaches it, its two
    edges coming from one state)."""
    n = len(flow.tokens)
    if not -n <= position < n:
        raise HeadLensError(f"The prompt has {n} tokens; there is no position {position}.")
    s = flow.shares
    keep = lambda a: np.where(a >= threshold, a, 0.0)  # noqa: E731
    weight = np.zeros(n)
    weight[position % n] = 1.0
    out = np.zeros((flow.n_layers, flow.n_heads))
    for layer in reversed(range(flow.n_layers)):
        weight = weight * (keep(s.mlp[layer]) + keep(s.mlp_residual[layer]))  # two edges from one state: 1 for all
        through = keep(s.heads[layer]) * weight[None, :, None]              # (heads, targets, sources)
        out[layer] = through.sum((1, 2))
        weight = weight * keep(s.attn_residual[layer]) + through.sum((0, 1))
    return out


def strongest_route(graph: pd.DataFrame) -> pd.DataFrame:
    """The route through ``graph`` from an embedding up to its end whose shares multiply to the most, among
    those that leave their token through a head at least once when the graph has any (the stream passing
    straight up is the strongest route to most predictions, and says little): the graph's rows on it,
    from the bottom up."""
    if graph.empty:
        return graph
    top, end = int(graph["to_level"].max()), int(graph.attrs["position"])
    # state (level, token, a head above): (log product up to the end, edge row, the state above)
    best = {(top, end, False): (0.0, None, None)}
    levels = graph["to_level"].to_numpy()
    for level in range(top, 0, -1):
        for index in np.flatnonzero(levels == level):
            edge = graph.iloc[index]
            for above in (False, True):
                state = (level, int(edge["target"]), above)
                if state not in best:
                    continue
                down = (level - 1, int(edge["source"]), above or edge["kind"] == "head")
                value = best[state][0] + float(np.log(edge["share"]))
                if down not in best or value > best[down][0]:
                    best[down] = (value, index, state)
    starts = [k for k in best if k[0] == 0]
    if not starts:  # every route down ends at a state none of whose parts reaches the threshold
        return graph.iloc[[]]
    through_head = [k for k in starts if k[2]]
    state = max(through_head or starts, key=lambda k: best[k][0])
    rows = []
    while best[state][1] is not None:
        _, index, state = best[state]
        rows.append(index)
    return graph.iloc[rows]
