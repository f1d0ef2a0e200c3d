"""Profile every head over a corpus from the command line, into a Parquet file that pandas and the app open.

    python -m analysis.profiles.run INPUT --out OUT.parquet [--model NAME] [--backend transformers|scratch]
                               [--device auto|cpu|cuda] [--batch-size N] [--engine local|ray]
                               [--address RAY_ADDRESS] [--actors N]

INPUT is a .txt file, one sentence per line, or a folder of them (every ``*.txt`` inside, in name
order). Sentences stream through the model a chunk at a time; what is kept is running sums per head
(a ``HeadProfiler`` without per-sentence values), never the attention weights, so memory stays flat
as the corpus grows. The table holds the values ``profile_heads`` gives for the same sentences.

Engines:
- ``local``: this process, on ``--device``.
- ``ray``: Ray Data reads the files (``read_text``) and ``map_batches`` sends each batch of lines to
  an actor that loads the model once and returns the batch's partial sums; this process merges them,
  which gives the same sums as one pass. ``--address`` (or ``RAY_ADDRESS``) joins a running
  cluster, where every worker must be able to read INPUT and load the model; without either, a
  local Ray instance is started. With CUDA each actor asks for one GPU; on the CPU each asks for a
  fraction of one, so that Ray's read tasks always find a CPU to run on.

The file's metadata (key ``headlens`` in the Parquet schema) names the model, backend, engine,
sentence count, a SHA-256 of the corpus (the lines profiled, in order, each followed by a newline),
the layout (``layers``, ``heads``), the file format and HeadLens's version.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from models.corpus import clean_lines
from models.errors import HeadLensError

from .corpus import CHUNK, CHUNK_BYTES, chunks, measure_chunk
from .ray import check_model, profile_ray

FORMAT = 1  # the profile file's layout; a file of another format is refused when opened
META_KEY = b"headlens"


def corpus_files(path: Path) -> list[Path]:
    if not path.exists():
        raise HeadLensError(f"{path} does not exist.")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise HeadLensError(f"The folder {path} holds no .txt file.")
        return files
    return [path]


def sentences(files: list[Path]) -> Iterator[str]:
    """Every readable line of ``files``, stripped, in order.

    Lines end where ``str.splitlines`` ends them (as Ray's ``read_text`` does), so both engines
    see the same sentences; a file is read a line at a time, never whole.
    """
    for f in files:
        try:
            with open(f, encoding="utf-8-sig") as handle:
                for line in handle:
                    yield from clean_lines(line.splitlines())
        except UnicodeDecodeError as err:
            raise HeadLensError(f"{f} is not UTF-8 text: save it as UTF-8 and run again.") from err
        except OSError as err:
            raise HeadLensError(f"{f} could not be read: {err.strerror or err}.") from err


def corpus_hash(lines) -> tuple[int, str]:
    """How many lines there are, and the SHA-256 of them in order, each followed by a newline."""
    digest, count = hashlib.sha256(), 0
    for line in lines:
        digest.update(line.encode("utf-8", "surrogatepass") + b"\n")
        count += 1
    return count, digest.hexdigest()


def scan(files: list[Path]) -> tuple[int, str]:
    """How many sentences ``files`` hold, and the SHA-256 of the corpus; HeadLensError when there are none."""
    count, sha256 = corpus_hash(sentences(files))
    if count == 0:
        raise HeadLensError("The corpus has no sentences: every line is empty or unreadable.")
    return count, sha256


def profile_local(model, files: list[Path], *, batch_size: int = 32, progress: Callable[[int], None] | None = None,
                  nlp=None):
    """``(profiler, skipped)``: every head's running sums over the sentences of ``files``, streamed."""
    from ..roles.measure import HeadProfiler

    profiler, skipped = HeadProfiler(nlp, keep_sentences=False), 0
    for chunk in chunks(sentences(files), CHUNK):
        skipped += measure_chunk(model, profiler, chunk, batch_size, progress, CHUNK_BYTES)
    return profiler, skipped


def metadata(*, model: str, backend: str, engine: str, sentences: int, sha256: str, layers: int, heads: int,
             skipped: int = 0, heads_off: list | None = None, causal: bool = False) -> dict:
    """What a profile file records about how it was made (key ``headlens`` of its Parquet schema)."""
    from models import __version__

    return {"format": FORMAT, "headlens": __version__, "model": model, "backend": backend, "engine": engine,
            "sentences": int(sentences), "skipped": int(skipped), "corpus_sha256": sha256,
            "layers": int(layers), "heads": int(heads), "heads_off": [list(map(int, h)) for h in heads_off or []],
            "causal": bool(causal)}


def write_profile(frame, meta: dict, out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(meta).encode()})
    pq.write_table(table, out)


