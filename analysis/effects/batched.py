"""Many prompt pairs at once: each batch a set of pairs of one token length (no padding), traced by
``models.run.trace_batch``; every run here is one run with edits (``models.run``).

A ``metrics.Metric`` (a readout's, ``readouts``) reads each run's final residual stream: a language model's
logits at its last token, an encoder's sentence embedding against two probe texts', a masked token's logits, a
classifier's classes.
``patched_measures`` runs copies of the corrupted prompts, each with one clean activation in place of its own,
the copies of every pair of the batch together from the layer of their edit up (a layer runs once for all the
copies that have reached it); ``attribution_batch`` estimates every patch of every pair of the batch from one
forward and one backward pass.
"""
from __future__ import annotations

from collections.abc import Callable
import numpy as np
import torch

from models.run import ROWS_PER_CHUNK, Edits, Trace, device_of, patching_stack

Progress = Callable[[int, int], None]


@torch.inference_mode()
def final_measures(stack, t: Trace, measure, rows: torch.Tensor) -> np.ndarray:
    """``(B,)`` float64: the metric of each prompt of a batched trace, row ``b`` belonging to pair ``rows[b]``."""
    return measure(stack, t.resid[-1], rows).double().cpu().numpy()


def shared_prefix(stack, clean: Trace, corrupted: Trace) -> int:
    """How many first tokens every clean prompt of a batch shares with its corrupted one (at most ``n - 1``) and no
    patch changes: none in an encoder, whose every token sees every other."""
    if not stack.causal:
        return 0
    differ = (clean.ids != corrupted.ids).any(0)
    n = clean.ids.shape[1]
    return min(int(differ.int().argmax()), n - 1) if bool(differ.any()) else n - 1


