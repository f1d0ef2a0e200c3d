"""Training speed and how soon an induction head forms.

    python -m bench.bench_training [--device cpu|cuda] [--seeds 0 1 2]

1. Steps per second at the default size (2 layers x 2 heads, d_model 64, batches of 64 sequences
   of 32 tokens, attention only), over 300 steps after 20 of warm-up, logging as the page does.
2. For each seed: the first logged step (every 20) at which some head's induction score on the
   held-out repeats reaches 0.4, and the seconds it took. Aim: within 60 s on a 2-core CPU.
"""
from __future__ import annotations

import argparse

import torch

from bench.common import machine
from models.training import TrainConfig, train


def steps_per_second(device: str) -> float:
    train(TrainConfig(steps=20), device=device)  # warm-up: kernels, allocator
    run = train(TrainConfig(steps=300, seed=9), device=device)
    return run.steps_per_second()


def time_to_induction(seed: int, device: str, score: float = 0.4, steps: int = 2000) -> tuple[int | None, float | None]:
    """The first logged step some head's induction score reaches ``score``, and the seconds until then."""
    reached: dict[str, float] = {}

    def on_step(step, run):
        if "step" not in reached and run.history[run.history.step == step].induction.max() >= score:
            reached.update(step=step, seconds=run.seconds)

    train(TrainConfig(seed=seed, steps=steps), device=device, on_step=on_step, should_stop=lambda: bool(reached))
    return reached.get("step"), reached.get("seconds")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    a = p.parse_args()
    print(machine(), f"torch threads {torch.get_num_threads()}", f"device {a.device}", sep=" · ")
    print(f"steps per second at the default size: {steps_per_second(a.device):.1f}")
    for seed in a.seeds:
        step, seconds = time_to_induction(seed, a.device)
        print(f"seed {seed}: induction score 0.4 at step {step} after "
              + (f"{seconds:.1f} s" if seconds is not None else "never (2,000 steps)"))


if __name__ == "__main__":
    main()
