"""Timing helpers: two contenders measured alternately in one process, so machine noise hits both."""
from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time

import torch


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device="cpu"):
    """``(seconds, value)`` of one call of ``fn``, the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    value = fn()
    sync(device)
    return time.perf_counter() - start, value


def best_time(fn, device="cpu", repeat: int = 3) -> float:
    """Shortest wall time of ``repeat`` calls, in seconds."""
    times = []
    for _ in range(repeat):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return min(times)


def ratio(scratch, theirs, device="cpu", rounds: int = 11, repeat: int = 3, warmup: int = 2):
    """Median over rounds of time(HeadLens) / time(theirs), each round timing both back to back.

    Returns (ratio, ours_seconds, theirs_seconds) with the medians of each side.
    """
    for _ in range(warmup):
        scratch()
        theirs()
    mine, other, ratios = [], [], []
    for r in range(rounds):
        pair = [(scratch, mine), (theirs, other)]
        if r % 2:
            pair.reverse()
        for fn, out in pair:
            out.append(best_time(fn, device, repeat))
        ratios.append(mine[-1] / other[-1])
    return statistics.median(ratios), statistics.median(mine), statistics.median(other)


def machine(device="cpu") -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}"
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def memory_mib(*fields: str, pid: int | str = "self") -> float:
    """This process's memory in MiB (or process ``pid``'s): ``Pss`` (each page it maps counted once, however many of its mappings
    share it: two engines mapping one weights file count it once) or other fields of ``/proc/self/smaps_rollup``
    (``Pss_Anon:``), or fields of ``/proc/self/status`` such as ``VmRSS:`` (which counts such a page once per
    mapping) or ``RssAnon:``; with several fields, the first minus the others, read at once."""
    fields = fields or ("Pss:",)
    found = {}
    try:
        for line in open(f"/proc/{pid}/smaps_rollup" if fields[0].startswith("Pss") else f"/proc/{pid}/status"):
            name = line.split(maxsplit=1)[0] if line.strip() else ""
            if name in fields:
                found[name] = int(line.split()[1]) / 1024
    except OSError:
        pass
    if len(found) < len(fields):
        return float("nan")
    return found[fields[0]] - sum(found[f] for f in fields[1:])


class PeakMemory:
    """The highest ``memory_mib()`` seen while it runs, sampled in a thread: ``highest`` over the whole run,
    ``peak`` since the last ``reset()``. Reading ``Pss`` walks every mapping (24 ms in a process holding Gemma 3,
    and page faults wait meanwhile), so it is read once a second and the anonymous memory, where the
    computations' temporaries live, every 50 ms: each sample is the last ``Pss`` of the rest plus it."""

    def __init__(self, every: float = 0.05, full_every: int = 20, pid: int | str = "self"):
        import threading

        self.every, self.full_every, self._stop, self.pid = every, full_every, threading.Event(), pid
        self.peak = self.highest = 0.0
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _now(self) -> float:
        self._rest = memory_mib("Pss:", "Pss_Anon:", pid=self.pid)  # one walk of the mappings
        return self._rest + memory_mib("RssAnon:", pid=self.pid)

    def _sample(self) -> None:
        n = 0
        while not self._stop.wait(self.every):
            n += 1
            now = self._now() if n % self.full_every == 0 else self._rest + memory_mib("RssAnon:", pid=self.pid)
            self.peak, self.highest = max(self.peak, now), max(self.highest, now)

    def reset(self) -> float:
        """The peak so far, and a new one started from now."""
        now = self._now()
        peak, self.peak = max(self.peak, now), now
        self.highest = max(self.highest, peak)
        return peak

    def __enter__(self):
        self.peak = self.highest = self._now()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def minilm_bench(description: str):
    """A bench on the default encoder: its command line (``--device``, ``--pairs``, 100 by default), the machine
    printed, and all-MiniLM-L6-v2 on both sides: ``(args, ours on the from-scratch engine, transformers' BertModel
    (eager), its tokenizer)``."""
    import argparse

    import transformers as tf

    from models import load_model
    from models.files import default_model_dir

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pairs", type=int, default=100)
    args = parser.parse_args()
    print(f"# {machine(args.device)}")
    folder = default_model_dir()
    hf = tf.AutoModel.from_pretrained(folder, attn_implementation="eager").eval().to(args.device)
    return args, load_model(backend="scratch", device=args.device), hf, tf.AutoTokenizer.from_pretrained(folder)


def peak_in_fresh_process(setup: str, run: str) -> tuple[float, float]:
    """A fresh Python process running ``setup``, then ``run`` (source code): its resident memory (MiB) once ``setup``
    has run, and the most it held while ``run`` ran (sampled every 20 ms)."""
    code = f"""{setup}
import json, threading, time, psutil
me = psutil.Process()
rest = me.memory_info().rss
peak, done = [rest], threading.Event()
def watch():
    while not done.is_set():
        peak[0] = max(peak[0], me.memory_info().rss)
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()
{run}
done.set()
print(json.dumps([rest / 2**20, peak[0] / 2**20]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))
