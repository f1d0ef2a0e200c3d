"""Effects over a task of many pairs on SmolLM2, against TransformerLens 4.3 pair by pair.

    python -m bench.bench_tasks [--pairs 100] [--theirs 3] [--device cpu|cuda] [--memory 1000]

On ``--pairs`` indirect-object pairs (seed 0): attribution patching of every head (aim: <= 20 s on two cores),
then exact patching of every head at every position (``analysis.tasks.effects.run_task``, pairs in batches of one
length, each copy running only the tokens after those its prompts share), timed in the same process as
TransformerLens's ``patching.get_act_patch_attn_head_out_all_pos`` on a ``TransformerBridge`` of the same
weights, one pair at a time (its clean cache, then its sweep), over the first ``--theirs`` pairs: its time per
pair times ``--pairs`` is set against HeadLens's (aim: HeadLens <= 0.05 x theirs), and the two grids of those pairs are
compared. ``--theirs 0`` leaves TransformerLens out.

``--memory N``: the memory of attribution patching over 100 and over N pairs, each in a fresh process (resident,
with the model loaded, and the most while the pairs run): the pairs stream in batches, and what is kept grows by
a few floats per head and pair.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

from bench.common import machine, timed

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def theirs_per_pair(folder: str, model, task, k: int, device: str) -> tuple[float, np.ndarray]:
    """Seconds TransformerLens takes per pair (clean cache and every head patched), and its recovered grids."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # TransformerLens's sweep draws a bar per pair
    import transformers as tf
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge

    hf = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval().to(device)
    bridge = TransformerBridge.boot_transformers(folder, hf_model=hf, tokenizer=model.tokenizer, device=device)
    grids, seconds = [], 0.0
    for i, pair in enumerate(task.pairs[:k]):
        clean = torch.tensor([pair.clean_ids], device=device)
        corrupted = torch.tensor([pair.corrupted_ids], device=device)

        def sweep():
            with torch.inference_mode():
                clean_logits, cache = bridge.run_with_cache(clean)
                bad_logits = bridge(corrupted)
            lo = float(bad_logits[0, -1, pair.answer] - bad_logits[0, -1, pair.distractor])
            hi = float(clean_logits[0, -1, pair.answer] - clean_logits[0, -1, pair.distractor])

            def metric(logits):
                return (logits[0, -1, pair.answer] - logits[0, -1, pair.distractor] - lo) / (hi - lo)

            with torch.inference_mode():
                return patching.get_act_patch_attn_head_out_all_pos(bridge, corrupted, cache, metric)

        if i == 0:
            sweep()  # warm up
        t, grid = timed(sweep, device)
        seconds += t
        grids.append(torch.as_tensor(grid).double().cpu().numpy())
    return seconds / k, np.stack(grids)


def peak_mib(pairs: int, device: str) -> tuple[float, float]:
    """A fresh process running attribution patching over ``pairs`` ioi pairs: its resident memory (MiB) once the
    model has run two pairs (every weight read), and the most it reaches while the pairs run (sampled every 20 ms)."""
    code = f"""
import json, threading, time, psutil
from models import load_model
from analysis.tasks.build import ioi
from analysis.tasks.effects import run_task
m = load_model({NAME!r}, backend='scratch', device={device!r})
task = ioi(m, n={pairs})
run_task(m, task.subset(range(2)), method='attribution', residual=False)  # every weight read once
me, peak, done = psutil.Process(), [0], threading.Event()
rest = me.memory_info().rss
def watch():
    while not done.is_set():
        peak[0] = max(peak[0], me.memory_info().rss)
        time.sleep(0.02)
t = threading.Thread(target=watch); t.start()
run_task(m, task, method='attribution', residual=False)
done.set(); t.join()
print(json.dumps([rest / 2**20, peak[0] / 2**20]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rest, peak = json.loads(out.stdout.strip().splitlines()[-1])
    return rest, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--theirs", type=int, default=3, help="pairs TransformerLens runs (0: none)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=NAME, help="a Llama folder shaped as SmolLM2 (default: SmolLM2 itself)")
    parser.add_argument("--memory", type=int, default=0, help="also the peak memory over this many pairs")
    args = parser.parse_args()
    from analysis.tasks.effects import run_task, table
    from analysis.tasks.build import ioi
    from models import head_label, load_model
    from models.files import resolve_model_dir

    model = load_model(args.model, backend="scratch", device=args.device)
    task = ioi(model, n=args.pairs, seed=0)
    print(f"{model.name}, {model.n_layers} x {model.n_heads} heads · {machine(args.device)} · "
          f"{len(task)} ioi pairs of {min(map(len, task.pairs))} to {max(map(len, task.pairs))} tokens")
    run_task(model, task.subset(range(2)), method="exact", residual=False)  # warm up
    t_attr, attr = timed(lambda: run_task(model, task, method="attribution", residual=False), args.device)
    print(f"attribution patching of every head over {len(task)} pairs: {t_attr:.1f} s (aim <= 20 s)")
    t_exact, exact = timed(lambda: run_task(model, task, method="exact", residual=False), args.device)
    frame = table(exact)
    top = frame.sort_values("mean", ascending=False).head(5)
    print(f"exact patching of every head over {len(task)} pairs: {t_exact:.1f} s ({t_exact / len(task):.2f} s a pair); "
          f"accuracy {exact.accuracy:.2f}; top heads " + ", ".join(f"{head_label(r.layer, r.head)} {r.mean:.2f} "
                                                                f"[{r.low:.2f}, {r.high:.2f}]" for r in top.itertuples()))
    est, ex = attr.recovered().reshape(-1), exact.recovered().reshape(-1)
    print(f"attribution against exact over every head and pair: Pearson {np.corrcoef(est, ex)[0, 1]:.3f}")
    if args.theirs:
        folder = str(resolve_model_dir(args.model)[0])
        per_pair, grids = theirs_per_pair(folder, model, task, args.theirs, args.device)
        diff = np.abs(grids - exact.recovered()[:args.theirs]).max()
        theirs = per_pair * len(task)
        print(f"TransformerLens 4.3 get_act_patch_attn_head_out_all_pos: {per_pair:.1f} s a pair over "
              f"{args.theirs} pairs, {theirs:.0f} s for {len(task)}; HeadLens / theirs {t_exact / theirs:.3f} "
              f"(aim <= 0.05); largest difference of the recovered shares {diff:.1e}")
    if args.memory:
        for n in (100, args.memory):
            rest, peak = peak_mib(n, args.device)
            print(f"attribution patching over {n} pairs: {rest:.0f} MiB resident with the model run once, at most "
                  f"{peak:.0f} MiB while the pairs run (+{peak - rest:.0f} MiB)")


if __name__ == "__main__":
    main()
