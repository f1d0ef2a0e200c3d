"""Queries & keys: every head's picture over a corpus, computed once per model and corpus for every session."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby


from analysis.qk_attribution.pictures import iter_qk_heads, qk_embeddings
from models import AttentionModel
from models.corpus import CORPUS
from viz.qk import QkCanvas

from .models import ModelRef, cached_model
from .progress import Bar
from .shared import First, Warm, shared


@dataclass(frozen=True)
class Pictures:
    """Every head's picture (``{(layer, head): frame}``) and their thumbnails as one PNG with its pitch,
    drawn once with them rather than on every rerun."""

    frames: dict
    png: tuple[bytes, int]


def _frames_bytes(value: Pictures) -> int:
    return sum(int(f.memory_usage(index=False).sum()) for f in value.frames.values()) + len(value.png[0])


def first_pictures(ref: ModelRef) -> list[tuple]:
    """What the page draws first: every head of the model on the from-scratch engine over the built-in corpus, fitted."""
    scratch = ref.analysed
    return [(scratch, tokens_within(cached_model(scratch), list(CORPUS)), "fitted")]


def _fewer(ref: ModelRef, sentences: list[str], method: str) -> tuple:
    return ref, sentences[:max(1, len(sentences) // FIRST_SHARE)], method


FIRST_SHARE = 8  # the first form draws every head over the first eighth of the sentences


@shared("queries and keys", entries=8, max_bytes=512 * 2**20, size=_frames_bytes, waiting="Drawing every head's picture",
        warm=Warm(7, first_pictures), first=First(_fewer, f"every head over the first 1/{FIRST_SHARE} of the sentences"))
def pictures(ref: ModelRef, sentences: list[str], method: str) -> Pictures:
    """``qk_embedding`` of every head of ``ref``'s model over ``sentences``, with a progress bar; the heads drawn so
    far are published a layer at a time while they are computed (a page shows them with ``partial=``)."""
    return _compute(cached_model(ref), sentences, method)


def _compute(model: AttentionModel, sentences: list[str], method: str) -> Pictures:
    """Every head's picture, published a layer at a time (``Pictures`` of the heads drawn so far) for the page
    to show while the rest is computed."""
    count = model.n_layers * model.n_heads
    bar = Bar(f"Reading the queries and keys of {len(sentences):,} sentences, then drawing {count} heads")
    frames, canvas = {}, QkCanvas(model.n_layers, model.n_heads)

    def reading(done: int, total: int) -> None:  # each group of layers is read, then its heads drawn
        bar(len(frames) * total + done, count * total)

    for _, read in groupby(iter_qk_heads(model, sentences, progress=reading), key=lambda item: item[0][0]):
        qks = [qk for _, qk in read]  # a layer's heads, their planes fitted side by side
        for qk, frame in zip(qks, qk_embeddings(qks, method=method)):
            frames[qk.layer, qk.head] = frame
            canvas.paint(qk.layer, qk.head, frame)
        bar(len(frames), count)
        if len(frames) < count:
            bar.partial(lambda: Pictures(dict(frames), canvas.png()))  # a PNG only for a page that waits
    bar.empty()
    return Pictures(frames, canvas.png())


QK_TOKENS = 12_000  # the most tokens of a corpus one page's pictures cover; more are left out with a note


def _within(model: AttentionModel, sentences: list[str]) -> tuple[int, int]:
    """How many of the first sentences fit in ``QK_TOKENS`` tokens, and their tokens."""
    total, keep = 0, 0
    for n in model.token_counts(sentences):
        if total + n > QK_TOKENS and keep:
            break
        total, keep = total + n, keep + 1
    return keep, total


def tokens_within(model: AttentionModel, sentences: list[str]) -> list[str]:
    """The first sentences within ``QK_TOKENS`` tokens."""
    return sentences[:_within(model, sentences)[0]]
