"""Timing helpers: two contenders measured alternately in one process, so machine noise hits both."""
from __future__ import annotations

import platform
import statistics
import time

import torch


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


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


def ratio(ours, theirs, device="cpu", rounds: int = 11, repeat: int = 3, warmup: int = 2):
    """Median over rounds of time(ours) / time(theirs), each round timing both back to back.

    Returns (ratio, ours_seconds, theirs_seconds) with the medians of each side.
    """
    for _ in range(warmup):
        ours()
        theirs()
    mine, other, ratios = [], [], []
    for r in range(rounds):
        pair = [(ours, mine), (theirs, other)]
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
