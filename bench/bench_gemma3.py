"""Gemma 3 270M: how long it takes to open, our Gemma 3 stack against transformers' eager one, and memory.

    python -m bench.bench_gemma3 [--device cpu|cuda] [--rounds N]

Loads, each in a new process, timing ``load_model`` alone: the first with an empty cache (the chunks
joined and checked, the GGUF read, dequantized and written as safetensors), then later ones on each
engine. Aims: first load <= 45 s, later loads <= 8 s. The file's header read as the conversion reads it against
the gguf package's reader, alternately in this process.

Speed, both engines returning every attention weight (``attend``), timed alternately in one process:
64 sentences of about 20 tokens as padded batches, and one 1,000-token text (past the 512-token window
of the sliding layers). Aim: HeadLens / transformers <= 1.0. Then the peak resident memory of one
1,000-token ``attend`` above the loaded model, each engine in a fresh process (the bound: 512 MiB).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

from bench.bench_encoder import sentences
from bench.bench_smollm2 import load_seconds, text_of
from bench.common import machine, ratio

NAME = "google/gemma-3-270m"
TOKENS = 1000
PEAK = r"""
import json, sys
from models import load_model
from bench.bench_smollm2 import text_of

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

model = load_model(sys.argv[1], backend=sys.argv[2], device=sys.argv[3])
text = text_of(model, int(sys.argv[4]))
model.attend("warm up")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size reset to the current one
before = rss("VmRSS:")
res = model.attend(text)
print(json.dumps({"peak": rss("VmHWM:") - before, "result": res.weights.nbytes, "tokens": len(res.tokens)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(f"# Gemma 3 270M on {machine(a.device)}")
    with tempfile.TemporaryDirectory() as cache:
        first = load_seconds("scratch", a.device, cache, name=NAME)
        later = {b: min(load_seconds(b, a.device, cache, name=NAME) for _ in range(3)) for b in ("scratch", "transformers")}
    print(f"first load (empty cache, from-scratch engine): {first:.1f} s   aim <= 45 s   {'met' if first <= 45 else 'NOT met'}")
    from models.gguf import _gguf_tensors, bundled_file

    path = bundled_file(NAME)

    def package_reader():
        from gguf import GGUFReader

        GGUFReader(str(path))

    r, mine, other = ratio(lambda: _gguf_tensors(path), package_reader, rounds=3, repeat=1, warmup=1)
    print(f"the file's header and tensor table: HeadLens {mine:.2f} s, the gguf package's reader {other:.2f} s "
          f"(ratio {r:.3f}, alternately)")
    for backend, seconds in later.items():
        print(f"later load, {backend} engine, first thing in a new process (best of 3): {seconds:.1f} s   aim <= 8 s   "
              f"{'met' if seconds <= 8 else 'NOT met'}")

    from models import load_model

    scratch, theirs = (load_model(NAME, backend=b, device=a.device) for b in ("scratch", "transformers"))
    batch, text = sentences(64), text_of(scratch, TOKENS)
    print("workload              HeadLens s   transformers s   ratio (<= 1.0 aimed)")
    for label, work in (("64 x ~20 tokens", batch), (f"1 x {scratch.token_counts([text])[0]} tokens", text)):
        r, mine, other = ratio(lambda: scratch.attend(work), lambda: theirs.attend(work), a.device,
                               rounds=a.rounds, repeat=1, warmup=1)
        print(f"{label:<20} {mine:8.3f} {other:15.3f}   {r:.2f}")
    print(f"\nPeak memory of one {TOKENS}-token attend above the loaded model (fresh process; bound 512 MiB):")
    for backend in ("scratch", "transformers"):
        out = subprocess.run([sys.executable, "-c", PEAK, NAME, backend, a.device, str(TOKENS)], capture_output=True,
                             text=True, check=True)
        m = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {backend:<13} {m['peak'] / 2**20:7.1f} MiB (its weights {m['result'] / 2**20:.1f} MiB, "
              f"{m['tokens']} tokens)   {'within' if m['peak'] <= 512 * 2**20 else 'PAST'} 512 MiB")


if __name__ == "__main__":
    main()
