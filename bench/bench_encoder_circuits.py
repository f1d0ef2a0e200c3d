"""Circuits and the QK split on the default encoder, all-MiniLM-L6-v2, the embedding metric
cos(e, answer) - cos(e, distractor).

    python -m bench.bench_encoder_circuits [--device cpu|cuda] [--pairs N]

- EAP over the objects task's N pairs (100 by default; aim <= 10 s), every one of MiniLM's 7,588 edges scored, timed
  side by side (``common.ratio``) with transformers' BertModel run forward and backward once over the same pairs (the
  least a gradient-based score can cost); then EAP-IG in 5 steps, and the faithfulness curve at the default sizes.
- The QK split of a head's scores on a 128-token text (aim <= 1 s), every writer pair of every key, timed side by
  side with one transformers forward pass of that text with its attentions.
"""
from __future__ import annotations


import torch

from analysis import circuits as AC
from analysis.qk_attribution import qk_attribution
from analysis.tasks.build import make_task
from bench.common import minilm_bench, ratio, timed

SENTENCE = "Which do you like better, coffee or tea? "


def main() -> None:
    args, ours, hf, tok = minilm_bench(__doc__.split("\n")[0])

    task = make_task(ours, "objects", args.pairs)
    clean = tok([p.clean for p in task.pairs], return_tensors="pt", padding=True).to(args.device)

    def mine():
        return AC.edge_scores(ours, task, "eap")

    def theirs():  # one forward and one backward pass over the same pairs, padded into one batch
        out = hf(**clean).last_hidden_state
        out.mean(1).norm(dim=-1).sum().backward()

    AC.edge_scores(ours, task.subset(range(4)), "eap")  # warm
    r, a, b = ratio(mine, theirs, args.device, rounds=3, repeat=1, warmup=1)
    print(f"EAP over {len(task)} pairs of the objects task, {AC.graph_of(ours.stack).n_edges:,} edges: {a:.2f} s "
          f"(aim <= 10 s); transformers forward and backward once {b:.2f} s: ratio {r:.1f}")
    t_ig, scores = timed(lambda: AC.edge_scores(ours, task, "eap_ig", AC.STEPS), args.device)
    t_curve, curve = timed(lambda: AC.faithfulness(ours, scores), args.device)
    print(f"EAP-IG in {AC.STEPS} steps {t_ig:.2f} s; the faithfulness curve at {len(curve.sizes)} sizes "
          f"{t_curve:.2f} s; the smallest circuit reaching {AC.TARGET:.0%}: {curve.smallest()} edges")

    words = tok(SENTENCE * 16, add_special_tokens=False)["input_ids"][:126]
    text = tok.decode(words)
    ids = tok(text, return_tensors="pt")["input_ids"].to(args.device)                     # [CLS], 126, [SEP]
    n = len(ours.tokenize(text)["input_ids"])

    def split():
        return qk_attribution(ours, text, 5, 11, query=n // 2)

    def forward():
        with torch.inference_mode():
            return hf(input_ids=ids, output_attentions=True)

    r, a, b = ratio(split, forward, args.device, rounds=5, repeat=2)
    print(f"QK split of L5 H11 on {n} tokens: {a:.3f} s (aim <= 1 s); transformers forward with attentions "
          f"{b:.3f} s: ratio {r:.1f}")


if __name__ == "__main__":
    main()
