"""The edges between a language model's nodes, the torch half of circuits: edge attribution (EAP, EAP-IG), exact
edge patching and a circuit's run, each one run of the stack with edits (``models.run``).

The residual stream a node reads is the sum of what the nodes before it wrote (the attentions' output biases
aside, which no corruption changes). The nodes that write (*senders*): the input (the embeddings), each head,
each MLP. The nodes that read (*receivers*): each head's query input, each key/value head's key and value inputs
(a query head reads its group's), each MLP's input and the logits. An *edge* is one sender's output within one
receiver's input; senders are ordered (input, then per layer its heads and its MLP) so that a receiver's senders
are the first ``reach[r]`` of them (an MLP beside its layer's attention, GPT-NeoX's, reads none of its heads).

``run_graph`` runs a batch with every receiver reading its own copy of the stream, which is what gives each
receiver its own gradient (EAP) and lets a circuit's run rebuild each receiver's input from its circuit senders'
outputs in this run and the other senders' outputs in a corrupted run (Hanna et al. 2024's evaluation). A head's
write in a block that norms its attention's output (Gemma 3) is its share of the normed sum, that norm's scale
taken at the layer's own output in the same run. How a sender's output reaches a receiver (as it is, or through a
post-norm encoder's norms) is the stack's path (``Stack.path``): the graph says which senders write at each level
and which stream each receiver reads (``Mix``), the path what the receiver makes of them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from models import head_label
from models.run import Edits, Given, device_of
from models.stacks.paths import part_at, read_level, written_level

from ..effects.readouts import READOUTS
from .mix import Mix, frozen_path


@dataclass(frozen=True)
class Graph:
    """A stack's nodes and edges. ``senders[s]`` and ``receivers[r]`` are ``(kind, layer, index)``: a head's index
    is its index in the model (a pruned model's kept heads); a key/value input's is its key/value head's in the
    layer's attention; the input's layer is -1, the logits' the number of layers. ``reach[r]``: how many first
    senders receiver ``r`` reads. ``reads[l]``: the query heads reading each key/value head of layer ``l``."""

    senders: tuple[tuple[str, int, int], ...]
    receivers: tuple[tuple[str, int, int], ...]
    reach: np.ndarray
    n_layers: int
    reads: tuple[tuple[tuple[int, ...], ...], ...]
    output: str = "logits"   # what the last receiver is called: a language model's logits, an encoder's embedding

    @property
    def n_edges(self) -> int:
        return int(self.reach.sum())

    def mask(self) -> np.ndarray:
        """``(senders, receivers)`` bool: which (sender, receiver) pairs are edges."""
        return np.arange(len(self.senders))[:, None] < self.reach[None, :]

    def sender_name(self, s: int) -> str:
        kind, layer, index = self.senders[s]
        return {"input": "input", "head": head_label(layer, index), "mlp": f"MLP {layer}"}[kind]

    def receiver_name(self, r: int) -> str:
        """The receiver's name: its node's (``receiver_node_name``) and, for a head's input, which one."""
        kind = self.receivers[r][0]
        node = self.receiver_node_name(r)
        return f"{node}.{kind}" if kind in ("q", "k", "v") else node

    def receiver_node_name(self, r: int) -> str:
        """The name of the node a receiver belongs to: a head (or a key/value head read by several), an MLP, the
        logits."""
        kind, layer, index = self.receivers[r]
        if kind == "q":
            return head_label(layer, index)
        if kind in ("k", "v"):
            heads = self.reads[layer][index]
            return head_label(layer, heads[0]) if len(heads) == 1 else f"L{layer} KV{index}"
        return self.output if kind == "logits" else f"MLP {layer}"

    def receiver_node(self, r: int) -> tuple[str, int, int]:
        """The node a receiver belongs to, as a sender names it (the logits: ``("logits", L, -1)``)."""
        kind, layer, index = self.receivers[r]
        return ("head", layer, index) if kind == "q" else ("mlp", layer, -1) if kind == "mlp" else \
            ("logits", layer, -1) if kind == "logits" else ("kv", layer, index)

    def layer_span(self, layer: int) -> tuple[slice, slice, int]:
        """Layer ``layer``'s head senders, its attention receivers (q, k, v) and its MLP receiver (-1: none)."""
        return self._spans[layer]

    @cached_property
    def sender_levels(self) -> np.ndarray:
        """``(senders,)``: where each sender writes into the stream (``models.stacks.paths``)."""
        return np.array([written_level(kind, layer) for kind, layer, _ in self.senders])

    @cached_property
    def receiver_levels(self) -> np.ndarray:
        """``(receivers,)``: where each receiver reads the stream."""
        return np.array([read_level(kind, layer) for kind, layer, _ in self.receivers])

    def at_level(self, level: int) -> slice:
        """The senders that write at ``level`` (a layer's heads, or its MLP; not the input)."""
        layer, ffn = part_at(level)
        heads = self.layer_span(layer)[0]
        return slice(heads.stop, heads.stop + 1) if ffn else heads

    @cached_property  # read at every layer of every run: computed once per graph
    def _spans(self):
        out, s, r = [], 1, 0
        for layer in range(self.n_layers):
            heads = sum(1 for k, l, _ in self.senders if k == "head" and l == layer)
            attn = sum(1 for k, l, _ in self.receivers if k in ("q", "k", "v") and l == layer)
            mlp = any(k == "mlp" and l == layer for k, l, _ in self.senders)
            out.append((slice(s, s + heads), slice(r, r + attn), r + attn if mlp else -1))
            s, r = s + heads + mlp, r + attn + mlp
        return out


def graph_of(stack) -> Graph:
    """The nodes and edges of a ``stack`` (from-scratch engine)."""
    senders, receivers, reach, reads = [("input", -1, -1)], [], [], []
    for layer, block in enumerate(stack.layers):
        attn, kept = block.attn, stack.kept[layer]
        groups = list(range(attn.num_heads)) if attn.kv_heads is None else attn.kv_heads
        reads.append(tuple(tuple(kept[i] for i in range(attn.num_heads) if groups[i] == g)
                           for g in range(attn.num_kv_heads)))
        before = len(senders)
        receivers += [("q", layer, h) for h in kept] + [(kind, layer, g) for kind in "kv"
                                                         for g in range(attn.num_kv_heads)]
        reach += [before] * (len(kept) + 2 * attn.num_kv_heads)
        senders += [("head", layer, h) for h in kept]
        if block_mlp(block):  # beside the attention (GPT-NeoX), the MLP reads what the heads read
            receivers.append(("mlp", layer, -1))
            reach.append(before if getattr(block, "parallel", False) else len(senders))
            senders.append(("mlp", layer, -1))
    receivers.append(("logits", stack.n_layers, -1))
    reach.append(len(senders))
    return Graph(tuple(senders), tuple(receivers), np.array(reach), stack.n_layers, tuple(reads),
                 READOUTS[stack.readouts[-1]].output)


def block_mlp(block) -> bool:
    """Whether a block has a feed-forward part (a decoder trained attention-only has none)."""
    return not getattr(block, "attention_only", False)


@dataclass
class Run:
    """One batch's run through the graph: ``outs`` ``(senders, B, n, E)`` every sender's output; ``reads[r]``
    ``(B, n, E)`` the stream receiver ``r`` read (one tensor per layer's attention, its MLP and the logits, shared
    by the receivers reading it); ``value`` ``(B,)`` the metric."""

    outs: torch.Tensor
    reads: dict[int, torch.Tensor]
    value: torch.Tensor
    taps: list[torch.Tensor]
    ids: torch.Tensor | None = None


def run_graph(stack, graph: Graph, emb: torch.Tensor, measure, rows: torch.Tensor, *,
              base: Run | None = None, keep: torch.Tensor | None = None, taps: bool = False, start: int = 0,
              ids: torch.Tensor | None = None, corrupt: dict[int, list[int]] | None = None) -> Run:
    """Run a batch whose input node writes ``emb`` ``(B, n, E)``, every receiver reading its own stream: the stack's
    run (``run_layers``) with edits at each layer's ``qkv_in``, ``result``, ``mlp_in`` and ``mlp_out`` and at the
    last ``resid_post`` (``GraphEdits``).

    Without ``keep`` each receiver reads the sum of every sender before it (the model's own run; ``taps``: each
    layer's receivers' streams, ``(receivers, B, n, E)``, kept in ``Run.taps`` to take each receiver's gradient). With ``keep`` ``(senders,
    receivers)`` (1: the edge is in the circuit) and the corrupted run ``base``, receiver ``r`` reads ``base``'s
    stream with each circuit sender's output in this run in place of its output in ``base``; ``start``: the first
    position where this run's input differs from ``base``'s (before it every output is ``base``'s, the model being
    causal, and nothing is added there). ``corrupt`` (without ``keep``): receiver -> the senders whose edges into
    it carry ``base``'s output instead of this run's (exact edge patching). With ``base``, what each receiver makes
    of its senders' outputs is the stack's path's (``Mix``)."""
    edits = GraphEdits(stack, graph, emb, base=base, keep=keep, taps=taps, start=start, corrupt=corrupt)
    final, _ = stack.run_layers(emb, need_weights=False, edits=edits.edits())
    return Run(edits.outs, edits.reads, measure(stack, final, rows), edits.tapped, ids)


class GraphEdits:
    """The edits by which one run of the stack is a run through the graph: what each receiver reads is rebuilt at
    ``qkv_in`` (a layer's heads), ``mlp_in`` and the last ``resid_post`` (the logits), what each sender writes kept
    at ``result`` and ``mlp_out`` (``run_graph`` says how)."""

    def __init__(self, stack, graph: Graph, emb: torch.Tensor, *, base: Run | None, keep: torch.Tensor | None,
                 taps: bool, start: int, corrupt: dict[int, list[int]] | None):
        S = len(graph.senders)
        self.path = stack.path
        self.B, self.n, self.E = emb.shape
        self.graph, self.base, self.start, self.corrupt, self.taps = graph, base, start, corrupt, taps
        self.outs = emb.new_empty(S, self.B, self.n, self.E)
        self.diff = None if keep is None else emb.new_empty(S, self.B, self.n - start, self.E)
        self.reads, self.tapped = {}, []
        self.keep = None if keep is None else keep.to(emb.dtype)
        self.entered = None if keep is None else self.keep.any(0)  # the receivers with a circuit edge into them
        self.n_layers = stack.n_layers
        self.record(0, emb)

    def edits(self) -> Edits:
        out = Edits()
        for layer in range(self.n_layers):
            heads, attn_r, mlp_r = self.graph.layer_span(layer)
            out["qkv_in", layer] = self._heads_read(heads, attn_r)
            out["result", layer] = self._writes(heads)
            if mlp_r >= 0:
                out["mlp_in", layer] = self._mlp_reads(heads.stop, mlp_r)
                out["mlp_out", layer] = self._writes(heads.stop)
        last = len(self.graph.receivers) - 1
        out["resid_post", self.n_layers - 1] = lambda x: self.streams(last, x, 1)[0]
        return out

    def _heads_read(self, heads: slice, r: slice):
        def read(streams):                                                     # (H + 2 G, B, n, E), x repeated
            if self.as_base(heads, r):
                return Given(self.base.outs[heads])
            return self.streams(r, streams[0], len(streams))
        return read

    def _writes(self, s: slice | int):
        def write(out):
            self.record(s, out)
            return out
        return write

    def _mlp_reads(self, s: int, r: int):
        def read(x):
            return Given(self.base.outs[s]) if self.as_base(s, r) else self.streams(r, x, 1)[0]
        return read

    def record(self, s: slice | int, out: torch.Tensor) -> None:
        self.outs[s] = out.detach()
        if self.diff is not None:
            self.diff[s] = out[..., self.start:, :] - self.base.outs[s][..., self.start:, :]

    def streams(self, r: slice | int, x: torch.Tensor | None, count: int) -> torch.Tensor:
        """``(count, B, n, E)``: what receivers ``r`` read."""
        first = r.start if isinstance(r, slice) else r
        level = int(self.graph.receiver_levels[first])
        if self.keep is None:
            self.reads[first] = x
            out = x.unsqueeze(0).expand(count, self.B, self.n, self.E)
            if self.taps:  # each receiver's own copy of the stream: its gradient is that receiver's alone
                self.tapped.append(out)
            if self.corrupt is None:
                return out
            swaps = [(i, self.corrupt[first + i]) for i in range(count) if first + i in self.corrupt]
            return self.path.read(Mix(self, first, count, out, swaps=swaps), level)
        out = self.path.read(Mix(self, first, count, keep=self.keep[:, r]), level)
        self.reads[first] = out[0] if count == 1 else None
        return out

    def as_base(self, s: slice | int, r: slice | int) -> bool:
        """Whether receivers ``r`` read ``base``'s streams (no circuit edge into any): senders ``s``' outputs are then
        ``base``'s, given rather than computed (a small circuit enters few layers; the model's stream is not
        formed with ``keep``)."""
        if self.keep is None or bool(self.entered[r].any()):
            return False
        first = r.start if isinstance(r, slice) else r
        self.reads[first] = self.base.reads[first] if isinstance(r, int) else None
        return True


def embeddings(stack, ids: torch.Tensor) -> torch.Tensor:
    return stack.embed(ids.to(device_of(stack)))


@torch.inference_mode()
def run_ids(stack, graph: Graph, ids: torch.Tensor, measure, rows: torch.Tensor) -> Run:
    """The model's own run of the prompts ``ids`` ``(B, n)`` through the graph (the base of a circuit's run)."""
    return run_graph(stack, graph, embeddings(stack, ids), measure, rows, ids=ids)


Progress = Callable[[int, int], None]


def edge_attribution(stack, graph: Graph, clean_ids: torch.Tensor, corrupted_ids: torch.Tensor, measure,
                     rows: torch.Tensor, steps: int = 1,
                     each_step: Callable[[int], None] | None = None) -> tuple[torch.Tensor, Run, Run]:
    """``(senders, receivers)``: each edge's score summed over the batch, the estimated fall of the metric when the
    edge's sender output is the corrupted run's instead of the clean run's: ``(a_clean - a_corrupted) · g``, ``g``
    the gradient of the metric by the receiver's stream. ``steps`` 1: ``g`` at the clean input (EAP, Syed et al.
    2023); more: averaged over inputs ``corrupted + j / steps (clean - corrupted)``, ``j`` 1 to ``steps`` (EAP-IG,
    Hanna et al. 2024). Also the clean and the corrupted runs. Zero where a pair is not an edge. ``each_step(j)``:
    called once the corrupted run and each step ``j`` are done (0 to ``steps``). A sender's change reaches a
    receiver along the stack's path, its norms frozen at the clean run's scales (``frozen_path``)."""
    f = shared_start(stack, clean_ids, corrupted_ids)                        # every output is the same before it
    with torch.inference_mode():
        e_clean, e_bad = embeddings(stack, clean_ids), embeddings(stack, corrupted_ids)
        bad = run_graph(stack, graph, e_bad, measure, rows, ids=corrupted_ids)
    if each_step is not None:
        each_step(0)
    e_clean, e_bad = e_clean.clone(), e_bad.clone()
    total = None
    for j in range(1, steps + 1):  # the last step's input is the clean one: its run is the clean run
        with torch.enable_grad():
            emb = (e_clean if j == steps else e_bad + (j / steps) * (e_clean - e_bad)).requires_grad_()
            run = run_graph(stack, graph, emb, measure, rows, taps=True)
            grads = torch.autograd.grad(run.value.sum(), run.taps)
        g = torch.cat([x[:, :, f:] for x in grads])                            # (receivers, B, n - f, E)
        total = g if total is None else total.add_(g)
        if each_step is not None:
            each_step(j)
    run.value, run.taps = run.value.detach(), []
    with torch.no_grad():
        g = total if steps == 1 else total / steps
        scores = frozen_path(stack, graph, run).scores(run.outs[:, :, f:] - bad.outs[:, :, f:], g,
                                                       graph.sender_levels, graph.receiver_levels)
    return scores * torch.as_tensor(graph.mask(), device=scores.device), run, bad


def shared_start(stack, a: torch.Tensor, b: torch.Tensor) -> int:
    """Up to where prompts ``a`` and ``b`` run alike: ``first_difference`` for a causal model, 0 for an encoder,
    where every token sees every other."""
    return first_difference(a, b) if stack.causal else 0


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    """The first position where some row of ``a`` differs from ``b``'s (the last when none does)."""
    differ = (a != b).any(0)
    return int(differ.int().argmax()) if bool(differ.any()) else a.shape[1] - 1


@torch.inference_mode()
def circuit_values(stack, graph: Graph, clean_ids: torch.Tensor, bad: Run, keep: torch.Tensor, measure,
                   rows: torch.Tensor) -> torch.Tensor:
    """``(B,)``: the metric of the clean prompts run with only the edges ``keep`` ``(senders, receivers)`` (1 in,
    0 out) carrying this run's outputs; every other edge carries the corrupted run ``bad``'s."""
    return run_graph(stack, graph, embeddings(stack, clean_ids), measure, rows, base=bad, keep=keep,
                     start=shared_start(stack, clean_ids, bad.ids)).value


@torch.inference_mode()
def patched_values(stack, graph: Graph, clean: Run, bad: Run, edges: list[tuple[int, int]], measure,
                   rows: torch.Tensor) -> torch.Tensor:
    """``(B,)``: the metric of the clean prompts (``clean``'s run) with only ``edges`` (``(sender, receiver)``
    pairs) carrying the corrupted run ``bad``'s output, every other edge this run's (the same as a circuit of every
    other edge, without rebuilding every receiver's input)."""
    corrupt: dict[int, list[int]] = {}
    for s, r in edges:
        corrupt.setdefault(r, []).append(s)
    return run_graph(stack, graph, embeddings(stack, clean.ids), measure, rows, base=bad, corrupt=corrupt).value


def all_edges(graph: Graph, device=None) -> torch.Tensor:
    return torch.as_tensor(graph.mask(), dtype=torch.float32, device=device)


def without(graph: Graph, edges: list[tuple[int, int]], device=None) -> torch.Tensor:
    """Every edge in but ``edges`` (``(sender, receiver)`` pairs): what exact edge patching runs."""
    keep = all_edges(graph, device)
    for s, r in edges:
        keep[s, r] = 0
    return keep
