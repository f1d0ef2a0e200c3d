"""Patching every head of a GPT-2-small-shaped model on the from-scratch engine, against TransformerLens 4.3.

    python -m bench.bench_families [--device cpu|cuda] [--rounds 3] [--tokens 20]

A random GPT-2 (12 layers x 12 heads, 768 wide, GPT-2's 50,257-token vocabulary and 1,024 positions) is saved
to a temporary folder with a byte-level BPE tokenizer. On one ``--tokens``-token pair (the corrupted prompt one
token different, in the middle), each head's output at every position is patched from the clean run into the
corrupted one: HeadLens's ``analysis.effects.patch_heads`` (GPT-2 as a family declaration of the from-scratch
engine) against TransformerLens's ``patching.get_act_patch_attn_head_out_all_pos`` on a ``TransformerBridge`` of
the same weights (its clean cache, the corrupted logits, then its sweep), timed back to back in one process, the
order alternating; aim: HeadLens <= 0.1 x TransformerLens. The two grids of recovered shares are compared.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

os.environ.setdefault("TQDM_DISABLE", "1")  # TransformerLens's sweep draws a bar; read when tqdm is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.common import machine, timed  # noqa: E402


def build(folder: str):
    """A random GPT-2-small-shaped model and a BPE tokenizer over the built-in corpus, saved in ``folder``."""
    import transformers as tf
    from tokenizers import ByteLevelBPETokenizer

    from models.corpus import CORPUS

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=2000, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    spec = json.loads(bpe._tokenizer.to_str())["model"]
    tok = tf.GPT2TokenizerFast(vocab=spec["vocab"], merges=[tuple(m) for m in spec["merges"]],
                               unk_token="<|endoftext|>", bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    torch.manual_seed(0)
    hf = tf.GPT2LMHeadModel(tf.GPT2Config()).eval()  # GPT-2 small's sizes
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return hf, tf.AutoTokenizer.from_pretrained(folder)  # as opened from a folder, which TransformerLens reads


def pair(tok, n: int) -> tuple[str, str, int, int]:
    """A clean and a corrupted prompt of ``n`` tokens each, one word apart in the middle, and two answer tokens."""
    from models.corpus import CORPUS

    words = [w for w in dict.fromkeys(" ".join(CORPUS).split()) if len(tok(" " + w)["input_ids"]) == 1]
    clean = "".join(" " + w for w in words[:n])
    swapped = words[:n]
    swapped[n // 2] = words[n]
    corrupted = "".join(" " + w for w in swapped)
    assert len(tok(clean)["input_ids"]) == len(tok(corrupted)["input_ids"]) == n
    return clean, corrupted, tok(" " + words[n + 1])["input_ids"][0], tok(" " + words[n + 2])["input_ids"][0]


def theirs_sweep(bridge, clean_ids, corrupted_ids, answer: int, distractor: int) -> np.ndarray:
    from transformer_lens import patching

    with torch.inference_mode():
        clean_logits, cache = bridge.run_with_cache(clean_ids)
        bad_logits = bridge(corrupted_ids)
    lo = float(bad_logits[0, -1, answer] - bad_logits[0, -1, distractor])
    hi = float(clean_logits[0, -1, answer] - clean_logits[0, -1, distractor])

    def metric(logits):
        return (logits[0, -1, answer] - logits[0, -1, distractor] - lo) / (hi - lo)

    with torch.inference_mode():
        return torch.as_tensor(patching.get_act_patch_attn_head_out_all_pos(bridge, corrupted_ids, cache, metric)) \
            .double().cpu().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=20)
    args = parser.parse_args()
    from transformer_lens.model_bridge import TransformerBridge

    from analysis.effects import patch_heads
    from models import load_model

    with tempfile.TemporaryDirectory() as folder:
        hf, tok = build(folder)
        hf = hf.to(args.device)
        ours = load_model(folder, backend="scratch", device=args.device)
        bridge = TransformerBridge.boot_transformers(folder, hf_model=hf, tokenizer=tok, device=args.device)
        clean, corrupted, answer, distractor = pair(tok, args.tokens)
        ids = [torch.tensor([tok(t)["input_ids"]], device=args.device) for t in (clean, corrupted)]
        print(f"GPT-2-small-shaped random model ({ours.n_layers} x {ours.n_heads} heads, 768 wide), one "
              f"{args.tokens}-token pair · {machine(args.device)}")

        def mine():
            return patch_heads(ours, clean, corrupted, answer, distractor)["recovered"].to_numpy() \
                .reshape(ours.n_layers, ours.n_heads)

        def theirs():
            return theirs_sweep(bridge, *ids, answer, distractor)

        mine(), theirs()  # warm up
        ratios, t_mine, t_theirs = [], [], []
        for r in range(args.rounds):
            order = [(mine, t_mine), (theirs, t_theirs)]
            if r % 2:
                order.reverse()
            grids = {}
            for fn, times in order:
                t, grids[fn.__name__] = timed(fn, args.device)
                times.append(t)
            ratios.append(t_mine[-1] / t_theirs[-1])
        diff = np.abs(grids["mine"] - grids["theirs"]).max()
        print(f"{'HeadLens (from-scratch engine)':<34} {statistics.median(t_mine):>8.3f} s")
        print(f"{'TransformerLens 4.3 bridge':<34} {statistics.median(t_theirs):>8.3f} s")
        print(f"HeadLens / TransformerLens, median of {args.rounds} rounds: {statistics.median(ratios):.3f} "
              f"(aim <= 0.1); recovered shares differ by at most {diff:.1e}, largest |share| "
              f"{np.abs(grids['theirs']).max():.3f}")


if __name__ == "__main__":
    main()
