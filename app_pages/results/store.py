"""Results kept on disk across restarts: what a server computes once for a bundled model (its corpus
profile, its queries-and-keys pictures, its head importance), found again after a restart instead of
recomputed.

A result is filed under the model's digest (its weights and config), the code's digest (HeadLens's
own sources: a change to any of them makes every stored result stale) and a key naming the result
and its inputs (the corpus's SHA-256 among them). Files are written whole or not at all, and a file
that cannot be read is removed and recomputed. The store is HeadLens's own folder under its cache
(``HEADLENS_CACHE``); it holds pickles, so nothing else should write there.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import shutil
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("analysis", "app_pages", "models", "viz")  # the packages whose code decides what a stored result holds


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 (first 16 hex digits) of HeadLens's analysis, model and figure sources."""
    digest = hashlib.sha256()
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=16)
def _folder_digest(folder: str, stamp: tuple) -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(folder).iterdir()):
        if path.is_file() and path.suffix in (".json", ".safetensors", ".txt", ".model"):
            digest.update(path.name.encode())
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def folder_digest(folder: str | Path) -> str:
    """SHA-256 (first 16 hex digits) of a model folder's weights, config and tokenizer files; read once per
    process while the files are unchanged."""
    folder = Path(folder)
    stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file())
    return _folder_digest(str(folder), stamp)


class Store:
    """Results of one model, in ``root / model digest / code digest``."""

    def __init__(self, root: Path, model_digest: str):
        self.folder = Path(root) / model_digest / code_digest()

    def path(self, key: str) -> Path:
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.pkl"

    def load(self, key: str):
        """The value stored under ``key``, or None (never stored, or unreadable: then removed)."""
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            with open(path, "rb") as f:
                stored_key, value = pickle.load(f)
        except Exception:  # noqa: BLE001 - a truncated or foreign file is recomputed, whatever broke it
            path.unlink(missing_ok=True)
            return None
        return value if stored_key == key else None

    def save(self, key: str, value) -> Path | None:
        """Write ``value`` under ``key`` (whole or not at all); None when the folder cannot be written."""
        path = self.path(key)
        work = path.with_name(f"{path.name}.{os.getpid()}.partial")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(work, "wb") as f:
                pickle.dump((key, value), f, protocol=pickle.HIGHEST_PROTOCOL)
            work.rename(path)
        except OSError:
            work.unlink(missing_ok=True)
            return None
        return path

    def drop_stale(self) -> int:
        """Remove the model's results stored by other versions of the code, which no run reads again; how many
        folders went."""
        gone = 0
        for folder in self.folder.parent.glob("*"):
            if folder.is_dir() and folder != self.folder:
                shutil.rmtree(folder, ignore_errors=True)
                gone += 1
        return gone

    def size(self) -> int:
        """Bytes the model's stored results take on disk."""
        return sum(p.stat().st_size for p in self.folder.glob("*.pkl")) if self.folder.is_dir() else 0
