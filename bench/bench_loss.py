"""A bundled decoder's next-token loss over Pruning's sentences, from the last hidden states: the from-scratch
engine's ``next_token_sums`` against the textbook (the whole vocabulary's logits at once, ``F.cross_entropy`` and
``argmax``; under autograd, its backward recorded), alternately in one process.

    python -m bench.bench_loss [--model smollm2] [--model gemma3]

Outside autograd (every pruned model's run in the pruning curves) and with its gradient by the states (each
gradient importance of the curve by importance). Checks first that both give the same loss, predictions and
gradient.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from analysis.defaults import DECODER_SAMPLE
from bench.common import machine, ratio
from models import load_model
from models.catalog import bundled
from models.corpus import corpus_sample
from models.language import _predicting


def textbook(stack, h, ids, mask):
    """``(summed cross-entropy, top-1 predictions)`` from the whole vocabulary's logits at once."""
    predicting = _predicting(mask)
    logits = stack.logits(h[:, :-1][predicting])
    return F.cross_entropy(logits, ids[:, 1:][predicting], reduction="sum"), logits.argmax(dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a bundled decoder's key (default: smollm2, then gemma3)")
    keys = ap.parse_args().model or ["smollm2", "gemma3"]
    print(f"# the next-token loss from the last hidden states, {machine('cpu')}")
    print(f"{'model':8} {'positions':>9} {'vocabulary':>10} | {'':10} {'ours ms':>8} {'textbook ms':>11} {'ratio':>6}")
    for key in keys:
        model = load_model(bundled(key).name, backend="scratch")
        sentences = corpus_sample(DECODER_SAMPLE)
        ((_, inputs),) = list(model._padded_batches(sentences, len(sentences), model.max_tokens))
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        with torch.inference_mode():
            h = model._hidden(inputs)
            ours, n, top = model.next_token_sums(h, ids, mask)
            theirs, best = textbook(model.stack, h, ids, mask)
        assert torch.equal(top, best) and abs(float(ours) - float(theirs)) <= 1e-5 * abs(float(theirs))
        h = h.clone()

        def gradient(sums):
            states = h.detach().requires_grad_()
            return torch.autograd.grad(sums(states)[0], states)[0]

        mine = gradient(lambda s: model.next_token_sums(s, ids, mask))
        other = gradient(lambda s: textbook(model.stack, s, ids, mask))
        assert torch.allclose(mine, other, rtol=1e-4, atol=1e-4 * float(other.abs().max()))
        vocab = model.stack.unembedding().shape[0]
        with torch.inference_mode():
            r, a, b = ratio(lambda: model.next_token_sums(h, ids, mask), lambda: textbook(model.stack, h, ids, mask),
                            rounds=7)
        print(f"{key:8} {n:>9} {vocab:>10,} | {'loss':10} {a * 1e3:8.0f} {b * 1e3:11.0f} {r:6.2f}")
        r, a, b = ratio(lambda: gradient(lambda s: model.next_token_sums(s, ids, mask)),
                        lambda: gradient(lambda s: textbook(model.stack, s, ids, mask)), rounds=7)
        print(f"{key:8} {n:>9} {vocab:>10,} | {'gradient':10} {a * 1e3:8.0f} {b * 1e3:11.0f} {r:6.2f}")


if __name__ == "__main__":
    main()
