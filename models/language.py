"""A language model on the from-scratch engine: ``ScratchModel`` with its next-token loss, predictions and generation."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from .base import Progress
from .errors import HeadLensError
from .scratch import ScratchModel
from .stacks import Stack

LOGIT_ELEMENTS = 2**26  # logits made at a time: 256 MiB of float32 (Gemma 3: 256 positions, SmolLM2: 1,365)
VOCABULARY_SLICE = 16_384  # tokens of the vocabulary whose logits are summed at a time outside autograd
GRADIENT_BLOCKS = 2  # a block whose gradient is made holds two of its size for a moment: blocks half as large


class DecoderModel(ScratchModel):
    """A language model on the from-scratch engine (such as a decoder trained in HeadLens): attend, embed, ablate,
    prune, and its next-token loss."""

    @property
    def decoder(self) -> Stack:
        return self.stack

    def loss(self, texts: Sequence[str], head_mask=None, head_means=None) -> torch.Tensor:
        """Mean next-token cross-entropy over ``texts``, every predicted token counted once."""
        enc = self.tokenize(list(texts), padding=True, truncation=True, max_length=self.max_tokens,
                             return_tensors="pt")
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        fill = None if head_means is None else self._head_fill(head_means, head_mask)
        h = self.stack(ids, mask, need_weights=False, need_logits=False, head_mask=head_mask,
                       head_fill=fill).last_hidden_state
        total, count, _ = self.next_token_sums(h, ids, mask)
        return total / max(count, 1)

    def next_token_sums(self, h: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor):
        """``(summed cross-entropy, predicted tokens, top-1 predictions)`` of a batch's last hidden state
        ``h`` ``(B, L, E)``: each real token but the last predicting the next. The logits are made a block of
        positions at a time, within ``LOGIT_ELEMENTS``; outside autograd, ``VOCABULARY_SLICE`` tokens of the
        vocabulary at a time, each slice's sums taken while it is in the cache (Gemma 3's predictions 10% faster).
        Under autograd, with the unembedding fixed (as in every model opened to be read), no block is kept for
        the backward pass: each block's gradient by the states, ``(softmax - one-hot) @ unembedding``, is made
        in the block's own memory as the block is, and handed to autograd with the sum (``_WithGradient``)."""
        predicting = _predicting(mask)
        states, targets = h[:, :-1][predicting], ids[:, 1:][predicting]    # (N, E), (N,)
        unembedding = self.stack.unembedding()
        recorded = torch.is_grad_enabled() and (states.requires_grad or unembedding.requires_grad)
        eager = recorded and not unembedding.requires_grad
        vocab = unembedding.shape[0]
        rows = max(1, LOGIT_ELEMENTS // vocab // (GRADIENT_BLOCKS if eager else 1))
        total, top, grads = h.new_zeros(()), [], []
        for i in range(0, len(targets), rows):
            part = (states[i:i + rows], targets[i:i + rows])
            if eager:  # the block's gradient made now, while its logits are at hand: nothing kept
                with torch.no_grad():
                    loss, best, gradient = self._block_gradient(part[0].detach(), part[1], unembedding)
                grads.append(gradient)
            elif recorded:  # a model in training, whose unembedding learns
                logits = _wide(self.stack.logits(part[0]))
                loss = (torch.logsumexp(logits, dim=-1) - logits.gather(-1, part[1][:, None])[:, 0]).sum()
                best = logits.detach().argmax(dim=-1)
            else:
                with torch.no_grad():
                    loss, best = self._block_loss(*part, vocab)
            total = total + loss
            top.append(best)
        if eager and grads:
            total = _WithGradient.apply(states, total, torch.cat(grads))
        top = torch.cat(top) if top else targets.new_zeros(0)
        return total, len(targets), top

    def _block_loss(self, states: torch.Tensor, targets: torch.Tensor, vocab: int):
        """``(summed cross-entropy, top-1 predictions)`` of ``states``' next-token predictions of ``targets``
        (log-sum-exp minus the target's logit), ``VOCABULARY_SLICE`` tokens of the vocabulary at a time: each
        slice's maximum, where it lies and sum of exponentials, joined at the end (the first maximum wins a tie,
        as ``argmax`` of the whole has it)."""
        n, wanted = len(targets), None
        maxima, where, sums = [], [], []
        for start in range(0, vocab, VOCABULARY_SLICE):
            logits = _wide(self.stack.logits(states, slice(start, start + VOCABULARY_SLICE)))  # (n, slice)
            inside = (targets >= start) & (targets < start + logits.shape[1])
            if wanted is None:
                wanted = logits.new_zeros(n)
            if inside.any():
                wanted[inside] = logits[inside].gather(-1, (targets[inside] - start)[:, None])[:, 0]
            top, at = logits.max(dim=-1)
            maxima.append(top)
            where.append(at + start)
            sums.append(logits.sub_(top[:, None]).exp_().sum(dim=-1))
        maxima, where, sums = torch.stack(maxima, 1), torch.stack(where, 1), torch.stack(sums, 1)  # (n, slices)
        top, first = maxima.max(dim=1)
        best = where.gather(1, first[:, None])[:, 0]
        summed = (sums * (maxima - top[:, None]).exp()).sum(dim=1).log() + top
        return (summed - wanted).sum(), best

    def _block_gradient(self, states: torch.Tensor, targets: torch.Tensor, unembedding: torch.Tensor):
        """``_block_loss`` and its gradient by ``states``, worked out instead of recorded: the cross-entropy's
        gradient by the logits is the softmax less the target's one-hot, made in the logits' own memory, and a
        soft cap ``c`` (``logits = c tanh(z / c)``) multiplies it by ``1 - (logits / c)**2``. Half the time of
        autograd's backward, whose blocks of a few positions each multiplied the whole unembedding twice."""
        logits = _wide(self.stack.logits(states))                           # (n, vocab)
        wanted, best = logits.gather(-1, targets[:, None])[:, 0], logits.argmax(dim=-1)
        cap = self.stack.logit_cap
        slope = None if cap is None else logits.div(cap).square_().neg_().add_(1)
        summed, sums = _exp_in_place(logits)
        softmax = logits.div_(sums)
        softmax.scatter_add_(-1, targets[:, None], softmax.new_full((len(targets), 1), -1.0))
        if slope is not None:
            softmax.mul_(slope)
        gradient = (softmax.to(unembedding.dtype) @ unembedding).to(states.dtype)  # (n, E)
        return (summed - wanted).sum(), best, gradient

    def generate_ids(self, ids: Sequence[int], *, max_new_tokens: int = 64, temperature: float = 0.0,
                     seed: int = 0) -> Iterator[int]:
        """The next token ids after ``ids``, one at a time: the most likely (``temperature`` 0, greedy) or drawn
        from the softmax at ``temperature``, reproducibly for ``seed``; it stops at the end-of-text token."""
        if not 1 <= max_new_tokens <= self.max_tokens:
            raise HeadLensError(f"Generate between 1 and {self.max_tokens} tokens.")
        if temperature < 0:
            raise HeadLensError("The temperature must be 0 (greedy) or more.")
        gen = torch.Generator().manual_seed(seed)
        ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        for _ in range(min(max_new_tokens, self.max_tokens - ids.shape[1])):
            with torch.inference_mode():
                h = self.stack(ids, need_weights=False, need_logits=False).last_hidden_state[:, -1]
                logits = self.stack.logits(h)[0].float().cpu()
            if temperature == 0:
                token = int(logits.argmax())
            else:
                token = int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=gen))
            yield token
            if token == self.tokenizer.eos_token_id:
                return
            ids = torch.cat([ids, torch.tensor([[token]], device=self.device)], dim=1)

    def generate(self, text: str, **options) -> Iterator[str]:
        """The continuation of ``text`` as it is written, piece by piece (``generate_ids``' options); the
        pieces joined are the continuation's text, end-of-text token left out."""
        self.token_counts([text])
        prompt = self.tokenize(text)["input_ids"]
        new, shown = [], ""
        for token in self.generate_ids(prompt, **options):
            if token == self.tokenizer.eos_token_id:
                return
            new.append(token)
            now = self.tokenizer.decode(new)
            if not now.endswith("\ufffd"):  # a character split across tokens waits for its last byte
                yield now[len(shown):]
                shown = now

    def loss_variants(self, texts: Sequence[str], head_masks, *, head_means=None, batch_size: int = 32,
                      progress: Progress | None = None) -> np.ndarray:
        """``loss(texts, head_mask=m)`` for every ``m`` in ``head_masks``, ``(masks,)``, the layers before a
        mask's first switched-off head run once for all masks."""
        sums, counts = np.zeros(len(head_masks)), np.zeros(len(head_masks))
        for k, _, inputs, h in self._variant_states(texts, head_masks, head_means, batch_size, self.max_tokens,
                                                    progress):
            total, count, _ = self.next_token_sums(h, inputs["input_ids"], inputs["attention_mask"])
            sums[k] += float(total)
            counts[k] += count
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)  # a one-token text predicts nothing

    def predictions(self, texts: Sequence[str], *, batch_size: int = 32) -> tuple[float, np.ndarray]:
        """``(mean next-token loss, top-1 prediction at every predicted token)`` over ``texts``, in a fixed order."""
        items, total, count = list(texts), 0.0, 0
        top = [None] * len(items)
        for chunk, inputs in self._padded_batches(items, batch_size, self.max_tokens):
            with torch.inference_mode():
                h = self._hidden(inputs)
                ids, mask = inputs["input_ids"], inputs["attention_mask"]
                # the batch's logits in one product (the unembedding read once, not once a text), split by text
                s, n, t = self.next_token_sums(h, ids, mask)
                total, count = total + float(s), count + n
                for i, part in zip(chunk, torch.split(t, _predicting(mask).sum(dim=1).tolist())):
                    top[i] = part.cpu().numpy()
        return total / max(count, 1), np.concatenate(top)


class _WithGradient(torch.autograd.Function):
    """``total``, whose gradient by ``states`` is ``gradient``, already made: the loss's backward pass reads no
    logits."""

    @staticmethod
    def forward(ctx, states: torch.Tensor, total: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gradient)
        return total.clone()

    @staticmethod
    def backward(ctx, upstream: torch.Tensor):
        (gradient,) = ctx.saved_tensors
        return upstream * gradient, None, None


def _wide(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits in float32 for their sums; float32 and float64 as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _exp_in_place(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log-sum-exp of each row, each row's sum of exponentials after its maximum is taken away)`` of ``(n,
    vocab)`` ``logits``, which are left as those exponentials: nothing else as large is made."""
    top = logits.amax(dim=-1, keepdim=True)
    sums = logits.sub_(top).exp_().sum(dim=-1, keepdim=True)
    return sums[:, 0].log() + top[:, 0], sums


def _predicting(mask: torch.Tensor) -> torch.Tensor:
    """bool ``(B, L - 1)``: the positions of a padded batch whose next token is a real one, in order."""
    return (mask[:, :-1] * mask[:, 1:]).bool()
