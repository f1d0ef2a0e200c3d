"""What a head writes, in tokens: its output read through the unembedding, and whether it copies.

``head_vocabulary`` reads one head's output at one position of a prompt as the logits it adds (the
head's ``result`` through the final norm, its scale frozen at the model's own value, and the
unembedding, as ``logit_attribution`` reads it) and lists the tokens it pushes up and down most.

``copying_scores`` asks of every head what Elhage et al. (2021) ask of the OV circuit: were the head
to put all its weight on a token, would that token be among those it promotes most? Each sampled
token's embedding goes through the layer's input norm, the head's value and output projections,
the final norm and the unembedding; a head's copying score is the share of sampled tokens ranked
among the top ``k`` of the whole vocabulary, its suppression score the share among the bottom ``k``
(copy suppression, McDougall et al. 2023). By chance either is ``k / vocabulary``.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from models import AttentionModel, HeadLensError, head_label
from models.run import language_stack
from models.corpus import CORPUS

from . import parts as P
from . import token_text
from .traced import Traced, as_traced

COPY_TOP = 5       # a token counts as copied when it is among the head's 5 most promoted (TransformerLens's top-5)
OV = "A head's OV circuit is read through the unembedding"
COPY_SAMPLE = 200  # tokens sampled from the built-in corpus's

Progress = Callable[[int, int], None]


def _check_head(stack, layer: int, head: int) -> int:
    """The slot of ``(layer, head)`` among its layer's kept heads; a sentence for a head that is not there."""
    if not (0 <= layer < stack.n_layers and 0 <= head < stack.n_heads):
        raise HeadLensError(f"There is no head {head_label(layer, head)}: the model has {stack.n_layers} layers of "
                            f"{stack.n_heads} heads.")
    if head not in stack.kept[layer]:
        raise HeadLensError(f"{head_label(layer, head)} was pruned: it writes nothing.")
    return stack.kept[layer].index(head)


def head_vocabulary(model: AttentionModel, prompt: str | Traced, layer: int, head: int, position: int = -1,
                    k: int = 10) -> pd.DataFrame:
    """The ``k`` tokens head ``(layer, head)``'s output at ``position`` of ``prompt`` pushes up most and the
    ``k`` it pushes down most: rows ``direction`` ("up" or "down"), ``rank`` (1 first), ``token`` (its id),
    ``text`` and ``logit``, the logit the head adds to the token there.

    ``frame.attrs``: ``layer``, ``head``, ``position`` (counted from the start), ``at`` (the token there),
    ``tokens`` and ``mean``, the mean logit it adds over the vocabulary (a head may lift every token alike).
    """
    stack = language_stack(model, "A head's vocabulary is read through the unembedding")
    _check_head(stack, layer, head)
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise HeadLensError(f"Ask for at least one token (k = {k!r}).")
    traced_prompt = as_traced(model, prompt)
    n = len(traced_prompt)
    if not -n <= position < n:
        raise HeadLensError(f"The prompt has {n} tokens; there is no position {position}.")
    position %= n
    t = traced_prompt.trace
    with torch.inference_mode():
        result = P.head_results(stack, t, position)[layer, head]            # (E,)
        frozen, _ = stack.frozen_finish(t.resid[-1][position])
        logits = stack.logits(frozen(result)).double().cpu()                 # (vocab,)
    k = min(int(k), len(logits))
    rows = []
    for direction, found in (("up", logits.topk(k)), ("down", (-logits).topk(k))):
        for rank, token in enumerate(found.indices.tolist(), start=1):
            rows.append((direction, rank, token, token_text(model, token), float(logits[token])))
    frame = pd.DataFrame(rows, columns=["direction", "rank", "token", "text", "logit"])
    tokens = traced_prompt.tokens
    frame.attrs.update(layer=layer, head=head, position=position, at=tokens[position], tokens=tokens,
                       mean=float(logits.mean()))
    return frame


def copy_sample(model: AttentionModel, size: int = COPY_SAMPLE, seed: int = 0) -> list[int]:
    """The tokens a copying score is measured on: ``size`` of the distinct tokens of the built-in corpus as
    ``model``'s tokenizer reads it, drawn reproducibly for ``seed`` (special tokens left out); a model whose
    vocabulary does not read the corpus (fewer than ``size`` known tokens there) has its whole vocabulary
    instead."""
    tok = model.tokenizer
    special = set(tok.all_special_ids)
    seen = {i for ids in tok(list(CORPUS), add_special_tokens=False)["input_ids"] for i in ids} - special
    if len(seen) < size:
        seen = set(range(len(tok))) - special
    pool = np.array(sorted(seen))
    if len(pool) <= size:
        return pool.tolist()
    return np.sort(np.random.default_rng(seed).choice(pool, size, replace=False)).tolist()


