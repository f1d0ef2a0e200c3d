"""Our MultiHeadAttention against torch.nn.MultiheadAttention and against a per-head loop.

    python -m bench.bench_mha [--device cpu|cuda]

PyTorch runs in eval mode under inference_mode with need_weights=True and
average_attn_weights=False, so it takes its fused native path; both return per-head weights.
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from bench.common import machine, ratio
from models import MultiHeadAttention
from harness.reference import per_head_loop

SHAPES = [(8, 128, 384, 12), (1, 512, 768, 12)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    dev = torch.device(args.device)
    print(f"MultiHeadAttention, fp32, {machine(dev)}")
    print(f"{'B':>3} {'L':>4} {'E':>4} {'H':>3} | {'scratch ms':>8} {'torch ms':>8} {'ratio':>6} | {'loop ms':>8} {'speed-up':>8}")
    for B, L, E, H in SHAPES:
        torch.manual_seed(0)
        ref = nn.MultiheadAttention(E, H, batch_first=True).to(dev).eval()
        scratch = MultiHeadAttention.from_torch(ref).eval()
        x = torch.randn(B, L, E, device=dev)
        with torch.inference_mode():
            r, t_scratch, t_torch = ratio(lambda: scratch(x, average_attn_weights=False), lambda: ref(x, x, x, need_weights=True,
                                                                     average_attn_weights=False), dev)
            r_loop, _, t_loop = ratio(lambda: scratch(x, average_attn_weights=False), lambda: per_head_loop(scratch, x, x, x), dev, rounds=5)
        print(f"{B:>3} {L:>4} {E:>4} {H:>3} | {t_scratch * 1e3:8.2f} {t_torch * 1e3:8.2f} {r:6.2f} | "
              f"{t_loop * 1e3:8.2f} {1 / r_loop:7.1f}x")


if __name__ == "__main__":
    main()
