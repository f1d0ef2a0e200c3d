"""Where a family's weights lie in its files: one table per family of the from-scratch engine's names against the
file's, and the few tensors that are stored otherwise (q, k and v apart or fused another way, GPT-2's transposed
Conv1D, Phi-3's gate and up in one).

Names are templates: ``{i}`` stands for a layer. ``Renames`` maps a prefix of ours to a prefix of theirs; a
``Joined`` names tensors of ours that are one or several of theirs and converts between them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import HeadLensError


@dataclass(frozen=True)
class Joined:
    """The tensors ``ours`` (templates) that are the file's ``theirs``: ``read(theirs tensors, attn)`` gives ours,
    ``write(our tensors, attn)`` theirs, ``attn`` the layer's attention (its sizes, once heads are pruned)."""

    ours: tuple[str, ...]
    theirs: tuple[str, ...]
    read: Callable
    write: Callable


@dataclass(frozen=True)
class Weights:
    """A family's file names: ``renames`` ((ours, theirs) prefixes, a later one for the same prefix replacing an
    earlier; a layer's start ``layers.{i}.``) and ``joined``."""

    renames: tuple[tuple[str, str], ...]
    joined: tuple[Joined, ...] = ()
    what: str = "the weights of this family"  # "These are not <what>: missing ..."
    normalise: Callable[[str], str] | None = None  # a file's name as the table has it (a prefix some files add)

    def theirs(self, name: str) -> str:
        """The file's name of our tensor ``name`` that no ``Joined`` covers."""
        layer, rest = _layer(name)
        table = dict(self.renames)  # a later entry for a prefix replaces an earlier one
        for ours in sorted(table, key=len, reverse=True):  # the longest prefix first
            theirs = table[ours]
            if rest.startswith(ours):
                return theirs.format(i=layer) + rest[len(ours):]
        return rest

    def read(self, weights: dict[str, torch.Tensor], stack) -> dict[str, torch.Tensor]:
        """The file's ``weights`` under the names of ``stack`` (built on the meta device: its names and sizes)."""
        if self.normalise is not None:
            weights = {self.normalise(k): v for k, v in weights.items()}
        expected = set(stack.state_dict())
        ours, missing = {}, []
        for i, block in enumerate(stack.layers):
            for j in self.joined:
                names = [n.format(i=i) for n in j.ours]
                if not any(n in expected for n in names):
                    continue
                sources = [t.format(i=i) for t in j.theirs]
                absent = [s for s in sources if s not in weights]
                if absent:
                    missing.extend(absent)
                    continue
                for name, tensor in zip(names, j.read([weights[s] for s in sources], block.attn)):
                    ours[name] = tensor
        for name in sorted(expected - set(ours)):
            theirs = self.theirs(name)
            if theirs in weights:
                ours[name] = weights[theirs]
            else:
                missing.append(theirs)
        if missing:
            missing = sorted(missing)
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise HeadLensError(f"These are not {self.what}: missing {shown}.")
        return ours

    def write(self, state: dict[str, torch.Tensor], stack) -> dict[str, torch.Tensor]:
        """``stack``'s ``state`` under the file's names."""
        out, done = {}, set()
        for i, block in enumerate(stack.layers):
            for j in self.joined:
                names = [n.format(i=i) for n in j.ours]
                if all(n in state for n in names):
                    for theirs, tensor in zip(j.theirs, j.write([state[n] for n in names], block.attn)):
                        out[theirs.format(i=i)] = tensor
                    done.update(names)
        out.update({self.theirs(name): tensor for name, tensor in state.items() if name not in done})
        return out


def _layer(name: str) -> tuple[int | None, str]:
    """``(layer, name with "layers.N." as "layers.{i}.")``, or ``(None, name)`` outside a layer."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        return int(parts[1]), "layers.{i}." + ".".join(parts[2:])
    return None, name


# --- the ways a file stores what the from-scratch engine keeps as one q/k/v projection ---------------------------

def separate_qkv(theirs: str, kind: str = "weight", parts: tuple[str, str, str] = ("q", "k", "v")) -> Joined:
    """q, k and v as three tensors, ``theirs`` a template with ``{p}`` for each of ``parts`` (Llama's ``q_proj``)."""
    return Joined((f"layers.{{i}}.attn.in_proj_{kind}",), tuple(theirs.replace("{p}", p) + f".{kind}" for p in parts),
                  lambda ts, attn: (torch.cat(ts),), lambda ts, attn: ts[0].split(attn.sizes))


def per_head_qkv(theirs: str, kind: str = "weight") -> Joined:
    """q, k and v in one tensor, each head's three together (GPT-NeoX's ``query_key_value``)."""
    def read(ts, attn):
        t = ts[0]
        return (t.reshape(attn.num_heads, 3, attn.head_dim, *t.shape[1:]).transpose(0, 1).reshape(t.shape),)

    def write(ts, attn):
        t = ts[0]
        return (t.reshape(3, attn.num_heads, attn.head_dim, *t.shape[1:]).transpose(0, 1).reshape(t.shape),)
    return Joined((f"layers.{{i}}.attn.in_proj_{kind}",), (f"{theirs}.{kind}",), read, write)


def transposed(ours: str, theirs: str) -> Joined:
    """A weight the file keeps transposed (GPT-2's Conv1D, ``(in, out)``)."""
    return Joined((ours,), (theirs,), lambda ts, attn: (ts[0].T.contiguous(),), lambda ts, attn: (ts[0].T.contiguous(),))


def stacked(ours: tuple[str, str], theirs: str) -> Joined:
    """Two of our weights stacked by rows in one of the file's (Phi-3's ``gate_up_proj``: gate, then up)."""
    return Joined(ours, (theirs,), lambda ts, attn: tuple(ts[0].chunk(2)), lambda ts, attn: (torch.cat(ts),))
