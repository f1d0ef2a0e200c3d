"""The from-scratch engine: our ``Stack`` networks on our MultiHeadAttention, behind ``AttentionModel``.

Heads can be switched off (zeroed or mean-ablated) and pruned from the weights, which
transformers no longer does; a pruned model saves to a folder that ``load_model`` opens again.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .base import AttentionModel, Progress, mean_pooled
from .errors import HeadLensError
from .limits import batches
from .long import LongAttention
from .memory import page_in
from .result import Attention
from .run import Edits
from .stacks import Stack


class ScratchModel(AttentionModel):
    """A ``Stack`` on the from-scratch engine (a BERT encoder, a decoder trained here…), from its weights or untrained."""

    backend = "scratch"

    def __init__(self, stack: Stack, tokenizer, name: str, device: torch.device):
        super().__init__(tokenizer, name, device, stack.n_layers, stack.n_heads, stack.max_positions,
                         causal=stack.causal)
        self.stack = stack
        self.head_dim, self.hidden_size = stack.head_dim, stack.hidden_size
        self.windows = stack.windows

    def _on_scratch(self, what: str) -> "ScratchModel":
        """Itself: it runs on the from-scratch engine."""
        return self

    def page_in(self) -> None:
        page_in(self.stack)

    @property
    def encoder(self) -> Stack:
        """The stack, by the name a BERT model's reader looks for."""
        return self.stack

    @property
    def pruned_heads(self) -> np.ndarray:
        """bool ``(layers, heads)``: True for a head removed by ``pruned``."""
        return self.stack.pruned_mask()

    def pruned(self, heads, *, head_means=None) -> "ScratchModel":
        """A new, smaller model without ``heads``, a list of ``(layer, head)``; this one is untouched.

        Its ``attend`` and ``embed`` equal this model's with those heads masked (zeroed), or with
        ``head_means`` (from ``head_means``) mean-ablated, the means folded into the output bias.
        Results keep every head's place: a pruned head's weights are zero and ``Attention.pruned``
        marks it. Pruning every head of a layer leaves its skip connection and feed-forward.
        """
        pairs = self.heads(heads)
        fill = self._head_fill(head_means, np.zeros((self.n_layers, self.n_heads)))
        stack = self.stack.pruned_copy(pairs, head_fill=fill).eval()
        gone = int(sum(len(h) for _, h in stack.config.pruned_heads))
        base = self.name.split(" (pruned:")[0]
        name = f"{base} (pruned: {gone} of {self.n_layers * self.n_heads} heads)" if gone else base
        copy = type(self)(stack, self.tokenizer, name, self.device)
        copy._tokenizer_lock = self._tokenizer_lock  # one tokenizer, so one lock, for both models
        copy.embed_max_tokens = self.embed_max_tokens
        return copy

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the model to ``folder``: safetensors, a config recording its pruned heads, and its tokenizer.

        ``load_model(folder, backend="scratch")`` opens it again.
        """
        folder = Path(folder)
        try:
            self.stack.save_pretrained(folder)
            self.tokenizer.save_pretrained(str(folder))
            if self.embed_max_tokens != self.max_tokens:
                (folder / "sentence_bert_config.json").write_text(
                    json.dumps({"max_seq_length": self.embed_max_tokens, "do_lower_case": False}) + "\n", encoding="utf-8")
        except OSError as err:
            raise HeadLensError(f"The model could not be written to {folder}: {err}") from err
        return folder

    def head_means(self, texts: Sequence[str], *, batch_size: int = 32, progress: Progress | None = None) -> np.ndarray:
        """Each head's mean output over every real token of ``texts`` (before the output projection),
        ``(layers, heads, head_dim)``: what mean ablation puts in place of a head. Pruned heads get zeros."""
        items = [texts] if isinstance(texts, str) else list(texts)
        if not items:
            raise HeadLensError("Mean ablation needs sentences to average a head's output over.")
        Dh = self.head_dim
        sums = torch.zeros(self.n_layers, self.n_heads, Dh, dtype=torch.float64)
        count, real, done = 0, {}, 0

        def adding(layer):
            kept = self.stack.kept[layer]

            def add(z):                                                          # (B, kept, L, Dh)
                sums[layer, kept] += (z * real["mask"]).sum(dim=(0, 2)).to("cpu", torch.float64)
                return z
            return add

        edits = Edits.every_layer("z", adding, range(self.n_layers))
        for chunk, inputs in self._padded_batches(items, batch_size, self.max_tokens):
            real["mask"] = inputs["attention_mask"][:, None, :, None].float()
            count += int(inputs["attention_mask"].sum())
            with torch.inference_mode():
                self._hidden(inputs, edits=edits)
            done += len(chunk)
            if progress is not None:
                progress(done, len(items))
        return (sums / count).to(torch.float32).numpy()

    def embed_variants(self, texts: Sequence[str], head_masks, *, head_means=None, batch_size: int = 32,
                       progress: Progress | None = None) -> np.ndarray:
        """``embed(texts, head_mask=m)`` for every ``m`` in ``head_masks``: ``(masks, texts, hidden)``.

        Layers before a mask's first switched-off head are run once for all masks, so ablating one
        head at a time costs about half of as many separate ``embed`` calls.
        """
        out = None
        for k, chunk, inputs, h in self._variant_states(texts, head_masks, head_means, batch_size,
                                                        self.embed_max_tokens, progress):
            if out is None:
                out = np.empty((len(head_masks), len(texts), self.hidden_size), dtype=np.float32)
            out[k, chunk] = mean_pooled(h, inputs["attention_mask"])
        return out

    def _variant_states(self, texts, head_masks, head_means, batch_size: int, max_length: int, progress):
        """``(k, chunk, inputs, h)`` for each batch of ``texts`` and each mask ``k`` of ``head_masks``: the last
        hidden state ``h`` (after the final norm) with that mask, the layers before its first switched-off
        head run once for every mask."""
        items = list(texts)
        masks = [self._head_mask(m) for m in head_masks]
        if not items or not masks:
            raise HeadLensError("There is no text to run, or no head mask to run it with.")
        fill = None if head_means is None else self._head_fill(head_means, head_masks[0])
        starts = [int((m == 0).any(dim=1).float().argmax()) if bool((m == 0).any()) else self.n_layers for m in masks]
        done, total = 0, len(masks) * len(items)
        for chunk, inputs in self._padded_batches(items, batch_size, max_length):
            with torch.inference_mode():
                x, padding, packing = self.stack.embed_tokens(**self._stack_inputs(inputs))
                entering = [x]                                                     # the input of each layer
                for layer in range(self.n_layers):
                    entering.append(self.stack.run_layers(entering[-1], padding, packing, start=layer,
                                                          stop=layer + 1, need_weights=False)[0])
                for k, (mask, start) in enumerate(zip(masks, starts)):
                    h, _ = self.stack.run_layers(entering[start], padding, packing, start=start, need_weights=False,
                                                 edits=self.stack.switched_off(mask, fill))
                    yield k, chunk, inputs, self.stack.finish(h if packing is None else packing.unpack(h))
                    done += len(chunk)
                    if progress is not None:
                        progress(done, total)

    def value_norms(self, text: str, **attend) -> np.ndarray:
        """``(layers, heads, n, n)`` float32 for one text: each weight times the length of what its key sends
        through its head, ``||α_ij W_O^h (W_V^h x_j + b_V^h)||`` (Kobayashi et al. 2020): attention to a key
        that sends almost nothing (a sink, [SEP]) counts for little. Pruned heads are zero. ``attend``:
        ``attend``'s options (``head_mask``, ``causal``…)."""
        lengths: dict[int, torch.Tensor] = {}

        def keep(layer):
            def read(h):
                lengths[layer] = self.stack.layers[layer].attn.value_norms(h)[0]     # (kept heads, n)
                return h
            return read

        att = self.attend(text, **attend, edits=Edits.every_layer("attn_in", keep, range(self.n_layers)))
        out = np.zeros_like(att.weights)
        for layer, norms in lengths.items():
            kept = self.stack.kept[layer]
            out[layer, kept] = att.weights[layer, kept] * norms.to("cpu", torch.float32).numpy()[:, None, :]
        return out

    def queries_keys(self, texts: Sequence[str], layers: Sequence[int], *, batch_size: int = 32,
                     progress: Progress | None = None) -> list[tuple[Attention, np.ndarray, np.ndarray]]:
        """For each text, ``(attention, queries, keys)``: its attention up to the highest of ``layers`` (the pass
        goes no higher), and the queries and keys of ``layers`` exactly as each head's softmax sees them, float32
        ``(len(layers), heads, n, Dh)``
        each: queries scaled by ``1 / sqrt(Dh)``, both after the rotary rotation, a grouped-query head given
        its group's keys. Row ``i`` of a head's weights is the softmax of ``queries[i] @ keys.T`` over the keys
        query ``i`` may see. Pruned heads are zero."""
        items = [texts] if isinstance(texts, str) else list(texts)
        wanted = [int(layer) for layer in layers]
        if not items:
            raise HeadLensError("There is no text to read queries and keys from.")
        if not wanted or any(not 0 <= layer < self.n_layers for layer in wanted):
            raise HeadLensError(f"Name layers from 0 to {self.n_layers - 1}; {list(layers)} asks for others.")
        below = list(range(max(wanted) + 1))  # each layer run as attend runs it, so that any grouping reads alike
        caught: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        out: list[tuple[Attention, np.ndarray, np.ndarray] | None] = [None] * len(items)
        done = 0
        edits = self._catching(caught, wanted)
        for chunk in batches(self.token_counts(items), max(1, batch_size), self.bytes_per_token_pair):
            atts = self._attend_batch([items[i] for i in chunk], None, None, False, layers=below, edits=edits)
            for b, (i, att) in enumerate(zip(chunk, atts)):
                out[i] = (att, *self._caught_rows(caught, wanted, b, len(att.tokens)))
            done += len(chunk)
            if progress is not None:
                progress(done, len(items))
        return out

    def _head_mask(self, head_mask):
        if head_mask is None:
            return None
        mask = torch.as_tensor(np.asarray(head_mask, dtype=np.float32))
        if mask.shape != (self.n_layers, self.n_heads):
            raise HeadLensError(f"The head mask must have shape ({self.n_layers}, {self.n_heads}), "
                                f"one 0 or 1 per layer and head; it has {tuple(mask.shape)}.")
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise HeadLensError("The head mask may hold only 0 (head off) and 1 (head on).")
        return mask.to(self.device)

    def _head_fill(self, head_means, head_mask):
        if head_means is None:
            return None
        if head_mask is None:
            raise HeadLensError("Head means replace the heads a head mask switches off; give the head mask too.")
        Dh = self.head_dim
        fill = torch.tensor(np.asarray(head_means, dtype=np.float32))  # a copy: shared means may be read-only
        if fill.shape != (self.n_layers, self.n_heads, Dh):
            raise HeadLensError(f"Head means must have shape ({self.n_layers}, {self.n_heads}, {Dh}), as "
                                f"head_means returns them; these have {tuple(fill.shape)}.")
        return fill.to(self.device)

    def _catching(self, caught: dict, layers: Sequence[int]) -> Edits:
        """Edits that put each of ``layers``' queries and keys, as its attention reads them, in ``caught``."""
        def keep(layer):
            def read(h):
                caught[layer] = tuple(t.to("cpu", torch.float32) for t in self.stack.layers[layer].attn.queries_keys(h))
                return h
            return read

        return Edits.every_layer("attn_in", keep, set(layers))

    def _caught_rows(self, caught: dict, wanted: list[int], b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Text ``b`` of a batch: the queries and keys the hooks caught for ``wanted`` layers, float32
        ``(len(wanted), heads, n, Dh)`` each, a pruned head's zero."""
        q = np.zeros((len(wanted), self.n_heads, n, self.head_dim), dtype=np.float32)
        k = np.zeros_like(q)
        for j, layer in enumerate(wanted):
            kept = self.stack.kept[layer]
            q[j, kept] = caught[layer][0][b, :, :n].numpy()
            k[j, kept] = caught[layer][1][b, :, :n].numpy()
        return q, k

    def queries_keys_groups(self, texts: Sequence[str], groups: Sequence[Sequence[int]], *, batch_size: int = 32,
                            progress: Progress | None = None):
        """``queries_keys`` of each group of layers in turn (groups in ascending order, one above the other), a
        list per group: the first group's as ``queries_keys`` reads it, attention included; each later group's as
        ``(None, queries, keys)``, its pass going on from the hidden states where the one before stopped, so
        that every layer below runs once in all. The same numbers as ``queries_keys`` of each group alone.
        ``progress(done, total)`` counts texts read, once per group."""
        items = [texts] if isinstance(texts, str) else list(texts)
        groups = [[int(layer) for layer in group] for group in groups]
        if any(not group for group in groups) or any(min(b) <= max(a) for a, b in zip(groups, groups[1:])):
            raise HeadLensError(f"Name groups of layers in ascending order, each above the one before; {groups} is not.")
        n = len(items)

        def ticker(g: int):
            return None if progress is None else (lambda done, _total: progress(g * n + done, n * len(groups)))

        yield self.queries_keys(items, groups[0], batch_size=batch_size, progress=ticker(0))
        if len(groups) == 1:
            return
        states = []  # per batch: the texts, the hidden states where the last pass stopped, and that layer
        for chunk in batches(self.token_counts(items), max(1, batch_size), self.bytes_per_token_pair):
            enc, lengths, _ = self._encode([items[i] for i in chunk])
            with torch.inference_mode():
                x, padding, packing = self.stack.embed_tokens(**self._stack_inputs(self._inputs(enc)))
            states.append({"chunk": chunk, "lengths": lengths, "x": x, "padding": padding, "packing": packing, "at": 0})
        for g, wanted in enumerate(groups[1:], 1):
            caught: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            out: list = [None] * n
            done, tick = 0, ticker(g)
            edits = self._catching(caught, wanted)
            for state in states:
                with torch.inference_mode():  # each layer run as attend runs it (weights made, not kept)
                    state["x"], _ = self.stack.run_layers(state["x"], state["padding"], state["packing"],
                                                          start=state["at"], stop=max(wanted) + 1,
                                                          causal=self.causal, need_weights=True, edits=edits)
                state["at"] = max(wanted) + 1
                for b, (i, length) in enumerate(zip(state["chunk"], state["lengths"])):
                    out[i] = (None, *self._caught_rows(caught, wanted, b, length))
                done += len(state["chunk"])
                if tick is not None:
                    tick(done, n)
            yield out

    def _attend_batch(self, texts, targets, head_mask, causal, head_fill=None, layers=None, edits=None):
        if targets is not None:
            raise HeadLensError("A target text is for encoder-decoder models; this model has one stack.")
        enc, lengths, originals = self._encode(texts)
        inputs = self._inputs(enc)
        causal = causal or self.causal
        with torch.inference_mode():
            weights = self.stack.attention_weights(**self._stack_inputs(inputs), layers=layers, causal=causal,
                                                   head_mask=head_mask, head_fill=head_fill, edits=edits)
        pruned = self.pruned_heads if self.stack.pruned else None
        return self._results(texts, enc, lengths, originals, weights, causal=causal, pruned=pruned, layers=layers)

    def attend_long(self, text: str, *, head_mask=None, head_means=None, causal: bool = False):
        """``text`` as a ``LongAttention``: up to ``long_max_tokens`` tokens (4,096 for SmolLM2), the forward
        pass run without weights as high as a view asks, each layer's weights computed for the heads and
        query rows asked (``weights``, ``pooled``, ``figures``)."""
        return LongAttention(self, text, head_mask=head_mask, head_means=head_means, causal=causal)

    def _hidden(self, inputs, head_mask=None, head_fill=None, edits=None):
        return self.stack(**self._stack_inputs(inputs), need_logits=False, head_mask=head_mask,
                          head_fill=head_fill, edits=edits).last_hidden_state

    def _stack_inputs(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tokenizer's outputs that the stack reads (a decoder reads no token types)."""
        return {k: v for k, v in inputs.items() if k in self.stack.input_names}
