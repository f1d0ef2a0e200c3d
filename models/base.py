"""``AttentionModel``: what every engine shares, from text to ``Attention`` results.

An engine subclasses it with ``_attend_batch`` (a batch of texts to results) and ``_hidden`` (a
batch to its last hidden state); tokenizing, checking texts, batching by length within the memory
limits, embeddings and splitting padded batches into per-text results live here once.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .errors import HeadLensError
from .limits import batches, token_limit
from .long import LONG_TOKENS_CAP
from .result import Attention
from .run import language_stack

MAX_TOKENS_CAP = 1024  # the most tokens HeadLens shows, whatever the model allows

Progress = Callable[[int, int], None]


class AttentionModel:
    """A loaded model that turns text into ``Attention``. Shared between users: never mutated by a call."""

    backend = ""
    encoder_decoder = False  # an encoder-decoder's attend returns three parts

    def __init__(self, tokenizer, name: str, device: torch.device, n_layers: int, n_heads: int,
                 max_positions: int | None, causal: bool = False, parts: int = 1):
        self.tokenizer, self.name, self.device = tokenizer, name, device
        # A fast tokenizer sets truncation and padding on its Rust object for each call, so two
        # threads calling it at once fail ("Already borrowed"); calls take turns.
        self._tokenizer_lock = threading.Lock()
        self.n_layers, self.n_heads, self.causal = n_layers, n_heads, causal
        self.windows: tuple[int | None, ...] | None = None  # per layer, a sliding window (Attention.windows)
        # float32 weights per (query, key) pair of one text: every layer and head, of every part
        # (an encoder-decoder has three: encoder, decoder, cross)
        self.bytes_per_token_pair = 4 * n_layers * n_heads * parts
        limits = [m for m in (max_positions, tokenizer.model_max_length) if m and m < 1e9]
        self.max_tokens = min([MAX_TOKENS_CAP, token_limit(self.bytes_per_token_pair), *limits])
        self.embed_max_tokens = self.max_tokens  # the sentence-transformers length, where the folder gives one
        # a long prompt (``attend_long``) keeps no weights, so only the model's own limits and the cap apply
        self.long_max_tokens = max(self.max_tokens, min([LONG_TOKENS_CAP, *limits]))

    def __getstate__(self) -> dict:  # a pickled model (a training sent from its process) gets a lock of its own
        return {k: v for k, v in self.__dict__.items() if k != "_tokenizer_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _tokenizer_lock=threading.Lock())

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name!r}, backend={self.backend!r}, device={str(self.device)!r}, "
                f"layers={self.n_layers}, heads={self.n_heads})")

    def attend(self, texts: str | Sequence[str], *, head_mask=None, head_means=None, causal: bool = False,
               target: str | Sequence[str] | None = None, layers: Sequence[int] | None = None,
               batch_size: int = 32, progress: Progress | None = None, edits=None) -> Attention | list[Attention]:
        """Attention weights of one text, or of several run as padded batches.

        Args:
            texts: a string, or a list of strings (a list in, a list out, in the same order).
            head_mask: ``(layers, heads)`` 0/1 array: 0 switches a head off (from-scratch engine).
            head_means: ``(layers, heads, head_dim)``, from ``head_means``: a head switched off
                outputs its mean instead of zero (mean ablation; from-scratch engine).
            causal: masked self-attention (from-scratch engine).
            target: for encoder-decoder models, the decoder's text(s); default: the input itself.
            layers: only these layers' weights, in this order (``Attention.layers`` names them); the
                from-scratch engine runs no layer above the highest and computes weights for these alone.
            batch_size: texts per forward pass; texts of similar length are batched together.
            progress: called as ``progress(done, total)`` after each batch.
            edits: ``models.run.Edits`` reading or replacing what flows inside the run (from-scratch engine).
        """
        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        if not items:
            raise HeadLensError("There is no text to attend to.")
        lengths = self.token_counts(items)
        targets = self._targets(items, target, single)
        if targets is not None:
            lengths = [max(n, m) for n, m in zip(lengths, self.token_counts(targets, "target"))]
        mask, fill = self._head_mask(head_mask), self._head_fill(head_means, head_mask)
        layers = None if layers is None else self._layers(layers)
        results: list[Attention | None] = [None] * len(items)
        done_count = 0
        for chunk in batches(lengths, max(1, batch_size), self.bytes_per_token_pair):
            done = self._attend_batch([items[i] for i in chunk],
                                      None if targets is None else [targets[i] for i in chunk], mask, causal, fill,
                                      layers=layers, **({} if edits is None else {"edits": edits}))
            for i, res in zip(chunk, done):
                results[i] = res
            done_count += len(chunk)
            if progress is not None:
                progress(done_count, len(items))
        return results[0] if single else results

    def token_counts(self, texts: Sequence[str], noun: str = "text") -> list[int]:
        """Tokens the model reads of each text (special tokens included, after truncation).

        Raises ``HeadLensError`` for a text that is empty, is not valid Unicode, or holds nothing
        the tokenizer keeps (only spaces, control or invisible characters).
        """
        def where(i: int) -> str:
            return f"The {noun}" if len(texts) == 1 else f"{noun.capitalize()} {i + 1}"

        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise HeadLensError(f"{where(i)} is empty; type a sentence.")
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as err:
                raise HeadLensError(f"{where(i)} holds characters that are not valid Unicode "
                                    f"(a lone surrogate at position {err.start}).") from err
        enc = self.tokenize(list(texts), truncation=True, max_length=self.max_tokens,
                             return_special_tokens_mask=True, verbose=False)
        for i, special in enumerate(enc["special_tokens_mask"]):
            if all(special):
                raise HeadLensError(f"{where(i)} has nothing the model can read: only spaces, control or "
                                    "invisible characters such as zero-width spaces.")
        return [len(ids) for ids in enc["input_ids"]]

    def _targets(self, items, target, single):
        if target is None:
            return None
        targets = [target] if isinstance(target, str) else list(target)
        if len(targets) != len(items):
            raise HeadLensError(f"{len(items)} texts but {len(targets)} targets; give one target per text.")
        if any(not isinstance(t, str) or not t.strip() for t in targets):
            raise HeadLensError("A target text is empty; type the decoder's sentence.")
        return targets

    def is_long(self, text: str) -> bool:
        """Whether ``text`` has more tokens than ``attend`` keeps (``max_tokens``) and this engine computes
        long prompts (``attend_long``) further."""
        if self.long_max_tokens <= self.max_tokens or not isinstance(text, str):
            return False
        return len(self.tokenize(text, verbose=False)["input_ids"]) > self.max_tokens

    def _layers(self, layers) -> tuple[int, ...]:
        try:
            out = tuple(int(layer) for layer in layers)
        except (TypeError, ValueError) as err:
            raise HeadLensError(f"Name layers by number; {layers!r} is not that.") from err
        if not out or any(not 0 <= layer < self.n_layers for layer in out):
            raise HeadLensError(f"Name layers from 0 to {self.n_layers - 1}; {list(out)} asks for others.")
        if self.encoder_decoder:
            raise HeadLensError("Choosing layers is for encoders and decoder-only models.")
        return out

    def attend_long(self, text: str, *, head_mask=None, head_means=None, causal: bool = False):
        """A ``LongAttention``: ``text`` up to ``long_max_tokens`` tokens, each layer's weights computed when
        asked (from-scratch engine: a transformers model hands it to ``scratch()``)."""
        return self.scratch("Long prompts are computed").attend_long(
            text, head_mask=head_mask, head_means=head_means, causal=causal)

    def scratch(self, what: str = "This", *, language: bool = False) -> "AttentionModel":
        """This model on the from-scratch engine, with the same weights: itself when it runs there. What reads
        or changes a head inside the attention (head masks, pruning, value norms, queries and keys, long
        prompts, patching) runs on it. ``what`` starts the sentence of a model the engine does not implement;
        ``language``: checked to be a language model too (a sentence for an encoder)."""
        model = self._on_scratch(what)
        if language:
            language_stack(model, what)
        return model

    def page_in(self) -> None:
        """Read every weight once (``models.memory.page_in``), so that a first pass does not fault them in."""

    def _on_scratch(self, what: str) -> "AttentionModel":
        raise HeadLensError(f"{what} inside the from-scratch engine, which does not implement {self.name}'s "
                            "architecture.")

    def heads(self, heads) -> list[tuple[int, int]]:
        """``heads`` as ``(layer, head)`` pairs of ints, each checked to exist; a sentence when one does not."""
        pairs = []
        for item in heads:
            try:
                layer, head = (int(x) for x in item)
            except (TypeError, ValueError) as err:
                raise HeadLensError(f"Name each head as (layer, head); {item!r} is not that.") from err
            if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
                raise HeadLensError(f"There is no head {head} in layer {layer}: {self.name} has {self.n_layers} "
                                    f"layers of {self.n_heads} heads, numbered from 0.")
            pairs.append((layer, head))
        return pairs

    def embed(self, texts: str | Sequence[str], *, head_mask=None, head_means=None, batch_size: int = 32,
              progress: Progress | None = None) -> np.ndarray:
        """Sentence embeddings, as all-MiniLM-L6-v2 is trained to produce them: the mean of the last
        hidden state over each text's real tokens, L2-normalised. ``(n_texts, hidden)`` float32.

        Texts are cut at the sentence-transformers length when the model folder gives one
        (``sentence_bert_config.json``, 256 tokens for all-MiniLM-L6-v2), else at ``max_tokens``.
        ``head_mask`` and ``head_means`` switch heads off as in ``attend`` (from-scratch engine).
        """
        items = [texts] if isinstance(texts, str) else list(texts)
        if not items:
            raise HeadLensError("There is no text to embed.")
        if self.encoder_decoder:
            raise HeadLensError("Sentence embeddings are for encoders and decoder-only models; "
                                f"{self.name} is an encoder-decoder.")
        mask, fill = self._head_mask(head_mask), self._head_fill(head_means, head_mask)
        out, done = None, 0
        for chunk, inputs in self._padded_batches(items, batch_size, self.embed_max_tokens):
            with torch.inference_mode():
                pooled = mean_pooled(self._hidden(inputs, mask, fill), inputs["attention_mask"])
            if out is None:
                out = np.empty((len(items), pooled.shape[1]), dtype=np.float32)
            out[chunk] = pooled
            done += len(chunk)
            if progress is not None:
                progress(done, len(items))
        return out

    def _padded_batches(self, items: list[str], batch_size: int, max_length: int):
        """``(chunk, inputs)`` per batch of texts of similar length: the texts' indices and their padded
        model inputs, cut at ``max_length`` tokens."""
        for chunk in batches(self.token_counts(items), max(1, batch_size), self.bytes_per_token_pair):
            enc = self.tokenize([items[i] for i in chunk], padding=True, truncation=True, max_length=max_length,
                                 return_tensors="pt")
            yield chunk, self._inputs(enc)

    def value_norms(self, text: str, **attend) -> np.ndarray:
        """``(layers, heads, n, n)``: each weight times the length of what its key sends (on ``scratch()``)."""
        return self.scratch("Value norms read each head's value and output projections").value_norms(text, **attend)

    def queries_keys(self, texts, layers, **options):
        """Each head's queries and keys as its softmax sees them (on ``scratch()``)."""
        return self.scratch("Queries and keys are read").queries_keys(texts, layers, **options)

    def queries_keys_groups(self, texts, groups, **options):
        """``queries_keys`` of each group of layers in turn, the layers below run once (on ``scratch()``)."""
        return self.scratch("Queries and keys are read").queries_keys_groups(texts, groups, **options)

    def _head_mask(self, head_mask):
        if head_mask is None:
            return None
        raise HeadLensError("Head masks need the from-scratch engine: transformers models no longer take them.")

    def _head_fill(self, head_means, head_mask):
        if head_means is None:
            return None
        raise HeadLensError("Mean ablation needs the from-scratch engine: transformers models no longer take head masks.")

    def tokenize(self, *args, **kwargs):
        """The tokenizer's encoding of ``args`` (its own arguments), one call at a time: a model shared by every
        session shares one tokenizer, whose fast backend is not safe from two threads at once."""
        with self._tokenizer_lock:
            return self.tokenizer(*args, **kwargs)

    def _encode(self, texts: list[str]):
        enc = self.tokenize(texts, padding=True, truncation=True, max_length=self.max_tokens,
                             return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
        lengths = enc["attention_mask"].sum(dim=1).tolist()
        originals = list(lengths)
        for i, n in enumerate(lengths):
            if n >= self.max_tokens:
                originals[i] = len(self.tokenize(texts[i], verbose=False)["input_ids"])
        return enc, lengths, originals

    def _inputs(self, enc) -> dict[str, torch.Tensor]:
        names = set(getattr(self.tokenizer, "model_input_names", ())) | {"input_ids", "attention_mask"}
        return {k: enc[k].to(self.device) for k in ("input_ids", "attention_mask", "token_type_ids")
                if k in enc and k in names}

    def _results(self, texts, enc, lengths, originals, stacked: torch.Tensor, component="self",
                 causal=False, keys: list[Attention] | None = None, pruned: np.ndarray | None = None,
                 layers: tuple[int, ...] | None = None) -> list[Attention]:
        """Split a ``(B, layers, H, Lq, Lk)`` tensor into per-text results without padding."""
        weights = stacked.detach().to("cpu", torch.float32).numpy()
        ids = enc["input_ids"]
        out = []
        for i, text in enumerate(texts):
            n = lengths[i]
            nk = n if keys is None else len(keys[i].tokens)
            tokens = self.tokenizer.convert_ids_to_tokens(ids[i, :n].tolist())
            out.append(Attention(
                tokens=tokens,
                weights=np.ascontiguousarray(weights[i, :, :, :n, :nk]),
                word_ids=list(enc.word_ids(i)[:n]),
                special=enc["special_tokens_mask"][i, :n].numpy().astype(bool),
                offsets=[tuple(o) for o in enc["offset_mapping"][i, :n].tolist()],
                text=text, model_name=self.name, backend=self.backend, device=str(self.device),
                truncated=originals[i] > n, n_tokens_original=originals[i], component=component,
                causal=causal, keys=None if keys is None else keys[i],
                pruned=pruned if pruned is None or layers is None else pruned[list(layers)], layers=layers,
                windows=self.windows if causal and keys is None else None))
        return out

    def _attend_batch(self, texts, targets, head_mask, causal, head_fill=None, layers=None) -> list[Attention]:
        raise NotImplementedError

    def _hidden(self, inputs: dict[str, torch.Tensor], head_mask=None, head_fill=None) -> torch.Tensor:
        """The last hidden state ``(B, L, hidden)`` of a batch, without attention weights."""
        raise NotImplementedError

    def blanked_outputs(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """The last layer's output at every position, for ``text`` and for ``text`` with each token
        blanked in turn (the tokenizer's mask token, else its unknown token), in one batch.

        Returns ``(full, blanked)``: ``(n, hidden)`` and ``(n, n, hidden)``, ``blanked[j]`` with
        token ``j`` replaced; special tokens are blanked too, as positions like any other.
        """
        if self.encoder_decoder:
            raise HeadLensError("Blanking tokens one at a time is for encoders and decoder-only models.")
        blank = self.tokenizer.mask_token_id
        blank = self.tokenizer.unk_token_id if blank is None else blank
        if blank is None:
            raise HeadLensError(f"The tokenizer of {self.name} has neither a mask nor an unknown token to blank with.")
        self.token_counts([text])
        enc, lengths, _ = self._encode([text])
        inputs = self._inputs(enc)
        n = lengths[0]
        batch = {k: v[:, :n].repeat(n + 1, 1) for k, v in inputs.items()}  # row 0 as is, row j + 1 blanks j
        batch["input_ids"][torch.arange(1, n + 1), torch.arange(n)] = blank
        with torch.inference_mode():
            hidden = self._hidden(batch).to("cpu", torch.float32).numpy()
        return hidden[0], hidden[1:]


def mean_pooled(hidden: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
    """The L2-normalised mean of ``hidden`` ``(B, L, E)`` over real tokens, as sentence-transformers pools."""
    hidden = hidden.float()
    real = attention_mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()