@torch.inference_mode()
def patched_measures(model, clean: Trace, corrupted: Trace, measure, rows: torch.Tensor, pair: np.ndarray,
                     layers: np.ndarray, heads: np.ndarray, positions: np.ndarray, *,
                     progress: Progress | None = None, stack=None) -> np.ndarray:
    """``(edits,)`` float64: the metric of corrupted prompt ``pair[i]`` (a row of the batched traces) run with edit
    ``i``: at layer ``layers[i]``, the clean ``z`` of head ``heads[i]`` (-1: the clean residual entering the
    layer), at position ``positions[i]`` (-1: every position). ``rows`` maps a batch row to its pair for
    ``measure``.

    The tokens every pair shares before the prompts differ are the same in every copy as in the corrupted run,
    at every layer: the copies run only the tokens after them, attending to those tokens' keys and values as
    the corrupted run formed them (an edit there changes nothing: its copy is the corrupted prompt). ``stack``:
    ``model``'s, where the caller holds it."""
    stack = stack if stack is not None else patching_stack(model)
    B, n, E = corrupted.resid[0].shape
    f = shared_prefix(stack, clean, corrupted)
    out = np.empty(len(pair), dtype=np.float64)
    idle = (positions >= 0) & (positions < f)
    base = final_measures(stack, corrupted, measure, rows)
    out[idle] = base[pair[idle]]
    live = np.flatnonzero(~idle)
    order = live[np.lexsort((pair[live], layers[live]))]
    per_chunk = max(1, ROWS_PER_CHUNK // (n - f))
    work = {"done": 0, "total": int((stack.n_layers - layers[live]).sum())}

    def ran(copies: int) -> None:
        work["done"] += copies
        if progress is not None:
            progress(work["done"], work["total"])

    prefixes = _prefixes(stack, corrupted, f, int(layers[live].min()) if len(live) else stack.n_layers)
    for start in range(0, len(order), per_chunk):
        chunk = order[start:start + per_chunk]
        x = _run_copies(stack, clean, corrupted, prefixes, f, pair[chunk], layers[chunk], heads[chunk],
                        positions[chunk], ran)
        out[chunk] = measure(stack, x, rows[torch.as_tensor(pair[chunk])]).double().cpu().numpy()
    if progress is not None and not len(live):
        progress(1, 1)
    return out


def _prefixes(stack, corrupted: Trace, f: int, lowest: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer from ``lowest`` up, the keys and values ``(B, H, f, Dh)`` of the first ``f`` tokens of each
    corrupted prompt, as that layer's attention formed them (none when ``f`` is 0)."""
    if f == 0:
        return {}
    out = {}
    for layer in range(lowest, stack.n_layers):
        block = stack.layers[layer]
        h = block.attention_input(corrupted.resid[layer][:, :f])
        _, k, v = block.attn.heads_qkv(h, h, h)
        out[layer] = (k, v)
    return out


def _run_copies(stack, clean: Trace, corrupted: Trace, prefixes, f: int, pair, layers, heads, positions,
                ran) -> torch.Tensor:
    """The copies of one chunk (sorted by layer), tokens ``f`` on, run to the top, each joining at its layer (an
    edit of ``resid_pre`` adding its rows) with its clean ``z`` put in place (an edit of ``z``); the last residuals."""
    B, n, E = corrupted.resid[0].shape
    rows, edits = [], Edits()

    def counted(x):
        ran(len(x))
        return x

    for layer in range(int(layers.min()), stack.n_layers):
        new = np.flatnonzero(layers == layer)
        if len(new):
            edits["resid_pre", layer] = _joining(stack.kept[layer], clean, corrupted, layer, f, pair[new], heads[new],
                                                 positions[new], rows, edits)
        if f:
            edits["kv", layer] = lambda _, layer=layer: tuple(t[torch.cat(rows)] for t in prefixes[layer])
        edits["resid_post", layer] = counted
    x, _ = stack.run_layers(corrupted.resid[0].new_zeros(0, n - f, E), start=int(layers.min()), need_weights=False,
                            edits=edits)
    return x


def _joining(kept: list[int], clean: Trace, corrupted: Trace, layer: int, f: int, pair, heads, positions, rows: list,
             edits: Edits):
    """The ``resid_pre`` edit at ``layer`` by which copies join the run: each its corrupted prompt's stream (tokens
    ``f`` on), a residual edit's position from the clean stream; it places the ``z`` edit of the heads' copies."""
    def join(x):
        p = torch.as_tensor(pair)
        added = corrupted.resid[layer][p, f:].clone()                           # (new, n - f, E)
        for k in np.flatnonzero(heads < 0):  # the residual stream at one position, or all of it
            at = slice(None) if positions[k] < 0 else int(positions[k]) - f
            added[k, at] = clean.resid[layer][int(pair[k]), f:][at]
        z_rows = np.flatnonzero(heads >= 0)
        hook = _z_patch(kept, clean.z[layer][:, :, f:], len(x) + z_rows, pair[z_rows],
                        heads[z_rows], np.where(positions[z_rows] < 0, -1, positions[z_rows] - f))
        if hook is not None:
            edits["z", layer] = hook
        rows.append(p)
        return torch.cat([x, added])
    return join


def _z_patch(kept: list[int], clean_z: torch.Tensor, rows, pairs, heads, positions):
    """A ``hook_z`` putting into batch row ``rows[i]`` the clean ``z`` ``(B, kept, n, Dh)`` of pair ``pairs[i]``'s
    head ``heads[i]``, at ``positions[i]`` (-1: every position); None when there is nothing to put (a pruned
    head's copy runs as the corrupted prompt)."""
    if not len(rows):
        return None
    index = {h: k for k, h in enumerate(kept)}
    slots = np.array([index.get(int(h), -1) for h in heads])
    live = slots >= 0
    every, single = live & (positions < 0), live & (positions >= 0)

    def hook(z):                                                                 # (copies, kept, n, Dh)
        if every.any():
            r, b, s = (torch.as_tensor(a[every]) for a in (rows, pairs, slots))
            z[r, s] = clean_z[b, s]
        if single.any():
            r, b, s, q = (torch.as_tensor(a[single]) for a in (rows, pairs, slots, positions))
            z[r, s, q] = clean_z[b, s, q]
        return z

    return hook


def attribution_batch(model, clean: Trace, corrupted_ids: torch.Tensor, measure, rows: torch.Tensor, stack=None):
    """Attribution patching (Nanda 2023) of every pair of a batch: the gradient of each corrupted prompt's metric
    with respect to every head's ``z`` and every ``resid_pre``, from one forward and one backward pass of the
    corrupted prompts ``(B, n)``, times the clean minus the corrupted activation. Returns ``(heads, resid,
    corrupted, values)``: ``(B, layers, heads, n)`` (zero for a pruned head) and ``(B, layers, n)`` float64, the
    corrupted prompts' trace (read from the same forward pass) and their metric ``(B,)``; ``stack``: ``model``'s,
    where the caller holds it."""
    stack = stack if stack is not None else patching_stack(model)
    L, H = stack.n_layers, stack.n_heads
    B, n = corrupted_ids.shape
    resid_seen, z_seen, resid_taps, z_taps = [], [], [], []

    def tap(seen: list, taps: list):
        def add(value):
            seen.append(value.detach())
            d = torch.zeros_like(value, requires_grad=True)
            taps.append(d)
            return value + d
        return add

    layers = range(L)
    edits = Edits({**Edits.every_layer("resid_pre", lambda _: tap(resid_seen, resid_taps), layers),
                   **Edits.every_layer("z", lambda _: tap(z_seen, z_taps), layers)})
    with torch.enable_grad():
        x, _ = stack.run_layers(stack.embed(corrupted_ids.to(device_of(stack))).detach(), need_weights=False, edits=edits)
        resid_seen.append(x.detach())
        values = measure(stack, x, rows)   # each prompt's metric depends on its own row alone
        grads = torch.autograd.grad(values.sum(), resid_taps + z_taps)
    corrupted = Trace(corrupted_ids, resid_seen, z_seen)
    heads, resid = np.zeros((B, L, H, n)), np.zeros((B, L, n))
    with torch.no_grad():
        for layer in range(L):
            diff = clean.resid[layer] - corrupted.resid[layer]
            resid[:, layer] = (diff * grads[layer]).sum(-1).double().cpu().numpy()
            kept = stack.kept[layer]
            if kept:
                dz = clean.z[layer] - corrupted.z[layer]                               # (B, kept, n, Dh)
                heads[:, layer, kept] = (dz * grads[L + layer]).sum(-1).double().cpu().numpy()
    return heads, resid, corrupted, values.detach().double().cpu().numpy()
