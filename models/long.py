"""Attention of a long text, computed where it is looked at.

Every weight of a 4,096-token prompt on SmolLM2 is 30 layers x 9 heads x 4,096² floats, 17 GiB:
more than a laptop holds beside anything else. ``LongAttention`` runs the forward pass once without
weights (PyTorch's fused attention), one layer at a time and only as high as a view asks, and keeps
the residual stream entering every third layer, 10 x 4,096 x 576 floats (94 MB) for SmolLM2 (every
layer's would be 283 MB), the long prompts of a process within ``KEPT_BYTES`` together (``Kept``). A
layer's attention input is made from the stream below it (at most two layers run again) and kept for
the last layers viewed; its weights are then computed from it as the forward pass computes them, for
the heads and query rows asked, one block of query rows at a time: pooled into display blocks as they
come, cut to a zoom, or summed into per-head figures. No whole layer of weights is ever held.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .errors import HeadLensError
from .kernels import outside_window
from .long_kept import KEPT, KEPT_BYTES, Kept  # noqa: F401 - the budget's figure and kind, read from here too
from .long_scan import Scans
from .memory import release_memory

LONG_TOKENS_CAP = 4096  # the most tokens a long prompt keeps, whatever the model allows
BLOCK_BYTES = 48 * 2**20  # the weights of one block of query rows, every head asked, while it is computed
MAX_EXACT_BYTES = 256 * 2**20  # the most exact weights ``weights`` returns at once; larger asks are pooled
SINK_QUERIES = 16  # a causal model's first-token sink is judged on its first queries, as on a sentence
CHECKPOINT_EVERY = 3  # the stream is kept entering every third layer: a layer between runs at most two from it
RECENT_INPUTS = 2  # the attention inputs of the last layers viewed, kept

Progress = Callable[[int, int], None]
_ids = itertools.count()


class LongAttention(Scans):
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
            raise HeadLensError("Long prompts are computed inside the from-scratch engine; load the model with "
                                "backend='scratch' (the same weights give the same attention).")
        if model.encoder_decoder:
            raise HeadLensError("Long prompts are for encoders and decoder-only models.")
        self.model, self.stack = model, model.stack
        self.max_tokens = int(max_tokens or model.long_max_tokens)
        model.token_counts([text])  # an empty or unreadable text gets its sentence here
        enc = model.tokenize(text, truncation=True, max_length=self.max_tokens, return_offsets_mapping=True,
                              return_special_tokens_mask=True, return_tensors="pt")
        n = int(enc["input_ids"].shape[1])
        self.n_tokens_original = n if n < self.max_tokens else len(model.tokenize(text, verbose=False)["input_ids"])
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
        self._asking, self._asking_lock = 0, threading.Lock()  # the callers of ``run_to`` not ``behind``, now
        self._streams: dict[int, torch.Tensor] = {}  # layer -> the stream entering it, every CHECKPOINT_EVERY layers
        self._recent: OrderedDict[int, torch.Tensor] = OrderedDict()  # layer -> its attention input, the last viewed
        self._x: torch.Tensor | None = None          # the stream entering layer ``_next``: the pass got that far
        self._between: dict[int, torch.Tensor] = {}  # layer -> the stream entering it, made between two kept ones
        self._next = 0
        self._qk: tuple = (None, None)                                      # (layer, (q, k)), replaced whole
        self.releases = 0  # how many times it gave up its layers to the budget (``Kept``)
        self.sink_share = self._sink_share()
        KEPT.touch(self)

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
        """How many layers, from the first, the forward pass has reached (their weights can be computed with at most
        ``CHECKPOINT_EVERY - 1`` layers run again)."""
        return 0 if self._x is None else self._next + 1

    @property
    def nbytes(self) -> int:
        """Memory it holds, in bytes: the streams kept, the pass's own, the recent layers' attention inputs, and one
        layer's queries and keys (each buffer once)."""
        held = [t for t in (*self._streams.values(), self._x, *self._between.values(), *self._recent.values(),
                            *(self._qk[1] or ())) if t is not None]
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}.values())

    @property
    def layer_bytes(self) -> int:
        """What one more layer of the pass keeps, at most: the stream entering it (an attention input is as large)."""
        return len(self.tokens) * self.model.hidden_size * 4

    @property
    def may_run_ahead(self) -> bool:
        """Whether the server may run this prompt's next layer before a session asks for it: a layer is left to run
        and the long prompts' budget (``Kept``) has room for what it keeps."""
        return self.layers_done < self.n_layers and KEPT.has_room(self.layer_bytes)

    def release(self) -> int:
        """Give up every kept layer (they run again from the first when next asked); the bytes freed, or 0 where
        the prompt is running a layer now."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            freed = self.nbytes
            self._streams, self._recent, self._x, self._next, self._qk = {}, OrderedDict(), None, 0, (None, None)
            self._between = {}
            self.releases += bool(freed)
            return freed
        finally:
            self._lock.release()

    # --- the forward pass, as high as asked ---------------------------------------------------------

    def run_to(self, layer: int, progress: Progress | None = None, *, behind: bool = False) -> None:
        """Run the forward pass until the stream entering ``layer`` is known: the layers below it, those not
        run yet (``layer`` itself runs only when a higher layer is asked for). ``progress(done, layer + 1)``.

        The pass goes one layer at a time, each under the prompt's lock: threads asking for different layers
        share the work (the server running a prompt to the top after its first view, and a session's view of a
        layer above where that has got), and a layer already known is read without waiting for the pass above it.
        ``behind``: the caller gives way to any other asking for this prompt (the server's run to the top gives
        way to a session's view): it returns, perhaps before ``layer``, when one asks, and runs no layer while
        one does, nor one the long prompts' budget has no room for (``may_run_ahead``). Without ``behind``, each
        layer kept takes its room from the other prompts (``Kept.fit``)."""
        self._check_layer(layer)
        if not behind:
            KEPT.touch(self)
        if self._reached(layer):
            return
        if not behind:
            with self._asking_lock:
                self._asking += 1
        try:
            with torch.inference_mode():
                while not self._reached(layer):
                    if behind and (self._asking or not self.may_run_ahead):
                        return
                    with self._lock:
                        if not self._reached(layer) and not (behind and self._asking):
                            self._run_one()
                    if not behind:  # a session's layer takes the budget's room from the others
                        KEPT.fit(self)
                    if progress is not None:
                        progress(min(self._next, layer) + 1, layer + 1)
        finally:
            if not behind:
                with self._asking_lock:
                    self._asking -= 1
        release_memory()

    def _reached(self, layer: int) -> bool:
        return self._x is not None and self._next >= layer

    def _run_one(self) -> None:
        """Under the lock: the embeddings, or the next layer, keeping the stream entering every
        ``CHECKPOINT_EVERY``-th layer."""
        if self._x is None:
            self._x = self._streams[0] = self.stack.embed_tokens(**self.model._stack_inputs(self._ids))[0]
            return
        i = self._next
        self._x = self._run(self._x, i, i + 1)
        self._next = i + 1
        if self._next % CHECKPOINT_EVERY == 0:
            self._streams[self._next] = self._x

    def _run(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return self.stack.run_layers(x, start=start, stop=stop, causal=self.causal, need_weights=False,
                                     edits=self.stack.switched_off(self._mask, self._fill))[0]

    def attention_input(self, layer: int) -> torch.Tensor:
        """What ``layer``'s attention reads, ``(n, E)``: kept from a recent view, or made from the stream entering
        it, which runs from the stream kept below it (at most ``CHECKPOINT_EVERY - 1`` layers, each stream made kept
        until a layer of another span is asked: layers read in order, up as a survey reads them or down as a
        rollout does, run each once); the forward pass first runs up to it."""
        while True:
            self.run_to(layer)
            with self._lock, torch.inference_mode():
                if (x := self._recent.get(layer)) is not None:
                    self._recent.move_to_end(layer)
                    return x
                if not self._reached(layer):  # the budget took the prompt's layers meanwhile: run again
                    continue
                below = layer - layer % CHECKPOINT_EVERY
                if layer == self._next:
                    stream = self._x
                elif below == layer:
                    stream = self._streams[layer]
                else:
                    between = {i: x for i, x in self._between.items() if below < i < below + CHECKPOINT_EVERY}
                    start = max((i for i in between if i <= layer), default=below)
                    stream = between.get(start, self._streams[below])
                    for i in range(start, layer):
                        stream = between[i + 1] = self._run(stream, i, i + 1)
                    self._between = between
                x = self.stack.layers[layer].attention_input(stream)[0].contiguous()
                self._recent[layer] = x
                while len(self._recent) > RECENT_INPUTS:
                    self._recent.popitem(last=False)
                return x

    def queries_keys(self, layer: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """The heads ``layer`` still has (original numbering) and their queries and keys as the softmax
        sees them, ``(kept, n, Dh)`` each: queries scaled by ``1 / sqrt(Dh)``, after rotary positions, a
        grouped-query head given its group's keys."""
        self._check_layer(layer)
        KEPT.touch(self)
        cached_layer, qk = self._qk
        if cached_layer != layer:
            x = self.attention_input(layer)
            with torch.inference_mode():
                q, k = self.stack.layers[layer].attn.queries_keys(x[None])
            qk = (q[0], k[0])
            self._qk = (layer, qk)
            KEPT.fit(self)
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
