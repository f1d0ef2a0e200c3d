"""What a pair's answer and distractor are read as: a token (an id, or a string the tokenizer reads as one), a probe
text, and the probe texts' sentence embeddings."""
from __future__ import annotations

import numpy as np
import torch

from models import HeadLensError
from models.run import device_of, stack_of


def answer_token(model, answer, role: str = "answer") -> int:
    """The token id of ``answer``: an id, or a string the tokenizer reads as exactly one token (with its
    leading space, as " Mary"); a sentence naming the pieces of one it reads as several."""
    tok = model.tokenizer
    vocab = len(tok)
    if isinstance(answer, (int, np.integer)) and not isinstance(answer, bool):
        if not 0 <= int(answer) < vocab:
            raise HeadLensError(f"The {role} token id {int(answer)} is not in the vocabulary (0 to {vocab - 1}).")
        return int(answer)
    if not isinstance(answer, str) or not answer:
        raise HeadLensError(f"Give the {role} as a token: a string such as \" Mary\" (with its leading space), "
                            "or a token id.")
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = " ".join(repr(p) for p in tok.convert_ids_to_tokens(ids)) or "nothing"
        raise HeadLensError(f"The {role} {answer!r} is {len(ids)} tokens to this tokenizer ({pieces}); give a "
                            "string it reads as one token, or a token id.")
    return int(ids[0])


def token_text(model, token: int) -> str:
    """How a token reads, decoded (" Mary")."""
    return model.tokenizer.decode([int(token)])


def probe_text(value, role: str) -> str:
    """An encoder's answer or distractor: a text to embed; a sentence for anything else."""
    if not isinstance(value, str) or not value.strip():
        raise HeadLensError(f"On an encoder the {role} is a text (a word or a sentence) whose embedding the "
                            "prompt's is compared with; give it as text.")
    return value.strip()


def two(a, d, what: str) -> None:
    if a == d:
        raise HeadLensError(f"The answer and the distractor are the same {what}; patching compares two.")


@torch.inference_mode()
def unit_embeddings(model, texts, stack=None) -> torch.Tensor:
    """``(k, E)``: each text's sentence embedding as ``EmbeddingCosine`` pools it (the mean of the final hidden
    states over its tokens, special ones included), at unit length, in the stack's own dtype; ``stack``: ``model``'s,
    where the caller holds it."""
    stack = stack if stack is not None else stack_of(model, "A sentence embedding is read")
    ids = [model.tokenize(text, verbose=False)["input_ids"] for text in texts]
    out = [None] * len(texts)
    for n in sorted({len(i) for i in ids}):  # the texts of one length in one run, no padding
        same = [k for k, i in enumerate(ids) if len(i) == n]
        x, _ = stack.run_layers(stack.embed(torch.tensor([ids[k] for k in same], device=device_of(stack))),
                                need_weights=False)
        e = stack.finish(x).mean(1)
        for k, row in zip(same, e / e.norm(dim=-1, keepdim=True)):
            out[k] = row
    return torch.stack(out)
