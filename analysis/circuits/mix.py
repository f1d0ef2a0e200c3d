"""What a circuit's receivers read, in the forms a stack's path takes (``Mix``), and a run's stream by level for the
path to freeze its norms at (``by_level``, ``frozen_path``): the graph's side of ``models.stacks.paths``."""
from __future__ import annotations

import torch

from models.stacks.paths import part_at


class Mix:
    """What receivers ``first`` to ``first + count`` read in a run with some edges carrying another run's outputs,
    in the two forms a stack's path takes (``models.stacks.paths``): ``summed``, the stream as a sum of outputs,
    and by level (``entering``, ``written``), each level's senders' outputs summed, for a path that rebuilds the
    stream up its norms. With ``keep`` ``(senders, count)`` (a circuit's run, ``GraphEdits.keep``) a sender's
    output is the base run's plus, where the edge is in, its change in this run; with ``swaps`` ((receiver, senders)
    pairs, exact edge patching) it is this run's but where the edge is swapped, the base run's. ``out``: the
    stream as this run formed it, every receiver's (with ``swaps``)."""

    def __init__(self, edits, first: int, count: int, out: torch.Tensor | None = None, *,
                 keep: torch.Tensor | None = None, swaps=()):
        self.edits, self.first, self.count, self.out, self.swaps = edits, first, count, out, swaps
        m = int(edits.graph.reach[first])
        if keep is not None:
            self.weights, self.diff, self.start = keep[:m].reshape(m, count), edits.diff, edits.start
        else:  # every edge in (its change this run's) but the swapped ones
            self.weights = out.new_ones(m, count)
            for i, senders in swaps:
                self.weights[senders, i] = 0
            self.diff, self.start = None, 0

    def summed(self) -> torch.Tensor:
        """``(count, B, n, E)``: the base run's stream plus each circuit sender's change (``keep``), or this run's
        less each swapped sender's change."""
        e = self.edits
        if self.diff is None:
            if not self.swaps:
                return self.out
            out = self.out.clone()
            for i, senders in self.swaps:
                for s in senders:
                    out[i] += e.base.outs[s] - e.outs[s]
            return out
        active = self.weights.any(1).nonzero().view(-1)         # the senders with an edge here in the circuit
        out = e.base.reads[self.first].unsqueeze(0).repeat(self.count, 1, 1, 1)
        if len(active):
            moved = self.weights[active].T @ self.diff[active].reshape(len(active), -1)
            out[:, :, self.start:] += moved.view(self.count, e.B, e.n - self.start, e.E)
        return out

    def entering(self) -> torch.Tensor:
        """``(count, B, n, E)``: what the input wrote, as each receiver takes it."""
        return self._mixed(slice(0, 1))

    def written(self, level: int) -> torch.Tensor:
        """``(count, B, n, E)``: what the senders at ``level`` wrote, summed, as each receiver takes it."""
        return self._mixed(self.edits.graph.at_level(level))

    def _mixed(self, s: slice) -> torch.Tensor:
        e = self.edits
        w, base = self.weights[s], e.base.outs[s]
        diff = self.diff[s] if self.diff is not None else e.outs[s] - base
        moved = (w.T @ diff.reshape(len(w), -1)).view(self.count, e.B, e.n - self.start, e.E)
        return base.sum(0) + torch.nn.functional.pad(moved, (0, 0, self.start, 0))


def by_level(graph, run):
    """``run``'s stream by level (``models.stacks.paths``): ``entering(level)``, what the part writing at ``level``
    read, and ``written(level)``, what its senders wrote, summed (``(B, n, E)`` each)."""
    def entering(level: int) -> torch.Tensor:
        layer, ffn = part_at(level)
        heads, attn_r, mlp_r = graph.layer_span(layer)
        return run.reads[mlp_r if ffn else attn_r.start]

    def written(level: int) -> torch.Tensor:
        return run.outs[graph.at_level(level)].sum(0)
    return entering, written


def frozen_path(stack, graph, run):
    """``stack``'s path (``Stack.path``) with its norms frozen at ``run``'s (a model's own run through ``graph``)."""
    return stack.path.freeze(*by_level(graph, run))
