"""Attention of a long text, computed where it is looked at.

Every weight of a 4,096-token prompt on SmolLM2 is 30 layers x 9 heads x 4,096² floats, 17 GiB:
more than a laptop holds beside anything else. ``LongAttention`` runs the forward pass once without
weights (PyTorch's fused attention), one layer at a time and only as high as a view asks, and keeps
what each layer's attention reads: its normalised input, 30 x 4,096 x 576 floats (283 MB) for
SmolLM2. A layer's weights are then computed from it as the forward pass computes them, for the
heads and query rows asked, one block of query rows at a time: pooled into display blocks as they
come, cut to a zoom, or summed into per-head figures. No whole layer of weights is ever held.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .errors import HeadLensError
from .mha import outside_window

LONG_TOKENS_CAP = 4096  # the most tokens a long prompt keeps, whatever the model allows
BLOCK_BYTES = 48 * 2**20  # the weights of one block of query rows, every head asked, while it is computed
MAX_EXACT_BYTES = 256 * 2**20  # the most exact weights ``weights`` returns at once; larger asks are pooled
SINK_QUERIES = 16  # a causal model's first-token sink is judged on its first queries, as on a sentence

Progress = Callable[[int, int], None]
_ids = itertools.count()


def _libc_trim():
    """glibc's ``malloc_trim``, or None elsewhere. A long forward pass frees hundreds of MB of temporaries
    between the inputs it keeps; glibc keeps the freed heap until asked to give it back."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _libc_trim()


def release_memory() -> None:
    """Give the memory freed by a long computation back to the system (glibc), so that a server's
    resident memory follows what it holds."""
    if _TRIM is not None:
        _TRIM(0)


@dataclass(frozen=True)
class LayerFigures:
    """Per head of one layer, from every query row. ``(heads,)`` float32 each.

    Attributes:
        entropy: mean over query rows of each row's entropy (nats), after ``hide``.
        max_weight: the largest weight, after ``hide``.
        aside: mean over query rows of the weight on the tokens ``hide`` names (before hiding them).
        first: mean over query rows after the first of the weight on the first token (a sink's share).
        distance: mean over query rows of ``sum_j a_ij |i - j|``: how far back (or away) a head looks,
            in tokens (Vig & Belinkov 2019).
        received: when asked, ``(heads, keys)``: the mean over query rows of the weight each key gets,
            after ``hide`` (its keys counted among those left).
        mixed: when asked with a row vector ``c`` (one entry per row left), ``(heads, keys)``: ``c``
            times each head's weights after ``hide``, the step of attention rollout.
    """

    entropy: np.ndarray
    max_weight: np.ndarray
    aside: np.ndarray
    first: np.ndarray
    distance: np.ndarray
    received: np.ndarray | None = None
    mixed: np.ndarray | None = None


