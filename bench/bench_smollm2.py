"""SmolLM2-135M-Instruct: how long it takes to open, and our Llama engine against transformers'.

    python -m bench.bench_smollm2 [--device cpu|cuda] [--rounds N]

Loads, each in a new process, timing ``load_model`` alone: the first one with an empty cache (the
GGUF file read, dequantized and written as safetensors), then later ones for each engine, both as
the first thing the process does (transformers' Llama modules imported on the way) and in a
server that has already opened the default model. Aims: first load <= 15 s, later loads <= 5 s.

Speed, both engines returning every attention weight (``attend``, which also splits the batch into
results), timed alternately in one process: 64 sentences of about 20 tokens as padded batches, and
one 512-token text. Aim: HeadLens / transformers <= 1.0.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

from bench.bench_encoder import sentences
from bench.common import machine, ratio

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
LOAD = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
from models import load_model
if {server!r}:
    load_model()  # as in the app's server, where the sidebar has opened the default model
start = time.perf_counter()
load_model({name!r}, backend={backend!r}, device={device!r})
print(json.dumps(time.perf_counter() - start))
"""


def load_seconds(backend: str, device: str, cache: str, server: bool = False, name: str = NAME) -> float:
    code = LOAD.format(name=name, backend=backend, device=device, server=server)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "HEADLENS_CACHE": cache, "HF_HUB_OFFLINE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def text_of(model, n_tokens: int) -> str:
    """The longest run of the benchmark's sentences that the model reads as at most ``n_tokens`` tokens."""
    words = " ".join(sentences(64) * 4).split()
    low, high = 1, len(words)
    while low < high:  # the most words within n_tokens
        mid = (low + high + 1) // 2
        low, high = (mid, high) if model.token_counts([" ".join(words[:mid])])[0] <= n_tokens else (low, mid - 1)
    text = " ".join(words[:low])
    assert model.token_counts([text])[0] >= n_tokens - 2, "the sentences ran out"
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(f"# SmolLM2-135M-Instruct on {machine(a.device)}")
    with tempfile.TemporaryDirectory() as cache:
        first = load_seconds("scratch", a.device, cache)
        later = {(b, server): min(load_seconds(b, a.device, cache, server) for _ in range(3))
                 for b in ("scratch", "transformers") for server in (False, True)}
    print(f"first load (empty cache, from-scratch engine): {first:.1f} s   aim <= 15 s   {'met' if first <= 15 else 'NOT met'}")
    for (backend, server), seconds in later.items():
        where = "in a server that has opened the default model" if server else "first thing in a new process"
        print(f"later load, {backend} engine, {where} (best of 3): {seconds:.1f} s   aim <= 5 s   "
              f"{'met' if seconds <= 5 else 'NOT met'}")

    from models import load_model

    scratch, theirs = (load_model(NAME, backend=b, device=a.device) for b in ("scratch", "transformers"))
    batch, text = sentences(64), text_of(scratch, 512)
    print("workload              HeadLens s   transformers s   ratio (<= 1.0 aimed)")
    for label, work in (("64 x ~20 tokens", batch), (f"1 x {scratch.token_counts([text])[0]} tokens", text)):
        r, mine, other = ratio(lambda: scratch.attend(work), lambda: theirs.attend(work), a.device,
                               rounds=a.rounds, repeat=1, warmup=1)
        print(f"{label:<20} {mine:8.3f} {other:15.3f}   {r:.2f}")


if __name__ == "__main__":
    main()
