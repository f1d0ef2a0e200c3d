"""What each head contributes to a prediction, the torch half of patching, read from a prompt's run with edits
(``models.run``; TransformerLens's vocabulary).

A pre-norm decoder's last residual is the sum of what wrote into it: the embeddings, each head's
``result`` (its output ``z`` through its slice of the output projection), each attention's bias and each
MLP's output. ``trace`` runs one prompt and keeps, per layer, the residual entering it (``resid_pre``)
and every head's ``z``; ``patched_differences`` then runs many edited copies of a corrupted prompt at once, a
clean activation put in place of the corrupted one in each, recomputing only the layers above the
edit: every copy that starts at a layer joins the batch there, so a layer runs once for all the
copies that have reached it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from models.run import Trace, as_batch, language_stack, trace, trace_batch, trace_weights

from .batched import attribution_batch, patched_measures

__all__ = ["Trace", "trace", "trace_batch", "language_stack", "trace_weights", "head_results", "result_norms",
           "attention_biases", "embedding_parts", "direction", "patched_differences", "attribution_estimates",
           "head_values",
           "output_columns", "head_writes", "Shares", "shares"]

Progress = Callable[[int, int], None]


def _layer_results(stack, t: Trace, layer: int, position) -> torch.Tensor | None:
    """``(..., kept heads, E)`` at ``position`` (``(..., n, kept heads, E)`` for ``slice(None)``): each kept head's
    ``z`` through its slice of the output projection and the norm a block puts on its attention's output (Gemma 3),
    that norm's scale frozen at the whole output's value; None for a layer whose heads are all pruned."""
    block, kept = stack.layers[layer], stack.kept[layer]
    if not kept:
        return None
    w_out = block.attn.output_columns()                                               # (E, kept, Dh)
    z = t.z[layer].movedim(-2, -3)[..., position, :, :]                                # (..., [n,] kept, Dh)
    results = torch.einsum("...hd,ehd->...he", z, w_out)
    bias = block.attn.output_bias
    scale = block.attention_scale(results.sum(-2) + (0 if bias is None else bias))
    return results if scale is None else results * scale.unsqueeze(-2)


def head_results(stack, t: Trace, position: int = -1) -> torch.Tensor:
    """``(layers, heads, E)`` (``(B, layers, heads, E)`` for a batch's trace): each head's ``result`` at ``position``,
    its ``z`` through its slice of the output projection (zero for a pruned head), and through the norm a block
    puts on its attention's output (Gemma 3), that norm's scale frozen at the whole output's value: the heads'
    results add up to what the attention writes, less its bias."""
    L, H = stack.n_layers, stack.n_heads
    like = t.resid[0]
    out = like.new_zeros(*like.shape[:-2], L, H, like.shape[-1])
    for layer in range(L):
        results = _layer_results(stack, t, layer, position)
        if results is not None:
            out.select(-3, layer)[..., stack.kept[layer], :] = results
    return out


def result_norms(stack, t: Trace) -> torch.Tensor:
    """``(B, layers, heads, n)`` for a batch's trace: the norm of each head's ``result`` (as ``head_results``) at
    every position; zero for a pruned head."""
    B, n = t.resid[0].shape[:2]
    out = t.resid[0].new_zeros(B, stack.n_layers, stack.n_heads, n)
    for layer in range(stack.n_layers):
        results = _layer_results(stack, t, layer, slice(None))                         # (B, n, kept, E)
        if results is not None:
            out[:, layer, stack.kept[layer]] = results.norm(dim=-1).transpose(1, 2)
    return out


@torch.inference_mode()
def embedding_parts(stack, t: Trace, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """An encoder's embedding metric (``metrics.EmbeddingCosine``: the mean of the final hidden states, its cosine
    with ``weights`` ``(B, E)``) of a batch's trace, split into what wrote it, each part passed through the
    post-LayerNorms above it with their scales frozen at the run's values (``frozen_norms``) and the embedding's
    length frozen too: ``heads`` ``(B, layers, heads)`` (zero for a pruned head), ``attention_bias`` and ``mlp``
    ``(B, layers)``, ``embeddings`` and ``norms`` (the norms' biases) ``(B,)``; they add up to the metric."""
    fn = stack.frozen_norms(t.resid, t.z)
    e = stack.finish(t.resid[-1]).mean(-2)                                               # (B, E)
    along = weights.to(e.dtype) / e.norm(dim=-1, keepdim=True)                           # (B, E)

    def read(part: torch.Tensor, first: int) -> torch.Tensor:                          # (B, ..., n, E) -> (B, ...)
        pooled = fn.through(part, first).mean(-2)
        return (pooled * along.view(len(along), *[1] * (pooled.dim() - 2), -1)).sum(-1)

    B, L = len(e), stack.n_layers
    heads = e.new_zeros(B, L, stack.n_heads)
    bias, mlp = e.new_zeros(B, L), e.new_zeros(B, L)
    for layer, block in enumerate(stack.layers):
        results = _layer_results(stack, t, layer, slice(None))                        # (B, n, kept, E)
        if results is not None:
            heads[:, layer, stack.kept[layer]] = read(results.transpose(-2, -3), 2 * layer)
        if block.attn.output_bias is not None:
            bias[:, layer] = read(block.attn.output_bias.expand_as(t.resid[0]), 2 * layer)
        mlp[:, layer] = read(fn.mlp[layer], 2 * layer + 1)
    norms = (fn.constant(t.resid[0]).mean(-2) * along).sum(-1)
    return {"heads": heads, "attention_bias": bias, "mlp": mlp, "embeddings": read(t.resid[0], 0), "norms": norms}


def attention_biases(stack, like: torch.Tensor) -> torch.Tensor:
    """``(layers, E)``: each attention's output bias, added once whatever its heads do (zeros without one; a
    model whose blocks norm the attention's output has none)."""
    zero = torch.zeros_like(like)
    return torch.stack([zero if block.attn.output_bias is None else block.attn.output_bias for block in stack.layers])


def direction(stack, answer: int, distractor: int | None) -> torch.Tensor:
    """``(E,)``: the unembedding's row of ``answer`` less that of ``distractor``: a final hidden state's dot
    product with it is ``logit(answer) - logit(distractor)`` (or ``logit(answer)`` without one)."""
    rows = stack.unembedding_rows(torch.tensor([answer] + ([] if distractor is None else [distractor])))
    return rows[0] if distractor is None else rows[0] - rows[1]


def patched_differences(model, clean: Trace, corrupted: Trace, layers: np.ndarray, heads: np.ndarray,
                        positions: np.ndarray, measure, *, progress: Progress | None = None, stack=None) -> np.ndarray:
    """The corrupted prompt run once per edit, each copy with one clean activation in place of its own;
    ``(edits,)`` float64: ``measure`` (one pair's ``metrics.Metric``) of each
    copy.

    Edit ``i`` puts at layer ``layers[i]`` the clean run's ``z`` of head ``heads[i]`` (or, where that is
    -1, the clean residual entering the layer), at position ``positions[i]`` (or, where that is -1, at
    every position). Copies run together from the layer of their edit up, a chunk of copies at a time, and only
    the tokens after those the two prompts share (``batched.patched_measures``, for one pair).
    """
    return patched_measures(model, as_batch(clean), as_batch(corrupted), measure, torch.zeros(1, dtype=torch.long),
                            np.zeros(len(layers), dtype=np.int64), np.asarray(layers), np.asarray(heads),
                            np.asarray(positions), progress=progress, stack=stack)


def attribution_estimates(model, clean: Trace, corrupted: Trace, measure, stack=None):
    """Attribution patching (Nanda 2023): the corrupted prompt's gradient of ``measure`` (one pair's) with respect to
    every head's ``z`` and every ``resid_pre``, in one forward and one backward pass, times the clean minus the
    corrupted activation: a first-order estimate of each patch (``batched.attribution_batch``, for one pair).

    Returns ``(heads, resid)``: ``(layers, heads, n)`` (zero for a pruned head) and ``(layers, n)`` float64.
    No gradient is left on the model's parameters.
    """
    heads, resid, _, _ = attribution_batch(model, as_batch(clean), corrupted.ids.view(1, -1), measure,
                                           torch.zeros(1, dtype=torch.long), stack)
    return heads[0], resid[0]


def head_values(block, x: torch.Tensor) -> torch.Tensor:
    """``(kept heads, n, Dh)``: each head's value of each vector of ``x`` ``(n, E)``, ``W_V^h norm(x_j) + b_V^h``
    (a query head reads its group's key/value head)."""
    attn = block.attn
    n, Dh = x.shape[0], attn.head_dim
    h = block.attention_input(x.view(1, n, -1))
    v = attn.project(h, h, h)[2].view(n, attn.num_kv_heads, Dh)                # (n, Hkv, Dh)
    if attn.kv_heads is not None:
        v = v.index_select(1, torch.tensor(attn.kv_heads, dtype=torch.long, device=v.device))
    return v.transpose(0, 1)                                                  # (kept, n, Dh)


def output_columns(block) -> torch.Tensor:
    """``(kept heads, E, Dh)``: each head's columns of the output projection."""
    return block.attn.output_columns().transpose(0, 1)


def head_writes(block, x: torch.Tensor) -> torch.Tensor:
    """``(kept heads, n, E)``: what each head of ``block`` would write from each vector of ``x`` ``(n, E)`` were
    all its weight on it: ``W_O^h (W_V^h norm(x_j) + b_V^h)``, the vector its weights mix (no output bias)."""
    return torch.einsum("hnd,hed->hne", head_values(block, x), output_columns(block))


@dataclass(frozen=True)
class Shares:
    """How each residual update of a prompt splits among what wrote it (Ferrando & Voita 2024), float64:

    - ``heads`` ``(layers, heads, n, n)``: at layer ``l``'s attention, the share of token ``i``'s update that
      head ``h`` brought from token ``j`` (``[l, h, i, j]``; zero for a pruned head and for ``j > i``);
    - ``attn_residual`` and ``attn_bias`` ``(layers, n)``: the shares of the residual stream itself and of the
      attention's output bias in the same update;
    - ``mlp`` and ``mlp_residual`` ``(layers, n)``: the MLP's and the residual stream's shares in the update
      the MLP makes.

    The shares of one update sum to 1.
    """

    heads: np.ndarray
    attn_residual: np.ndarray
    attn_bias: np.ndarray
    mlp: np.ndarray
    mlp_residual: np.ndarray


SHARE_CHUNK = 1 << 24  # elements of (heads, targets, sources, E) differences held at once (64 MB in float32)


def _proximity(y: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """``max(0, ||y||_1 - ||y - part||_1)`` for ``y`` ``(..., E)`` against ``parts`` broadcasting to it."""
    return (y.abs().sum(-1) - (y - parts).abs().sum(-1)).clamp_min(0)


@torch.inference_mode()
def shares(model, t: Trace, weights: torch.Tensor) -> Shares:
    """Every residual update of a traced prompt (``t``, with its ``trace_weights``) split into the shares of
    what wrote it, read from the trace with no layer run again:
    each part's proximity to the updated stream, ``max(0, ||y||_1 - ||y - part||_1)``, over the sum of the
    parts' (Ferrando & Voita 2024, "Information flow routes"). The parts of an attention update at token
    ``i`` are the stream before it, each head's weight on each earlier token ``j`` times what it writes
    from there (``head_writes``), and the output bias; those of an MLP update, the stream and the MLP's output."""
    stack = language_stack(model)
    L, H = stack.n_layers, stack.n_heads
    n = len(t.ids)
    heads = np.zeros((L, H, n, n))
    attn_residual, attn_bias, mlp, mlp_residual = (np.zeros((L, n)) for _ in range(4))
    for layer in range(L):
        block, kept = stack.layers[layer], stack.kept[layer]
        x, after = t.resid[layer].unsqueeze(0), t.resid[layer + 1]              # (1, n, E), (n, E)
        A = weights[layer][kept].to(x.dtype)                                   # (kept, n, n)
        writes = head_writes(block, x[0])                                      # (kept, n, E)
        bias = block.attn.output_bias
        bias = torch.zeros_like(x[0, 0]) if bias is None else bias
        a = torch.einsum("hij,hje->ie", A, writes) + bias                      # (n, E): the attention's output
        scale = block.attention_scale(a)                                       # a norm on it, frozen (Gemma 3)
        scale = torch.ones_like(a) if scale is None else scale
        mid = x[0] + a * scale                                                 # (n, E): the stream after attention
        prox = torch.zeros(len(kept), n, n, dtype=x.dtype, device=x.device)
        step = max(1, SHARE_CHUNK // max(1, len(kept) * n * x.shape[-1]))
        for i in range(0, n, step):
            rows = slice(i, i + step)
            parts = A[:, rows, :, None] * writes[:, None] * scale[None, rows, None]   # (kept, rows, n, E)
            prox[:, rows] = _proximity(mid[None, rows, None], parts)
        from_residual, from_bias = _proximity(mid, x[0]), _proximity(mid, bias * scale)
        total = prox.sum((0, 2)) + from_residual + from_bias                   # (n,)
        total = torch.where(total > 0, total, torch.ones_like(total))
        if kept:
            heads[layer, kept] = (prox / total[None, :, None]).double().cpu().numpy()
        attn_residual[layer] = (from_residual / total).double().cpu().numpy()
        attn_bias[layer] = (from_bias / total).double().cpu().numpy()
        out = after
        from_mid, from_mlp = _proximity(out, mid), _proximity(out, out - mid)
        total = from_mid + from_mlp
        total = torch.where(total > 0, total, torch.ones_like(total))
        mlp_residual[layer] = (from_mid / total).double().cpu().numpy()
        mlp[layer] = (from_mlp / total).double().cpu().numpy()
    return Shares(heads, attn_residual, attn_bias, mlp, mlp_residual)
