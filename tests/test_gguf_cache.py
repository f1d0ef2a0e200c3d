"""The cache of converted GGUF files: two processes that ask for the same file at once (two servers, a server and
a worker) convert it once; the second waits for the first and reads its folder."""
import multiprocessing
import struct
import time
from pathlib import Path

from models import gguf


def _fake_convert(path, out, progress=None):
    """A conversion that takes a while and leaves a line in a log per run."""
    with open(path.with_suffix(".log"), "a") as log:
        log.write("converted\n")
    time.sleep(0.5)
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"weights")


def _ask(path, cache, folders):
    import os

    os.environ["HEADLENS_CACHE"] = str(cache)
    gguf.convert = _fake_convert
    folders.put(str(gguf.gguf_folder(path)))


def test_two_processes_asking_for_one_file_at_once_convert_it_once(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))  # a header that holds nothing
    fork = multiprocessing.get_context("fork")
    folders = fork.Queue()
    asking = [fork.Process(target=_ask, args=(path, tmp_path / "cache", folders)) for _ in range(2)]
    for p in asking:
        p.start()
    for p in asking:
        p.join(60)
    assert [p.exitcode for p in asking] == [0, 0]
    assert path.with_suffix(".log").read_text() == "converted\n"
    made = {folders.get(timeout=5) for _ in asking}
    assert len(made) == 1
    folder = made.pop()
    assert Path(folder).parent == tmp_path / "cache" / gguf.CONVERTED
    assert open(f"{folder}/model.safetensors", "rb").read() == b"weights"
    assert not list((tmp_path / "cache" / gguf.CONVERTED).glob("*.partial"))  # no half-made folder left
