"""Patching on the default encoder, all-MiniLM-L6-v2: our batched patching against transformers' BertModel run once
per head with a hook, the embedding metric cos(e, answer) - cos(e, distractor).

    python -m bench.bench_encoder_effects [--device cpu|cuda] [--pairs N]

Timed side by side in one process (``common.ratio``): every head of MiniLM patched on the 12-token founding pair
("Which do you like better, coffee or tea?" → "... coffee or juice?") by ``analysis.patch_heads``, all 72 copies in
one run with edits, against 72 transformers forward passes, each with a forward pre-hook on its layer's attention
output projection putting the head's clean slice in place (aims: ours <= 0.3 s, and <= 0.1x theirs). The two
grids are checked equal first.

Then a task of N encoder pairs of each focus (100 by default): its table by attribution patching (one forward and
one backward pass a batch) and by exact patching of every head in every pair.
"""
from __future__ import annotations


import numpy as np
import torch

from analysis.defaults import ENCODER_PAIRS
from analysis.effects import patch_heads
from analysis.tasks.effects import run_task
from analysis.tasks.focus import ENCODER_TASKS
from analysis.tasks.build import make_task
from bench.common import minilm_bench, ratio, timed


def hooked_sweep(hf, tok, pair, device) -> np.ndarray:
    """Every head patched by one transformers forward pass each: the recovered share per head."""
    layers = hf.encoder.layer
    H = hf.config.num_attention_heads
    Dh = hf.config.hidden_size // H

    def embedding(ids, hooks=()):
        handles = [layers[i].attention.output.dense.register_forward_pre_hook(fn) for i, fn in hooks]
        try:
            e = hf(input_ids=ids).last_hidden_state[0].mean(0)
        finally:
            for h in handles:
                h.remove()
        return e / e.norm()

    def ids(text):
        return torch.tensor([tok(text)["input_ids"]], device=device)

    with torch.inference_mode():
        w = embedding(ids(pair.answer)) - embedding(ids(pair.distractor))
        caught = {}
        catch = [(i, lambda m, args, i=i: caught.__setitem__(i, args[0].clone())) for i in range(len(layers))]
        clean = float(embedding(ids(pair.clean), catch) @ w)
        bad_ids = ids(pair.corrupted)
        bad = float(embedding(bad_ids) @ w)
        out = np.empty((len(layers), H))
        for layer in range(len(layers)):
            for head in range(H):
                def put(m, args, layer=layer, head=head):
                    z = args[0].clone()
                    z[..., head * Dh:(head + 1) * Dh] = caught[layer][..., head * Dh:(head + 1) * Dh]
                    return (z,)
                out[layer, head] = (float(embedding(bad_ids, [(layer, put)]) @ w) - bad) / (clean - bad)
    return out


def main() -> None:
    args, ours, hf, tok = minilm_bench(__doc__.split("\n")[0])
    pair = next(iter(ENCODER_PAIRS.values()))

    def mine():
        return patch_heads(ours, pair.clean, pair.corrupted, pair.answer, pair.distractor)["recovered"].to_numpy()

    def theirs():
        return hooked_sweep(hf, tok, pair, args.device)

    gap = np.abs(mine().reshape(6, 12) - theirs()).max()
    print(f"every head of MiniLM patched, {pair.name}: largest difference from transformers' {gap:.1e}")
    r, a, b = ratio(mine, theirs, args.device, rounds=7, repeat=2)
    print(f"  HeadLens {a:.3f} s, transformers one forward per head {b:.3f} s: ratio {r:.3f} "
          f"(aims: <= 0.3 s, <= 0.1x)")

    for name in ENCODER_TASKS:
        task = make_task(ours, name, args.pairs)
        run_task(ours, task.subset(range(4)), method="attribution", residual=False)  # warm
        t_att, effects = timed(lambda: run_task(ours, task, method="attribution", residual=False), args.device)
        t_exact, exact = timed(lambda: run_task(ours, task, method="exact", residual=False), args.device)
        rho = np.corrcoef(effects.heads.mean(0).ravel(), exact.heads.mean(0).ravel())[0, 1]
        print(f"{name}, {len(task)} pairs: attribution patching {t_att:.2f} s, exact {t_exact:.2f} s; "
              f"accuracy {exact.accuracy:.0%}; the two tables' mean effects correlate {rho:.3f}")


if __name__ == "__main__":
    main()
