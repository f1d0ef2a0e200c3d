"""A sentence's attention as the pages get it, computed once for every session: keyed by everything that
determines it (model, text, causal mask, the heads switched off), and only ever read."""
from __future__ import annotations

import dataclasses


from analysis import head_mask, renormalise_rows
from models import Attention
from models.long import LongAttention

from .models import ModelRef, cached_model
from .shared import shared


def _frozen(att: Attention) -> Attention:
    """``att`` with every weight array read-only, as a value shared by all sessions must be."""
    for part in (att, att.decoder, att.cross):
        if part is not None:
            part.weights.flags.writeable = False
    return att


ATTENTION_BYTES = 512 * 2**20  # attention results kept for every session: one 512-token SmolLM2 text is 283 MB


def _nbytes(att: Attention) -> int:
    return sum(part.weights.nbytes for part in (att, att.decoder, att.cross) if part is not None)


@shared("attention", entries=64, max_bytes=ATTENTION_BYTES, size=_nbytes, owned=True,
        waiting="Computing this attention")
def cached_attention(ref: ModelRef, text: str, causal: bool, heads_off: tuple, moved: bool = False,
                     layers: tuple[int, ...] | None = None) -> Attention:
    """The attention of ``text`` on ``ref``'s model (the last 64 within 512 MiB). ``moved``: each weight scaled by
    what its key sends (``value_norms``, on the from-scratch engine), rows renormalised. ``layers``: only these layers
    (``attend(layers=...)``: the from-scratch engine runs none above them)."""
    model = cached_model(ref)
    mask = head_mask(model, heads_off)
    att = model.attend(text, head_mask=mask, causal=causal, layers=layers)
    if moved:
        norms = cached_model(ref.analysed).value_norms(text, head_mask=mask, causal=causal)
        norms = norms if layers is None else norms[list(layers)]
        att = dataclasses.replace(att, weights=renormalise_rows(norms))
    return _frozen(att)


# the last four long prompts; what they keep is bounded across every session by ``models.long_kept.KEPT`` (a prompt's layers
# go to the budget, the least recently used first, not the prompt, which sessions may be showing)
@shared("long prompt", entries=4, owned=True, waiting="Reading this long prompt")
def long_prompt(ref: ModelRef, text: str, causal: bool, heads_off: tuple) -> LongAttention:
    """``text`` as a ``LongAttention`` on ``ref``'s model (on the from-scratch engine), each layer run when asked."""
    model = cached_model(ref)
    return model.attend_long(text, head_mask=head_mask(model, heads_off), causal=causal)
