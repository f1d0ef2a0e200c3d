"""Every built-in compiled program's analyses scored against its ground truth (``analysis.compiled``): the table
docs/compiled.md holds.

    python scripts/score_compiled.py [--pairs 16] [--program sort ...]

Per program: its one-token task's pairs; per circuit method (EAP, EAP-IG, exact edge patching) the edge AUROC over
every true edge and over those the corruption moves, and whether the smallest circuit keeping 80% of the
difference holds every moved true edge; the share of the difference recovered by patching every head together, by
the heads on the task's path together (the mean over the pairs, and the least pair's), and the most an off-path head
recovers alone. Then each compiled head's explanation against its Select.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from analysis.compiled import edge_auroc, explanation_scores, head_recovery, on_path, patched_together
    from analysis.tasks.build import make_task
    from models import HeadLensError
    from models.compiled import BUILT_IN, compiled, ground_truth

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--program", action="append")
    ap.add_argument("--methods", default="eap,eap_ig,exact", help="exact patching of every edge is slow on a large "
                                                                    "program (shuffle_dyck: over 15 minutes)")
    args = ap.parse_args()
    methods = tuple(args.methods.split(","))
    print("| program | pairs | true edges (moved) | AUROC EAP | EAP-IG | exact | moved: EAP | EAP-IG | exact | "
          "80% circuit holds the moved (EAP / EAP-IG / exact) | every head patched | on-path heads patched "
          "together (least pair) | off-path heads, most alone |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.program or list(BUILT_IN):
        start = time.perf_counter()
        model = compiled(name, device="cpu")
        truth = ground_truth(model)
        try:
            task = make_task(model, "one_token", n=args.pairs)
        except HeadLensError as err:  # length: no token changes how many there are
            print(f"| {name} | 0 | {len(truth.edges)} | {err} ||||||||||")
            continue
        table = edge_auroc(model, task, truth, methods).set_index("method").reindex(["eap", "eap_ig", "exact"])
        heads = head_recovery(model, task, truth)
        off = heads[~heads["on_path"]]["recovered"]
        every = patched_together(model, task, [(int(r.layer), int(r.head)) for r in heads.itertuples()])
        on = patched_together(model, task, on_path(model, task, truth))
        a, m = table["auroc"], table["auroc_moved"]
        holds = " / ".join("—" if k not in methods else "yes" if table.loc[k, "holds_every_moved"] else "no"
                           for k in ("eap", "eap_ig", "exact"))
        first = table.iloc[0]
        print(f"| {name} | {len(task)} | {int(first['true_edges'])} ({int(first['moved'])}) | {a['eap']:.3f} | "
              f"{a['eap_ig']:.3f} | {a['exact']:.3f} | {m['eap']:.3f} | {m['eap_ig']:.3f} | {m['exact']:.3f} | "
              f"{holds} | {every.mean():.2f} | {on.mean():.2f} ({on.min():.2f}) | "
              f"{f'{off.abs().max():.2f}' if len(off) else '—'} |", flush=True)
        print(f"<!-- {name}: {time.perf_counter() - start:.0f} s -->", file=sys.stderr)
    print("\n| program | heads placed | named right, held-out score and IoU with the Select ≥ 0.95 | "
          "each head: its Select, what its program names (IoU with the Select, where under 0.95) |\n|---|---|---|---|")
    for name in args.program or list(BUILT_IN):
        model = compiled(name, device="cpu")
        found = explanation_scores(model, ground_truth(model))
        ok = found["right"] & (found["score"] >= 0.95) & (found["iou_select"] >= 0.95)
        each = "; ".join(f"{r.block} {r.select}: {r.named}" + ("" if good else f" (IoU {r.iou_select:.2f})")
                         for r, good in zip(found.itertuples(), ok))
        print(f"| {name} | {len(found)} | {int(ok.sum())} | {each} |", flush=True)


if __name__ == "__main__":
    main()
