"""The graph of a post-LayerNorm encoder (BERT, RoBERTa, DistilBERT): where each writer's output meets each reader.

A BERT block norms the stream after each write: ``x = LN(x + heads + bias)``, then ``x = LN(x + MLP(x))``. Number
the norms ``k``: ``2 l`` after layer ``l``'s attention, ``2 l + 1`` after its feed-forward. A sender writes before
norm ``level`` (the input, the embeddings: 0; a head of layer ``l``: ``2 l``; its MLP: ``2 l + 1``) and a receiver
reads the stream after every norm below its ``level`` (a head of layer ``l``: ``2 l``; its MLP: ``2 l + 1``; the
output: ``2 L``). With each norm's scale frozen at a run's value, norm ``k`` maps a part ``p`` to
``(p - mean(p)) * weight / sigma_k``, linear, so a sender's part of a receiver's input is its output passed through
the norms between their levels (``through``): an edge's attribution is that part's change times the receiver's
gradient (``edge_scores``).

A circuit's run does not freeze the norms: each receiver reads a stream of its own, rebuilt up the norms the model
applies (``private_streams``), each sender's output this run's where the edge is in the circuit and the corrupted
run's where it is not. With every edge in, every receiver reads the clean run's stream; with none, the corrupted
run's: both ends are the model's own runs.
"""
from __future__ import annotations

import numpy as np
import torch

from models.stacks.norms import frozen


def sender_levels(graph) -> np.ndarray:
    """``(senders,)``: the first norm each sender's output passes."""
    return np.array([0 if kind == "input" else 2 * layer + (kind == "mlp") for kind, layer, _ in graph.senders])


def receiver_levels(graph) -> np.ndarray:
    """``(receivers,)``: how many norms the stream each receiver reads has passed."""
    return np.array([2 * layer + (kind == "mlp") for kind, layer, _ in graph.receivers])


def scales(stack, graph, run) -> list[torch.Tensor]:
    """Every norm's frozen scale in ``run`` (a model's own run through ``graph``): ``weight / sigma`` per token,
    ``(B, n, E)`` each, norm ``k`` at index ``k``."""
    out = []
    with torch.no_grad():
        for k in range(2 * stack.n_layers):
            gain, _, scale = frozen(_norm(stack, k), _entering(graph, run, k) + _written(stack, graph, run, k))
            out.append(gain * scale)
    return out


def _norm(stack, k: int):
    layer, after_ffn = divmod(k, 2)
    return stack.layers[layer].ln_ffn if after_ffn else stack.layers[layer].ln_attn


def _entering(graph, run, k: int) -> torch.Tensor:
    """``(B, n, E)``: the stream entering the part norm ``k`` follows (a layer's attention, or its feed-forward)."""
    layer, after_ffn = divmod(k, 2)
    heads, attn_r, mlp_r = graph.layer_span(layer)
    return run.reads[mlp_r if after_ffn else attn_r.start]


def _written(stack, graph, run, k: int) -> torch.Tensor:
    """``(B, n, E)``: what the part norm ``k`` follows wrote into the stream in ``run`` (the heads and the output
    bias, or the feed-forward)."""
    layer, after_ffn = divmod(k, 2)
    heads, _, _ = graph.layer_span(layer)
    if after_ffn:
        return run.outs[heads.stop]
    bias = stack.layers[layer].attn.out_proj.bias
    return run.outs[heads].sum(0) + (0.0 if bias is None else bias.to(run.outs.dtype))


def _bias(block, like: torch.Tensor) -> torch.Tensor | float:
    bias = block.attn.out_proj.bias
    return 0.0 if bias is None else bias.to(like.dtype)


def _centred(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True)


def edge_scores(graph, norm_scales: list[torch.Tensor], delta: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """``(senders, receivers)``: ``<through(delta[s]), grads[r]>`` summed over the batch, each sender's change
    ``delta`` ``(senders, B, n, E)`` passed through the frozen norms between its level and the receiver's, against
    the receiver's gradient ``grads`` ``(receivers, B, n, E)``. Computed the other way round: each gradient pulled
    down the norms (a frozen norm's transpose scales, then centres), one level at a time."""
    s_level, r_level = sender_levels(graph), receiver_levels(graph)
    out = delta.new_zeros(len(s_level), len(r_level))
    pulled = grads.clone()
    for k in range(int(r_level.max()), -1, -1):
        active = np.nonzero(r_level >= k)[0]
        rows = torch.as_tensor(active, device=grads.device)
        senders = np.nonzero(s_level == k)[0]
        if len(senders):
            d = delta[torch.as_tensor(senders, device=delta.device)].reshape(len(senders), -1)
            out[np.ix_(senders, active)] = d @ pulled[rows].reshape(len(active), -1).T
        if k:
            pulled[rows] = _centred(pulled[rows] * norm_scales[k - 1])
    return out


def private_streams(stack, graph, r: slice | int, count: int, keep: torch.Tensor, base: torch.Tensor,
                    diff: torch.Tensor) -> torch.Tensor:
    """``(count, B, n, E)``: what receivers ``r`` read in a circuit's run, each its own stream rebuilt from the
    input up through the model's norms, every sender's output ``base`` (the corrupted run's, ``(senders, B, n,
    E)``) plus ``diff`` (this run's less it) where ``keep`` ``(senders, receivers)`` has the edge."""
    first = r.start if isinstance(r, slice) else r
    level = int(receiver_levels(graph)[first])
    m = int(graph.reach[first])
    weights = keep[:m, r].reshape(m, count)

    def mixed(s: slice) -> torch.Tensor:                                      # (count, B, n, E): senders s summed
        w = weights[s]
        written = base[s].sum(0)
        return written + (w.T @ diff[s].reshape(len(w), -1)).view(count, *written.shape)

    u = mixed(slice(0, 1))
    for layer in range((level + 1) // 2):
        block = stack.layers[layer]
        heads, _, _ = graph.layer_span(layer)
        u = block.ln_attn(u + mixed(heads) + _bias(block, u))
        if 2 * layer + 1 < level:
            u = block.ln_ffn(u + mixed(slice(heads.stop, heads.stop + 1)))
    return u


def parts_at(graph, norm_scales: list[torch.Tensor], outs: torch.Tensor, level: int) -> torch.Tensor:
    """``(m, B, n, E)``: each of the first ``m`` senders' part of the stream after norm ``level - 1`` (the senders
    below that level), its output ``outs`` passed through the norms between, frozen: the parts sum to that stream
    less what the norms' and the output projections' biases add."""
    s_level = sender_levels(graph)
    m = int((s_level < level).sum())
    parts = outs[:m].clone()
    for k in range(level):
        below = torch.as_tensor(np.nonzero(s_level[:m] <= k)[0], device=outs.device)
        parts[below] = _centred(parts[below]) * norm_scales[k]
    return parts


def stream_without(stack, graph, run, level: int, writer: int, where: torch.Tensor) -> torch.Tensor:
    """``(B, n, E)``: the stream after norm ``level - 1`` with sender ``writer``'s output taken out where it wrote, at
    the positions ``where`` ``(n,)`` bool, each norm above it recomputed as the model computes it (every other
    sender's output as ``run`` has it)."""
    start = int(sender_levels(graph)[writer])
    x = _entering(graph, run, start)
    for k in range(start, level):
        u = x + _written(stack, graph, run, k)
        if k == start:
            u = u - run.outs[writer] * where.to(u.dtype).view(-1, 1)
        x = _norm(stack, k)(u)
    return x
