"""Why a head attends where it does: each pre-softmax score split exactly over what wrote into the stream its
query and its key read.

A head's score is ``q · k · scale``. Its query is the head's projection of the normed residual stream at the
query's position, its key the key/value head's projection of the normed stream at the key's. With every norm's
scale frozen at its value in the run (the block's input norm; Gemma 3's QK-norm) and the rotary rotation a
fixed linear map at each position, both are sums over the stream's writers (``analysis.circuits.graph``' senders: the
input, each earlier head, each earlier MLP) plus a constant (projection and norm biases, the attentions' output
biases): the score is exactly a sum over (query-side writer, key-side writer) pairs, the constant one of them.
OLMo-2's norm of the whole query (key) projection is frozen the same way, at every head's projection in the run.
A soft-capped score (Gemma 2's) is split before its cap, which the softmax then applies. On a post-norm encoder
(BERT) the head reads the stream as it is, and each writer's part of it has passed the norms above where it wrote,
frozen: the split stays exact, and a query sees every key. Both the writers' parts (``Stack.path``) and the query
and key they make (``query_key_sides``) are the stack's own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.stacks.paths import query_key_sides, read_level

from ..circuits import graph as C
from ..circuits.mix import by_level, frozen_path

CONSTANT = "biases"  # the writer every side ends with: what no node writes (projection, norm and output biases)


@dataclass(frozen=True)
class HeadSides:
    """One head's query and key split by writer, ``(writers + 1, B, n, Dh)`` each (the last row the constant),
    rotated, normed with frozen scales and with the query multiplied by the score's ``scale``: ``q[:, b, i].sum(0)
    · k[:, b, j].sum(0)`` is the head's score from query ``i`` to key ``j``. ``window``: how many last keys a
    query sees (None: every earlier one); ``softcap``: the cap the softmax applies to a score first (Gemma 2's)."""

    q: torch.Tensor
    k: torch.Tensor
    window: int | None
    softcap: float | None = None
    causal: bool = True          # a query sees the keys up to it (False: an encoder's, every key)

    def _keys(self, query: int) -> slice:
        return slice(0, query + 1) if self.causal else slice(0, self.k.shape[2])

    def split(self, query: int, keys: slice | None = None) -> torch.Tensor:
        """``(writers + 1, writers + 1, B, keys)``: each (query-side, key-side) writer pair's part of the score from
        ``query`` to each of ``keys`` (default every key it sees: up to it, or all of an encoder's)."""
        keys = self._keys(query) if keys is None else keys
        return torch.einsum("sbd,tbjd->stbj", self.q[:, :, query], self.k[:, :, keys])

    def scores(self, query: int) -> torch.Tensor:
        """``(B, keys)``: the head's scores from ``query`` to every key up to it (an encoder's: every key; masked ones
        included)."""
        return torch.einsum("bd,bjd->bj", self.q[:, :, query].sum(0), self.k[:, :, self._keys(query)].sum(0))

    def at(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``(B, writers + 1, writers + 1)``: each row's split of one score, from ``queries[b]`` to ``keys[b]``
        (``(B,)`` positions, one pair of each row: a task's roles)."""
        b = torch.arange(self.q.shape[1], device=self.q.device)
        return torch.einsum("sbd,tbd->bst", self.q[:, b, queries.to(self.q.device)],
                            self.k[:, b, keys.to(self.k.device)])

    def visible(self, query: int) -> torch.Tensor:
        """``(keys,)`` bool: which of the keys up to ``query`` (an encoder's: every key) it sees (all, or its
        window's last ones)."""
        keys = torch.arange(self._keys(query).stop, device=self.q.device)
        return keys > query - self.window if self.window is not None else torch.ones_like(keys, dtype=torch.bool)


def _reads(graph: C.Graph, layer: int) -> tuple[int, int]:
    """Layer ``layer``'s first attention receiver (its stream is ``Run.reads``' entry) and how many writers it reads."""
    first = graph.layer_span(layer)[1].start
    return first, int(graph.reach[first])


def writers_run(stack, graph: C.Graph, ids: torch.Tensor) -> C.Run:
    """The prompts ``ids`` ``(B, n)`` run once through the graph: every writer's output and each layer's stream."""
    with torch.inference_mode():
        emb = C.embeddings(stack, ids)
        return C.run_graph(stack, graph, emb, lambda s, x, rows: x.new_zeros(len(x)), torch.arange(len(ids)),
                           ids=ids)


def head_sides(stack, graph: C.Graph, run: C.Run, layer: int, head: int) -> HeadSides:
    """Head ``head`` (its index in the unpruned model) of ``layer`` split over the writers before it in ``run``."""
    block = stack.layers[layer]
    kept = stack.kept[layer]
    if head not in kept:
        raise ValueError(f"Head {head} of layer {layer} was pruned away.")
    first, m = _reads(graph, layer)
    x = run.reads[first]                                                          # (B, n, E)
    parts = frozen_path(stack, graph, run).parts_at(run.outs[:m].to(x.dtype), graph.sender_levels[:m],
                                                      read_level("q", layer))  # each passed the norms above it
    q, k = query_key_sides(block, parts, x, kept.index(head))
    return HeadSides(q, k, block.attn.window, block.attn.softcap, stack.causal)


def writer_names(graph: C.Graph, layer: int) -> list[str]:
    """The writers a head of ``layer`` reads, as ``HeadSides`` orders them, the constant last."""
    return [graph.sender_name(s) for s in range(_reads(graph, layer)[1])] + [CONSTANT]


def writer_nodes(graph: C.Graph, layer: int) -> list[tuple[str, int, int]]:
    """The writers of ``writer_names`` as ``(kind, layer, index)`` (the constant: ``("constant", -1, -1)``)."""
    return list(graph.senders[:_reads(graph, layer)[1]]) + [("constant", -1, -1)]


@torch.inference_mode()
def scores_without(stack, graph: C.Graph, run: C.Run, layer: int, head: int, query: int, writer: int,
                   side: str) -> torch.Tensor:
    """``(B, query + 1)``: the head's scores from ``query`` when writer ``writer``'s output (``writer_names``' index;
    the last, the constant, is not a node's) is taken out of the stream its query reads at ``query`` (``side`` "q")
    or of the stream its keys read at every position (``side`` "k"), each norm recomputed as the model does (a
    post-norm encoder's: every norm between the writer and the head)."""
    block, attn = stack.layers[layer], stack.layers[layer].attn
    i = stack.kept[layer].index(head)
    x = run.reads[_reads(graph, layer)[0]]                                    # (B, n, E)
    n = x.shape[1]
    where = torch.arange(n, device=x.device) == query if side == "q" else torch.ones(n, dtype=torch.bool,
                                                                                      device=x.device)
    change = run.outs[writer].to(x.dtype) * where.to(x.dtype).view(-1, 1)
    less = stack.path.without(x, *by_level(graph, run), int(graph.sender_levels[writer]), read_level("q", layer),
                              change)
    xq, xk = (less, x) if side == "q" else (x, less)
    q, k, _ = attn.heads_qkv(block.attention_input(xq), block.attention_input(xk), block.attention_input(xk))
    q = q[:, i, query] * attn.head_dim ** -0.5                                   # (B, Dh)
    return torch.einsum("bd,bjd->bj", q, k[:, i, :query + 1 if stack.causal else n])