class LongAttention:
    """One text's attention on the from-scratch engine, each layer's weights computed when asked.

    It carries what ``Attention`` says about the tokens (``tokens``, ``word_ids``, ``special``,
    ``offsets``, ``truncated``…) but no ``weights`` array: ``weights``, ``pooled``, ``figures`` and
    ``rows`` compute them. Sessions may share one: every method may be called from several threads.
    """

    component = "self"
    keys = decoder = cross = None
    generated_from = None

    def __init__(self, model, text: str, *, head_mask=None, head_means=None, causal: bool = False,
                 max_tokens: int | None = None):
        """``model``: a ``ScratchModel``; ``head_mask``, ``head_means`` and ``causal`` as ``attend`` takes them."""
        if getattr(model, "stack", None) is None:
            raise HeadLensError("Long prompts are computed inside our own attention; load the model with "
                                "backend='scratch' (the same weights give the same attention).")
        if model.encoder_decoder:
            raise HeadLensError("Long prompts are for encoders and decoder-only models.")
        self.model, self.stack = model, model.stack
        self.max_tokens = int(max_tokens or model.long_max_tokens)
        model.token_counts([text])  # an empty or unreadable text gets its sentence here
        enc = model._tokenize(text, truncation=True, max_length=self.max_tokens, return_offsets_mapping=True,
                              return_special_tokens_mask=True, return_tensors="pt")
        n = int(enc["input_ids"].shape[1])
        self.n_tokens_original = n if n < self.max_tokens else len(model._tokenize(text, verbose=False)["input_ids"])
        self.truncated = self.n_tokens_original > n
        self.text, self.model_name, self.backend, self.device = text, model.name, model.backend, str(model.device)
        self.tokens = model.tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
        self.word_ids = list(enc.word_ids(0))
        self.special = enc["special_tokens_mask"][0].numpy().astype(bool)
        self.offsets = [tuple(o) for o in enc["offset_mapping"][0].tolist()]
        self.causal = bool(causal or model.causal)
        self.n_layers, self.n_heads, self.head_dim = model.n_layers, model.n_heads, model.head_dim
        self.windows = model.windows  # per layer, a sliding window (Attention.windows)
        self.pruned = model.pruned_heads if self.stack.pruned else None
        self._mask, self._fill = model._head_mask(head_mask), model._head_fill(head_means, head_mask)
        self._ids = model._inputs(enc)
        self.uid = next(_ids)  # names this prompt in caches of what was computed from it, without holding it
        self._lock = threading.Lock()
        self._inputs: list[torch.Tensor | None] = [None] * self.n_layers  # (n, E): what each layer's attention read
        self._x: torch.Tensor | None = None                                 # the input of layer ``_next``
        self._next = 0
        self._qk: tuple = (None, None)                                      # (layer, (q, k)), replaced whole
        self.sink_share = self._sink_share()

    @property
    def cache_key(self) -> tuple:
        """What names this prompt in a key of something computed from it (the prompt itself is not hashed)."""
        return ("long prompt", self.uid)

    # --- what Attention says about a text ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def generated(self) -> np.ndarray:
        return np.zeros(len(self.tokens), dtype=bool)

    @property
    def key_tokens(self) -> list[str]:
        return self.tokens

    @property
    def layers_done(self) -> int:
        """How many layers, from the first, have their attention input known (their weights can be computed)."""
        return sum(t is not None for t in self._inputs)

    @property
    def nbytes(self) -> int:
        """Memory it holds: each run layer's attention input and the residual stream, in bytes."""
        held = [t for t in (*self._inputs, self._x, *(self._qk[1] or ())) if t is not None]
        return sum(t.numel() * t.element_size() for t in held)

    # --- the forward pass, as high as asked ---------------------------------------------------------

    def run_to(self, layer: int, progress: Progress | None = None) -> None:
        """Run the forward pass until ``layer``'s attention input is known: the layers below it, those not
        run yet (``layer`` itself runs only when a higher layer is asked for). ``progress(done, layer + 1)``."""
        self._check_layer(layer)
        with self._lock:
            if self._inputs[layer] is not None:
                return
            with torch.inference_mode():
                if self._x is None:
                    self._x = self.stack.embed_tokens(**self.model._stack_inputs(self._ids))[0]
                while True:
                    i = self._next
                    if self._inputs[i] is None:
                        self._inputs[i] = self.stack.layers[i].attention_input(self._x)[0].contiguous()
                    if progress is not None:
                        progress(i + 1, layer + 1)
                    if i == layer:
                        break
                    self._x = self.stack.run_layers(self._x, start=i, stop=i + 1, causal=self.causal,
                                                    need_weights=False, head_mask=self._mask,
                                                    head_fill=self._fill)[0]
                    self._next = i + 1
                if self._inputs[-1] is not None:
                    self._x = None  # nothing above the last layer needs its output
            release_memory()

    def queries_keys(self, layer: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """The heads ``layer`` still has (original numbering) and their queries and keys as the softmax
        sees them, ``(kept, n, Dh)`` each: queries scaled by ``1 / sqrt(Dh)``, after rotary positions, a
        grouped-query head given its group's keys."""
        cached_layer, qk = self._qk
        if cached_layer != layer:
            self.run_to(layer)
            with torch.inference_mode():
                q, k = self.stack.layers[layer].attn.queries_keys(self._inputs[layer][None])
            qk = (q[0], k[0])
            self._qk = (layer, qk)
        return self.stack.kept[layer], *qk

    # --- weights, a block of query rows at a time ------------------------------------------------------

    def blocks(self, layer: int, heads: Sequence[int] | None = None, rows: tuple[int, int] | None = None,
               step: int = 1, with_entropy: bool = False, columns: np.ndarray | None = None):
        """``(start, stop, w)`` for consecutive blocks of query rows ``rows`` (default all): ``w`` is the
        exact weights of those rows, a float32 torch tensor ``(len(heads), stop - start, seen)``: a causal
        query sees no key after ``stop`` (``seen = stop``), others see all ``n`` (``seen = n``). Weights are
        zero for a key the query cannot see and for a head switched off or pruned. Each block holds a
        multiple of ``step`` rows (but the last) and about ``BLOCK_BYTES``. ``with_entropy``: each block
        also gives each row's entropy in nats, ``(len(heads), stop - start)``, without a logarithm per
        weight: ``-sum_j w_j log w_j = log sum_j exp(s_j) - sum_j w_j s_j``, and ``sum_j w_j s_j`` is the
        query times the weighted sum of the keys. ``columns`` (``(n, c)``, with ``with_entropy``): each
        block also gives ``w @ columns``, ``(len(heads), stop - start, c)``, in the same product."""
        heads = self._heads(heads)
        n = len(self.tokens)
        lo, hi = rows or (0, n)
        kept, q, k = self.queries_keys(layer)
        on = self.heads_on(layer, heads)
        index = torch.tensor([kept.index(h) if live else 0 for h, live in zip(heads, on)], dtype=torch.long,
                             device=q.device)
        if index.tolist() != list(range(q.shape[0])):  # else every head, in order: nothing to select
            q, k = q.index_select(0, index), k.index_select(0, index)
        off = torch.tensor([not live for live in on], device=q.device).view(-1, 1, 1)
        size = self.block_rows(len(heads), step)
        window = self.stack.layers[layer].attn.window
        later = torch.ones(size, size, dtype=torch.bool, device=q.device).triu_(1) if self.causal else None
        Dh = k.shape[-1]
        k_more = k  # keys, and beside them the columns that every weight row is also multiplied by
        if with_entropy and columns is not None:
            extra = torch.as_tensor(np.asarray(columns, dtype=np.float32), device=k.device)
            k_more = torch.cat([k, extra.unsqueeze(0).expand(k.shape[0], -1, -1)], dim=-1)
        with torch.inference_mode():
            for start in range(lo, hi, size):
                stop = min(hi, start + size)
                seen = stop if self.causal else n
                # a sliding layer's queries see only the keys of their window: only those are scored
                first = max(0, start - window + 1) if window is not None and self.causal else 0
                scores = torch.matmul(q[:, start:stop], k[:, first:seen].transpose(-2, -1))  # (h, rows, seen - first)
                if window is not None and n > window:
                    query = torch.arange(start, stop, device=q.device)
                    key = torch.arange(first, seen, device=q.device)
                    blocked = outside_window(query, key, window)
                    if self.causal:
                        blocked |= key.view(1, -1) > query.view(-1, 1)
                    scores.masked_fill_(blocked, float("-inf"))
                elif self.causal:  # only the block's own keys can come after one of its queries
                    scores[:, :, start:stop].masked_fill_(later[:stop - start, :stop - start], float("-inf"))
                # the softmax in place, keeping log-sum-exp (no query is left without a key: it sees itself)
                top = scores.amax(dim=-1, keepdim=True)
                w = scores.sub_(top).exp_()
                total = w.sum(dim=-1, keepdim=True)
                w.div_(total)
                if not all(on):
                    w.masked_fill_(off, 0.0)
                if with_entropy:  # -sum_j w_ij log w_ij = lse_i - q_i . sum_j w_ij k_j
                    mixed = torch.matmul(w, k_more[:, first:seen])                # (h, rows, Dh + columns)
                    entropy = (top[..., 0] + total[..., 0].log() - (mixed[..., :Dh] * q[:, start:stop]).sum(dim=-1))
                if first:  # the keys before the window: zero weight, placed so that a row covers every key
                    w = torch.cat([w.new_zeros(w.shape[0], w.shape[1], first), w], dim=-1)
                if with_entropy:
                    yield (start, stop, w, entropy.masked_fill_(off[..., 0], 0.0).clamp_min_(0.0),
                           mixed[..., Dh:] if columns is not None else None)
                else:
                    yield start, stop, w

    def block_rows(self, n_heads: int, step: int = 1) -> int:
        """How many query rows one of ``blocks``'s blocks holds for ``n_heads`` heads: a multiple of ``step``."""
        return max(step, BLOCK_BYTES // (4 * max(1, n_heads) * len(self.tokens)) // step * step)

    def heads_on(self, layer: int, heads: Sequence[int]) -> list[bool]:
        """For each of ``heads``, whether ``layer`` has it and no head mask switches it off."""
        kept = self.stack.kept[layer]
        return [h in kept and (self._mask is None or bool(self._mask[layer, h])) for h in heads]

    def weights(self, layer: int, heads: Sequence[int] | None = None, queries: tuple[int, int] | None = None,
                keys: tuple[int, int] | None = None) -> np.ndarray:
        """Exact weights ``(len(heads), queries, keys)`` float32 of ``layer``, for query rows ``queries``
        and key columns ``keys`` (``(start, stop)``, default all): what ``attend`` gives, computed for
        these alone. At most ``MAX_EXACT_BYTES``; ``pooled`` draws more."""
        heads = self._heads(heads)
        n = len(self.tokens)
        q0, q1 = self._range(queries, n, "query")
        k0, k1 = self._range(keys, n, "key")
        size = 4 * len(heads) * (q1 - q0) * (k1 - k0)
        if size > MAX_EXACT_BYTES:
            raise HeadLensError(f"These weights take {size / 2**20:,.0f} MiB; ask for fewer heads or rows "
                                f"(at most {MAX_EXACT_BYTES // 2**20} MiB), or pool them.")
        out = np.zeros((len(heads), q1 - q0, k1 - k0), dtype=np.float32)
        for start, stop, w in self.blocks(layer, heads, rows=(q0, q1)):
            seen = min(k1, w.shape[-1])
            if seen > k0:
                out[:, start - q0:stop - q0, :seen - k0] = w[..., k0:seen].to("cpu", torch.float32).numpy()
        return out

    def pooled(self, layer: int, heads: Sequence[int] | None = None, q_step: int = 1, k_step: int = 1,
               hide: np.ndarray | None = None, rows: tuple[int, int] | None = None) -> np.ndarray:
        """The largest weight in each block of ``q_step`` query rows by ``k_step`` keys, as
        ``viz.figures.pool`` takes it of the exact weights: ``(len(heads), blocks, blocks)`` float32.

        ``hide``: bool per token; those rows and columns are dropped first and each row renormalised
        (a view's "hide special tokens"); blocks then count the tokens left. ``rows``: only these
        query rows (of the tokens left), such as the last k.
        """
        return self.scan(layer, heads, q_step, k_step, hide, rows)[0]

    def figures(self, layer: int, heads: Sequence[int] | None = None, hide: np.ndarray | None = None,
                aside: np.ndarray | None = None) -> LayerFigures:
        """Per-head figures of ``layer`` from every query row (see ``LayerFigures``)."""
        return self.scan(layer, heads, hide=hide, aside=aside, pool=False)[1]

    def scan(self, layer: int, heads: Sequence[int] | None = None, q_step: int = 1, k_step: int = 1,
             hide: np.ndarray | None = None, rows: tuple[int, int] | None = None, aside: np.ndarray | None = None,
             pool: bool = True, received: bool = False,
             times: np.ndarray | None = None) -> tuple[np.ndarray | None, LayerFigures | None]:
        """``pooled`` and ``figures`` in one pass over the layer's weights; figures only when ``rows`` is None.
        ``aside`` (bool per token, default ``hide``): the tokens whose share ``LayerFigures.aside`` is.
        ``received``: figures include what each key receives; ``times`` (one float per row left): figures
        include ``times`` times each head's weights (``LayerFigures.mixed``)."""
        heads = self._heads(heads)
        n, h = len(self.tokens), len(heads)
        dev = self.stack.layers[0].attn.out_proj.weight.device
        hide = None if hide is None or not np.any(hide) else np.asarray(hide, dtype=bool)
        keep = np.arange(n) if hide is None else np.flatnonzero(~hide)
        if not len(keep):
            raise HeadLensError("Every token is hidden; show special tokens to see this text's attention.")
        m = len(keep)
        r0, r1 = self._range(rows, m, "query")
        shown = keep[r0:r1]                                   # prompt positions of the rows drawn
        keep_t = torch.as_tensor(keep, device=dev)
        hidden = None if hide is None else torch.as_tensor(np.flatnonzero(hide), device=dev)
        aside = hide if aside is None else np.asarray(aside, dtype=bool)
        aside_t = None if aside is None or not aside.any() else torch.as_tensor(aside, dtype=torch.float32, device=dev)
        want = rows is None
        nqb, nkb = math.ceil((r1 - r0) / q_step), math.ceil(m / k_step)
        pooled = torch.zeros(h, nqb, nkb, device=dev) if pool else None
        sums = torch.zeros(4, h, dtype=torch.float64, device=dev)  # entropy, aside, first, distance
        top = torch.zeros(h, device=dev)
        taken = torch.zeros(h, m, dtype=torch.float64, device=dev) if received and want else None
        mixed = torch.zeros(h, m, dtype=torch.float64, device=dev) if times is not None and want else None
        times_t = None if mixed is None else torch.as_tensor(np.asarray(times, dtype=np.float32), device=dev)
        on = torch.tensor(self.heads_on(layer, heads), dtype=torch.float32, device=dev).view(-1, 1)
        position = torch.arange(n, device=dev, dtype=torch.float32)
        columns = np.stack([np.arange(n, dtype=np.float32),
                            np.zeros(n, np.float32) if aside is None else aside.astype(np.float32)], axis=1)
        done, carry = 0, None  # rows drawn so far; rows left over from the last block, fewer than q_step
        aligned = hide is None
        with torch.inference_mode():
            for block in self.blocks(layer, heads, rows=(int(shown[0]), int(shown[-1]) + 1),
                                     step=q_step if aligned else 1, with_entropy=want, columns=columns):
                start, stop, w = block[:3]
                seen = w.shape[-1]
                if want:
                    if start == 0 and stop > 1:
                        sums[2] += w[:, 1:, 0].sum(dim=1)
                    elif start > 0:
                        sums[2] += w[:, :, 0].sum(dim=1)
                    weighted = block[4]                                               # (h, rows, 2): w @ [pos, aside]
                    if aside_t is not None:
                        sums[1] += weighted[..., 1].sum(dim=1)
                    if self.causal:  # every key at or before the query: sum_j w_ij (i - j)
                        sums[3] += (position[start:stop] * on - weighted[..., 0]).sum(dim=1)
                    else:
                        gap = (position[start:stop].view(-1, 1) - position[:seen].view(1, -1)).abs_()
                        sums[3] += (w * gap).sum(dim=(1, 2))
                    entropy = block[3]                                                    # (h, rows)
                # rows and keys of the view: hidden ones left out, rows renormalised over what is left
                inside = np.flatnonzero((shown >= start) & (shown < stop))
                row_index = shown[inside] - start
                if hide is not None:
                    gone = w.index_select(2, hidden[hidden < seen])                        # (h, rows, few)
                    left = (1.0 - gone.sum(dim=-1)).clamp_min_(0.0)                        # T, each row's remaining share
                    scale = torch.where(left > 0, 1.0 / left.clamp_min(1e-30), torch.zeros_like(left))
                    if want:  # H' = (H + sum_hidden w log w) / T + log T over what is left
                        entropy = torch.where(left > 0, (entropy + torch.special.xlogy(gone, gone).sum(dim=-1)) * scale
                                              + torch.log(left.clamp_min(1e-30)), torch.zeros_like(left))
                    cols = int(np.searchsorted(keep, seen))                                # kept keys it may see
                    w = _cut(w, 2, keep[:cols], keep_t[:cols])
                    w = _cut(w, 1, row_index, None)
                    w = w.mul_(scale.index_select(1, torch.as_tensor(row_index, device=dev)).unsqueeze(-1))
                elif len(row_index) < w.shape[1]:
                    w = _cut(w, 1, row_index, None)
                if taken is not None:
                    taken[:, :w.shape[-1]] += w.sum(dim=1).double()
                if mixed is not None:
                    c = times_t[torch.as_tensor(r0 + inside, device=dev)]
                    mixed[:, :w.shape[-1]] += torch.matmul(c.view(1, 1, -1), w)[:, 0].double()
                if want:
                    sums[0] += entropy.index_select(1, torch.as_tensor(row_index, device=dev)).sum(dim=1).double()
                    if not pool:
                        top = torch.maximum(top, w.amax(dim=(1, 2)))
                if pool and w.shape[1]:
                    if carry is not None:
                        w = torch.cat([torch.nn.functional.pad(carry, (0, w.shape[-1] - carry.shape[-1])), w], dim=1)
                        carry = None
                    whole = w.shape[1] // q_step * q_step
                    if done + w.shape[1] < r1 - r0 and whole < w.shape[1]:
                        carry, w = w[:, whole:], w[:, :whole]
                    if w.shape[1]:
                        part = torch.nn.functional.max_pool2d(w.unsqueeze(1), (q_step, k_step), ceil_mode=True)[:, 0]
                        b0 = done // q_step
                        pooled[:, b0:b0 + part.shape[1], :part.shape[2]] = part
                        done += w.shape[1]
        release_memory()
        figures = None
        if want:
            if pool:
                top = pooled.amax(dim=(1, 2))
            sums = sums.float().cpu().numpy()
            figures = LayerFigures(entropy=sums[0] / m, max_weight=top.cpu().numpy(), aside=sums[1] / n,
                                   first=sums[2] / max(1, n - 1), distance=sums[3] / n,
                                   received=None if taken is None else (taken / m).float().cpu().numpy(),
                                   mixed=None if mixed is None else mixed.cpu().numpy())
        return (None if pooled is None else pooled.cpu().numpy()), figures

    # --- helpers ------------------------------------------------------------------------------------

    def _sink_share(self) -> float | None:
        """For causal attention, the mean weight the queries after the first put on the first token, over
        every layer and head, from the first ``SINK_QUERIES`` queries: a causal query's weights do not
        depend on later tokens, so these are the long text's own, and ``views.first_token_sink`` judges
        them as it judges a sentence's (over a whole long prompt the share falls as later queries
        find other places to park: 0.37 over SmolLM2's first 256 queries, 0.61 over its first 16).
        None for an encoder."""
        if not self.causal or len(self.tokens) < 2 or self.special[0]:
            return None
        n = min(len(self.tokens), SINK_QUERIES)
        inputs = {k: v[:, :n] for k, v in self._ids.items()}
        with torch.inference_mode():
            out = self.stack(**self.model._stack_inputs(inputs), causal=self.causal, need_logits=False,
                             head_mask=self._mask, head_fill=self._fill)
        return float(torch.stack(out.attentions)[..., 1:, 0].double().mean())

    def _heads(self, heads) -> list[int]:
        heads = list(range(self.n_heads)) if heads is None else [int(h) for h in heads]
        if not heads or any(not 0 <= h < self.n_heads for h in heads):
            raise HeadLensError(f"Name heads from 0 to {self.n_heads - 1}; {heads} asks for others.")
        return heads

    def _check_layer(self, layer: int) -> None:
        if not 0 <= int(layer) < self.n_layers:
            raise HeadLensError(f"There is no layer {layer}: {self.model_name} has {self.n_layers}, numbered from 0.")

    @staticmethod
    def _range(given, n: int, what: str) -> tuple[int, int]:
        if given is None:
            return 0, n
        a, b = (int(x) for x in given)
        if not 0 <= a < b <= n:
            raise HeadLensError(f"The {what} range {a}–{b} is outside the text's {n} tokens.")
        return a, b


def _cut(w: torch.Tensor, dim: int, index: np.ndarray, index_t: torch.Tensor | None) -> torch.Tensor:
    """``w`` along ``dim`` at ``index`` (sorted): a slice, which copies nothing, when the index is a run."""
    if len(index) == w.shape[dim] and (not len(index) or index[0] == 0):
        return w
    if len(index) and index[-1] - index[0] == len(index) - 1:
        return w.narrow(dim, int(index[0]), len(index))
    return w.index_select(dim, index_t if index_t is not None else torch.as_tensor(index, device=w.device))
