"""Why a head attends there, on SmolLM2: how long a score's split takes beside the model's own forward pass, the
task form, and what the splits find.

    python -m bench.bench_qk_attribution [--device cpu|cuda] [--tokens 256] [--pairs 50] [--prompts 50]

- One head, one query, every key of a ``--tokens``-token prompt split over every (query-side, key-side) writer pair
  (SmolLM2: 301 writers a side, 91,204 pairs a key), the weights without each of the 10 largest writers of each
  side run too: its time beside one forward pass of the same prompt through the from-scratch engine (aim: the split within 2 s
  on two cores).
- The task form: L23 H3's END → S2 score split on every clean and corrupted prompt of ``--pairs`` indirect-object
  pairs, and L18 H6's END → FIRST on as many induction pairs; each one's top writers per side.
- Induction heads' keys: over ``--prompts`` random sequences repeated twice, each induction head's top key-side
  writer (``analysis.qk_attribution.induction``) and how often it is a previous-token head by the detector's label.
"""
from __future__ import annotations

import argparse

import torch

from analysis.roles.detector import head_detector
from analysis.qk_attribution import qk_attribution, qk_attribution_task
from analysis.qk_attribution.induction import induction_key_writers
from analysis.tasks.build import make_task
from bench.common import machine, ratio, timed
from models import load_model

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
PASSAGE = ("The river ran past the old mill, where the miller kept his grain in sacks by the door. Each morning "
           "he walked to the market with a cart, sold what he could, and came home before the bells rang noon. ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--prompts", type=int, default=50)
    args = parser.parse_args()
    model = load_model(NAME, backend="scratch", device=args.device)
    print(f"{NAME} on {machine(args.device)}")
    ids = model.tokenizer(PASSAGE * 20)["input_ids"][:args.tokens]
    text = model.tokenizer.decode(ids)
    n = len(model.tokenizer(text)["input_ids"])
    batch = torch.tensor([model.tokenizer(text)["input_ids"]], device=model.device)

    def forward():
        with torch.inference_mode():
            model.stack(batch, need_weights=False, need_logits=False)

    r, split_s, forward_s = ratio(lambda: qk_attribution(model, text, 23, 3), forward, args.device, rounds=5,
                                  repeat=1)
    print(f"split of L23 H3, last query of {n} tokens, every key: {split_s:.2f} s (aim <= 2 s), "
          f"{r:.1f}x one forward pass ({forward_s * 1000:.0f} ms)")
    found = qk_attribution(model, text, 23, 3)
    print(found.summary())

    for name, layer, head in (("ioi", 23, 3), ("induction", 18, 6)):
        task = make_task(model, name, n=args.pairs)
        seconds, split = timed(lambda: qk_attribution_task(model, task, layer, head), args.device)
        print(f"\n{name}: L{layer} H{head} {split.query_role} → {split.key_role} on {len(task)} pairs (clean and "
              f"corrupted): {seconds:.1f} s; mean score clean {split.scores('clean').mean():+.2f}, corrupted "
              f"{split.scores('corrupted').mean():+.2f}")
        for side in ("q", "k"):
            print(f"  {'query' if side == 'q' else 'key'} side:")
            print(split.side(side, "clean", 5).drop(columns="index").to_string(index=False))
        print("  writer pairs:")
        print(split.frame("clean", 5).drop(columns=["query_index", "key_index"]).to_string(index=False))

    detector = head_detector(model)
    seconds, keys = timed(lambda: induction_key_writers(model, detector, prompts=args.prompts), args.device)
    share, low, high = keys.share_previous_token()
    print(f"\ninduction heads' top key-side writer over {args.prompts} repeated sequences ({seconds:.1f} s): a "
          f"previous-token head in {share:.0%} [{low:.0%}, {high:.0%}] of (prompt, head) rows (aim >= 80%)")
    print(keys.by_head().to_string(index=False))


if __name__ == "__main__":
    main()