def read_profile(source) -> tuple["pd.DataFrame", dict]:  # noqa: F821 - pandas is imported lazily
    """A saved profile (a path or a binary file object) and its metadata.

    Raises HeadLensError, with a sentence, for a file that is not a HeadLens profile, is of another
    format, or lacks a column this version of HeadLens shows.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..roles.measure import PROFILE_COLUMNS

    try:
        table = pq.read_table(source)
    except FileNotFoundError as err:
        raise HeadLensError(f"There is no file {source}.") from err
    except (pa.ArrowException, OSError) as err:
        raise HeadLensError("That file is not a Parquet file; choose a profile written by "
                         "`python -m analysis.profiles.run`.") from err
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise HeadLensError("That Parquet file is not a HeadLens profile: it has no HeadLens metadata.")
    try:
        meta = json.loads(raw)
        fmt = meta.get("format")
    except (ValueError, AttributeError) as err:
        raise HeadLensError("That profile's HeadLens metadata is damaged; profile the corpus again.") from err
    if fmt != FORMAT:
        raise HeadLensError(f"That profile is of format {fmt}; this HeadLens reads format {FORMAT}. "
                         "Profile the corpus again.")
    missing = [c for c in PROFILE_COLUMNS if c not in table.column_names]
    if missing:
        raise HeadLensError(f"That profile lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing[:5])}"
                         f"{' …' if len(missing) > 5 else ''}; profile the corpus again.")
    try:
        meta["heads_off"] = [[int(layer), int(head)] for layer, head in meta.get("heads_off", [])]
    except (TypeError, ValueError) as err:
        raise HeadLensError("That profile's list of heads switched off is damaged; profile the corpus again.") from err
    meta["causal"] = meta.get("causal") is True
    frame = table.to_pandas()
    layers, heads = meta.get("layers"), meta.get("heads")
    if not isinstance(layers, int) or not isinstance(heads, int) or len(frame) != layers * heads:
        raise HeadLensError("That profile's rows do not match the layers and heads its metadata names; "
                         "profile the corpus again.")
    return frame, meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.profiles.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path, help="a .txt file, one sentence per line, or a folder of them")
    parser.add_argument("--out", type=Path, required=True, help="the Parquet file to write")
    parser.add_argument("--model", default=None, help="a model folder or name (default: the bundled MiniLM)")
    parser.add_argument("--backend", choices=["transformers", "scratch"], default="transformers")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass")
    parser.add_argument("--engine", choices=["local", "ray"], default="local")
    parser.add_argument("--address", default=None, help="a Ray cluster's address (default: RAY_ADDRESS, "
                        "or a local Ray instance)")
    parser.add_argument("--actors", type=int, default=1, help="Ray actors, each with its own copy of the model")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.actors < 1:
        parser.error("--batch-size and --actors take a whole number of at least 1")

    from tqdm import tqdm

    from models import load_model

    try:
        files = corpus_files(args.input)
        total, sha256 = scan(files)
        if not args.out.parent.is_dir():
            raise HeadLensError(f"The folder {args.out.parent} does not exist; make it or choose another --out.")
        if args.engine == "ray":
            check_model(args.model)
        else:
            model = load_model(args.model, backend=args.backend, device=args.device)
        with tqdm(total=total, unit=" sentences", desc="Profiling", file=sys.stderr, smoothing=0.1) as bar:
            if args.engine == "ray":
                profiler, skipped, name, backend = profile_ray(
                    args.model, args.backend, args.device, files, batch_size=args.batch_size,
                    address=args.address, actors=args.actors, chunk=CHUNK, progress=bar.update)
            else:
                bar.set_description(f"Profiling on {model.device}")
                profiler, skipped = profile_local(model, files, batch_size=args.batch_size, progress=bar.update)
                name, backend = model.name, model.backend
        if profiler.n_sentences == 0:
            raise HeadLensError("The model could read none of the corpus's lines.")
        layers, heads = profiler.totals.shape
        meta = metadata(model=name, backend=backend, engine=args.engine, sentences=profiler.n_sentences,
                        sha256=sha256, layers=layers, heads=heads, skipped=skipped)
        frame = profiler.measures().frame()
        write_profile(frame, meta, args.out)
    except HeadLensError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    note = f" ({skipped:,} line{'s' if skipped > 1 else ''} the model could not read {'were' if skipped > 1 else 'was'} left out)" if skipped else ""
    print(f"{meta['sentences']:,} sentences, {len(frame)} heads -> {args.out}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
