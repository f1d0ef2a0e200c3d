"""The runs with edits (``models.run``) timed where they serve: patching every head of a pair, at each position,
attribution patching, a task's pairs, a circuit's edges (EAP, EAP-IG), its curve and exact edge patching, a score
split over its writers, a long prompt's forward pass, on SmolLM2 (from-scratch engine).

    python -m bench.bench_edits LABEL

Prints ``LABEL, workload, median seconds`` a line each. Run it in two checkouts of two commits one after the
other, on the same machine (``git worktree add ../before REV``), to see whether a change made a run slower.
"""
import statistics
import sys
import time

import torch

from analysis import circuits
from analysis.defaults import PAIRS
from analysis.qk_attribution import qk_attribution, qk_attribution_task
from analysis.effects import patch_heads
from analysis.tasks.effects import run_task
from analysis.tasks.build import make_task
from models import load_model
from models.corpus import CORPUS

torch.set_num_threads(2)
label = sys.argv[1] if len(sys.argv) > 1 else "now"
m = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="scratch")
pair = next(iter(PAIRS.values()))
late = ("When Mary and John went to the big store, John gave a cold drink to",
        "When Mary and John went to the big store, Mary gave a cold drink to", " Mary", " John")
task = make_task(m, "ioi", 12)
text = " ".join(CORPUS * 20)
ids = m.tokenizer(text)["input_ids"][:2048]
long_text = m.tokenizer.decode(ids)

def t(f, n=3):
    """The median seconds of ``n`` calls of ``f``."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        out.append(time.perf_counter() - start)
    return statistics.median(out)

patch_heads(m, pair.clean, pair.corrupted, pair.answer, pair.distractor)
r = {
 "every head patched, one pair": t(lambda: patch_heads(m, pair.clean, pair.corrupted, pair.answer, pair.distractor)),
 "every head at each position, 16 tokens": t(lambda: patch_heads(m, *late, per_position=True), 1),
 "attribution patching, one pair": t(lambda: patch_heads(m, pair.clean, pair.corrupted, pair.answer, pair.distractor,
                                                         method="attribution")),
 "task, 12 pairs, exact": t(lambda: run_task(m, task, "logit_diff", "exact"), 1),
 "task, 12 pairs, attribution": t(lambda: run_task(m, task, "logit_diff", "attribution")),
 "long prompt 2,048 tokens to layer 15": t(lambda: m.attend_long(long_text).run_to(15), 2),
 "edges, 12 pairs, EAP": t(lambda: circuits.edge_scores(m, task, "eap"), 2),
 "edges, 12 pairs, EAP-IG 5 steps": t(lambda: circuits.edge_scores(m, task, "eap_ig"), 1),
}
scores = circuits.edge_scores(m, task, "eap")
edges = list(zip(*[e[:10] for e in scores.ranked()]))
r.update({
 "circuit curve, 12 pairs, 10 sizes": t(lambda: circuits.faithfulness(m, scores), 1),
 "exact patching of 10 edges, 12 pairs": t(lambda: circuits.exact_edges(m, task, edges), 1),
 "a score split, 17 tokens": t(lambda: qk_attribution(m, late[0], 23, 3)),
 "a score split over 12 pairs": t(lambda: qk_attribution_task(m, task, 23, 3), 2),
})
for k, v in r.items():
    print(f"{label}\t{k}\t{v:.3f}")
