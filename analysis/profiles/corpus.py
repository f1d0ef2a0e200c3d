"""One pass of a model over a corpus, a chunk of sentences at a time: what a profile here and one on Ray share."""
from __future__ import annotations

from collections.abc import Callable, Iterator

from models.errors import HeadLensError

CHUNK = 512  # sentences read at a time (and lines in one Ray batch)
CHUNK_BYTES = 256 * 2**20  # attention weights held at once: fewer sentences of a chunk when they are long


def chunks(items: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def readable_by(model, texts: list[str]) -> tuple[list[str], list[int]]:
    """The texts the model can read, and their token counts; a text of characters its tokenizer drops
    (a lone accent for an uncased model) is left out."""
    try:
        return texts, model.token_counts(texts)
    except HeadLensError:
        kept = []
        for t in texts:
            try:
                model.token_counts([t])
                kept.append(t)
            except HeadLensError:
                pass
        return kept, (model.token_counts(kept) if kept else [])


def measure_chunk(model, profiler, texts: list[str], batch_size: int,
                  progress: Callable[[int], None] | None = None, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Run ``texts`` through ``model`` and add them to ``profiler``, at most ``chunk_bytes`` of
    attention weights at a time; returns how many texts the model could not read."""
    kept, lengths = readable_by(model, texts)
    group: list[str] = []
    size = 0
    for text, n in zip(kept, lengths):
        cost = n * n * model.bytes_per_token_pair
        if group and size + cost > chunk_bytes:
            profiler.add(model.attend(group, batch_size=batch_size))
            if progress is not None:
                progress(len(group))
            group, size = [], 0
        group.append(text)
        size += cost
    if group:
        profiler.add(model.attend(group, batch_size=batch_size))
    if progress is not None:
        progress(len(group) + len(texts) - len(kept))
    return len(texts) - len(kept)