def ov_logits(model: AttentionModel, layer: int, head: int, tokens) -> torch.Tensor:
    """``(tokens, vocab)``: the logits head ``(layer, head)`` writes when all its weight is on each of ``tokens``:
    the token's embedding through the layer's input norm and the head's OV circuit
    (``effects.parts.head_writes``, then the norm a Gemma 3 block puts on its attention's output), then the
    final norm (each vector on its own, without its bias) and the unembedding."""
    stack = language_stack(model, OV)
    slot = _check_head(stack, layer, head)
    with torch.inference_mode():
        vectors = stack.token_vectors(torch.as_tensor(list(tokens), dtype=torch.long))
        block = stack.layers[layer]
        writes = block.write_alone(P.head_writes(block, vectors)[slot])      # (tokens, E)
        return stack.logits(stack.norm_alone(writes))


def copying_work(model: AttentionModel) -> float:
    """Multiply-adds ``copying_scores`` spends reading every OV circuit through the unembedding (its cost)."""
    stack = language_stack(model, OV)
    vocab, width = stack.unembedding().shape
    return float(vocab) * width * stack.n_heads * stack.layers[0].attn.head_dim * stack.n_layers


def copying_scores(model: AttentionModel, *, tokens=None, k: int = COPY_TOP,
                   progress: Progress | None = None) -> pd.DataFrame:
    """Every head's OV copying and suppression scores over ``tokens`` (default ``copy_sample``): rows
    ``layer``, ``head``, ``copying`` (the share of the tokens among the ``k`` the head promotes most when
    all its weight is on them) and ``suppression`` (among the ``k`` it pushes down most); NaN for a
    pruned head. ``frame.attrs``: ``k``, ``tokens`` (how many), ``vocabulary``, ``chance`` (``k / vocabulary``)."""
    stack = language_stack(model, OV)
    sample = copy_sample(model) if tokens is None else [int(t) for t in tokens]
    if not sample:
        raise HeadLensError("Copying is measured on at least one token.")
    L, H = stack.n_layers, stack.n_heads
    copying, suppression = np.full((L, H), np.nan), np.full((L, H), np.nan)
    ids = torch.tensor(sample, dtype=torch.long)
    vocab = stack.unembedding().shape[0]
    k = max(1, min(int(k), vocab))
    with torch.inference_mode():
        vectors = stack.token_vectors(ids)                                   # (S, E)
        unembedding = stack.unembedding()                                    # (vocab, E)
        column = ids.to(vectors.device).view(-1, 1)
        for layer in range(L):
            kept = stack.kept[layer]
            if kept:
                block = stack.layers[layer]
                values = P.head_values(block, vectors)                      # (kept, S, Dh)
                # the final norm of one vector is its linear part times a positive number, which leaves the
                # vector's ranking of tokens as it is: each head's OV circuit is read as one (vocab, Dh) matrix
                columns = stack.norm_linear(block.write_linear(P.output_columns(block).transpose(1, 2)))
                circuits = unembedding @ columns.reshape(-1, columns.shape[-1]).T      # (vocab, kept * Dh)
                Dh = values.shape[-1]
                for slot, head in enumerate(kept):  # one head's (S, vocab) logits at a time: 40 MB for SmolLM2
                    logits = values[slot] @ circuits[:, slot * Dh:(slot + 1) * Dh].T  # (S, vocab)
                    own = logits.gather(-1, column)                          # (S, 1)
                    # among the top k: no more than k - 1 tokens above it, so at least the k-th largest logit
                    top = logits.topk(k, dim=-1).values[:, -1:]
                    bottom = logits.topk(k, dim=-1, largest=False).values[:, -1:]
                    copying[layer, head] = float((own >= top).double().mean())
                    suppression[layer, head] = float((own <= bottom).double().mean())
            if progress is not None:
                progress(layer + 1, L)
    layers, heads = np.divmod(np.arange(L * H), H)
    frame = pd.DataFrame({"layer": layers, "head": heads, "copying": copying.reshape(-1),
                          "suppression": suppression.reshape(-1)})
    frame.attrs.update(k=k, tokens=len(sample), vocabulary=vocab, chance=k / vocab)
    return frame
