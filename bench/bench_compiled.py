"""Compiled programs (``models.compiled``): each built-in program compiled from nothing into an empty cache, then
opened again from it, and checked against Tracr's own model on random inputs.

    python -m bench.bench_compiled [--inputs 50] [--program sort ...]

Prints, per program: its layers and heads, the seconds to compile it (Tracr's compiler, the weights copied, the
folder written, the model opened; Tracr's JAX imported once before, and timed apart), the seconds to open it again
from the cache, and, over ``--inputs`` random inputs of every length: whether every decoded output equals Tracr's
``apply`` (numerical: the largest difference), and the largest difference between our attention and the softmax
of Tracr's ``attn_logits``. Aims: compiling <= 10 s a program on two cores; outputs identical (numerical within
1e-5); attention within 1e-6.
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import numpy as np

from bench.common import machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=50)
    ap.add_argument("--program", action="append")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["HEADLENS_CACHE"] = cache
        from models.compiled import BOS, BUILT_IN, PAD, compiled
        from models.compiled_truth import assembled

        start = time.perf_counter()
        import tracr.compiler.compiling  # noqa: F401 - JAX and Haiku, once per process
        print(f"# compiled programs on {machine('cpu')}; Tracr and JAX imported in "
              f"{time.perf_counter() - start:.1f} s")
        print(f"{'program':<15} {'layers':>6} {'heads':>5} {'compile s':>9} {'reopen s':>8} {'outputs':>12} "
              f"{'attention':>10}")
        for name in args.program or list(BUILT_IN):
            p = BUILT_IN[name]
            start = time.perf_counter()
            model = compiled(name, device="cpu")
            first = time.perf_counter() - start
            start = time.perf_counter()
            model = compiled(name, device="cpu")
            again = time.perf_counter() - start
            tracr, _ = assembled(p.make(), p.vocab, p.max_seq_len, p.causal, BOS, PAD)
            rng, same, value, weights = random.Random(0), True, 0.0, 0.0
            for k in range(args.inputs):
                seq = [rng.choice(p.vocab) for _ in range(1 + k % p.max_seq_len)]
                want, got = tracr.apply([BOS, *seq]), model.apply(" ".join(map(str, seq)))
                if model.config.numerical:
                    value = max(value, float(np.abs(np.subtract(got[1:], want.decoded[1:])).max()))
                else:
                    same &= got == list(want.decoded)
                att = model.attend(" ".join(map(str, seq))).weights
                for layer, logits in enumerate(want.attn_logits):
                    lg = np.asarray(logits, dtype=np.float64)[0]
                    e = np.exp(lg - lg.max(-1, keepdims=True))
                    weights = max(weights, float(np.abs(e / e.sum(-1, keepdims=True) - att[layer]).max()))
            outputs = f"max {value:.1e}" if model.config.numerical else ("identical" if same else "DIFFER")
            print(f"{name:<15} {model.n_layers:>6} {model.n_heads:>5} {first:>9.1f} {again:>8.2f} {outputs:>12} "
                  f"{weights:>10.1e}")


if __name__ == "__main__":
    main()
