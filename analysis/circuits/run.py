"""A circuit over a task from the command line, here or on Ray Data, into a folder.

    python -m analysis.circuits.run TASK --out FOLDER [--model NAME] [--pairs N] [--seed S] [--corruption s2|abc]
                                   [--metric ...] [--method eap|eap_ig] [--steps K] [--sizes 10,100,1000]
                                   [--device auto|cpu|cuda] [--engine local|ray] [--address RAY_ADDRESS] [--actors N]

TASK is a generator's name (``analysis.tasks.build.TASKS``) or a CSV file of pairs. Every edge is scored over the pairs
(``analysis.circuits.edge_scores``), then the circuit of the top edges is run at each size, every other edge
corrupted. The folder receives ``edges.csv`` (every edge, largest |score| first), ``curve.csv`` (faithfulness and its
95% interval at each size), ``pairs.csv`` (each pair's metrics) and ``scores.npz`` (the score matrix, the senders'
and receivers' names).

Engines:
- ``local``: this process, the pairs in batches, a progress bar over the pairs.
- ``ray``: Ray Data sends the pairs, ``CHUNK`` a batch, to actors that each load the model once: each batch comes
  back as its pairs' summed scores, then (a second pass) as each pair's metric in each circuit; the sums and the
  pairs' values are put together here, which gives the local result for the same pairs.
"""
from __future__ import annotations

import pickle
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from models import HeadLensError
from models.run import patching_stack

from .. import circuits as AC
from ..profiles.ray import no_restarts, start_ray, worker_errors
from ..tasks.run import opened, parsed, task_parser
from ..tasks.pairs import Task

CHUNK = 64   # pairs in one Ray batch


class _Actor:
    """Loads the model once per actor."""

    def __init__(self, model: str, device: str, metric: str, method: str, steps: int):
        from models import load_model

        self.model = load_model(model, backend="scratch", device=device)
        self.metric, self.method, self.steps = metric, method, steps

    def task(self, batch: dict) -> tuple[np.ndarray, Task]:
        index = np.asarray(batch["index"])
        return index, Task("batch", "", tuple(pickle.loads(p) for p in batch["pair"]))


class ScoreBatches(_Actor):
    """A batch of pairs: one row, its pairs' indices (padded with -1 to ``CHUNK``), metrics and summed scores."""

    def __call__(self, batch: dict) -> dict:
        index, task = self.task(batch)
        s = AC.edge_scores(self.model, task, self.method, self.steps, self.metric)
        pad = CHUNK - len(index)
        return {"index": np.pad(index, (0, pad), constant_values=-1)[None],
                "clean": np.pad(s.clean, (0, pad))[None], "corrupted": np.pad(s.corrupted, (0, pad))[None],
                "scores": (s.scores * len(index))[None]}


class CurveBatches(_Actor):
    """A batch of pairs: each pair's metric with only the circuit of each size clean (``clean``: every pair's clean
    metric, from the scores)."""

    def __init__(self, scores: np.ndarray, sizes: list[int], clean: np.ndarray, **kwargs):
        super().__init__(**kwargs)
        self.scores, self.sizes, self.clean = scores, sizes, clean

    def __call__(self, batch: dict) -> dict:
        index, task = self.task(batch)
        graph = AC.graph_of(patching_stack(self.model))
        s = AC.EdgeScores(task, self.metric, self.method, self.steps, graph, self.scores, self.clean[index],
                          np.zeros(len(task)))
        values, clean, corrupted = AC.circuit_values(self.model, s, self.sizes)
        return {"index": index, "values": values, "clean": clean, "corrupted": corrupted}


def run_ray(model_name: str, task: Task, metric: str, method: str, steps: int, sizes, *, device: str = "auto",
            address: str | None = None, actors: int = 1, progress=None) -> tuple[AC.EdgeScores, AC.Curve]:
    """``edge_scores`` and ``faithfulness`` computed by Ray Data actors and put together here."""
    from models import load_model

    ray, on_gpu, resources = start_ray(address, device)
    items = [{"index": i, "pair": pickle.dumps(p)} for i, p in enumerate(task.pairs)]
    options = {"model": model_name, "device": "cuda" if on_gpu else "cpu", "metric": metric, "method": method,
               "steps": steps}

    def mapped(fn, **more):
        with warnings.catch_warnings():  # Ray 2.60 warns that remote-args functions go in 2.64; this version is pinned
            warnings.simplefilter("ignore", DeprecationWarning)
            return ray.data.from_items(items, override_num_blocks=max(1, len(items) // CHUNK)).map_batches(
                fn, batch_size=CHUNK, compute=ray.data.ActorPoolStrategy(size=actors),
                fn_constructor_kwargs={**options, **more}, ray_remote_args_fn=no_restarts, **resources)

    graph = AC.graph_of(patching_stack(load_model(model_name, backend="scratch", device="cpu")))
    total, clean, corrupted = 0.0, np.zeros(len(task)), np.zeros(len(task))
    with worker_errors():  # a worker's error arrives wrapped; a HeadLens one is a sentence for the user
        for batch in mapped(ScoreBatches).iter_batches(batch_size=None, batch_format="numpy"):
            for index, c, b, s in zip(batch["index"], batch["clean"], batch["corrupted"], batch["scores"]):
                live = index >= 0
                clean[index[live]], corrupted[index[live]] = c[live], b[live]
                total = total + s
                if progress is not None:
                    progress(int(live.sum()))
        scores = AC.EdgeScores(task, metric, method, steps, graph, total / len(task), clean, corrupted)
        sizes = AC.default_sizes(graph.n_edges) if sizes is None else np.asarray(sizes)
        values = np.zeros((len(task), len(sizes)))
        for batch in mapped(CurveBatches, scores=scores.scores, sizes=list(map(int, sizes)), clean=clean).iter_batches(
                batch_size=None, batch_format="numpy"):
            values[batch["index"]] = batch["values"]
            if progress is not None:
                progress(len(batch["index"]))
    return scores, AC.curve_of(sizes, values, clean, corrupted)


def write(scores: AC.EdgeScores, curve: AC.Curve, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    scores.frame().drop(columns=["sender_index", "receiver_index"]).to_csv(folder / "edges.csv", index=False)
    curve.frame().to_csv(folder / "curve.csv", index=False)
    t = scores.task
    pd.DataFrame({"clean": [p.clean for p in t.pairs], "corrupted": [p.corrupted for p in t.pairs],
                  "clean_metric": scores.clean, "corrupted_metric": scores.corrupted}).to_csv(folder / "pairs.csv",
                                                                                         index=False)
    g = scores.graph
    np.savez_compressed(folder / "scores.npz", scores=scores.scores, method=scores.method, steps=scores.steps,
                        senders=np.array([g.sender_name(s) for s in range(len(g.senders))]),
                        receivers=np.array([g.receiver_name(r) for r in range(len(g.receivers))]))


def main(argv: list[str] | None = None) -> int:
    parser = task_parser("python -m analysis.circuits.run", __doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=list(AC.METHODS), default="eap_ig")
    parser.add_argument("--steps", type=int, default=AC.STEPS, help="EAP-IG's steps")
    parser.add_argument("--sizes", default=None, help="circuit sizes, comma-separated (default: 10 to 10,000)")
    args = parsed(parser, argv)
    try:
        sizes = None if args.sizes is None else [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        parser.error("--sizes takes whole numbers separated by commas, such as 10,100,1000")

    from tqdm import tqdm

    try:
        model, task, metric = opened(args)
        steps = args.steps if args.method == "eap_ig" else 1
        with tqdm(total=2 * len(task), unit=" pairs", desc=f"{task.name} ({args.method})", file=sys.stderr) as bar:
            if args.engine == "ray":
                scores, curve = run_ray(args.model, task, metric, args.method, steps, sizes, device=args.device,
                                        address=args.address, actors=args.actors, progress=bar.update)
            else:
                seen = {"pairs": 0}

                def progress(done: int, total: int) -> None:
                    now = done * len(task) // max(total, 1)
                    bar.update(max(0, now - seen["pairs"]))
                    seen["pairs"] = now

                scores = AC.edge_scores(model, task, args.method, steps, metric, progress=progress)
                seen["pairs"] = 0
                curve = AC.faithfulness(model, scores, sizes, progress=progress)
        write(scores, curve, args.out)
    except HeadLensError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    top = scores.frame(5)
    print("strongest edges: " + "; ".join(f"{r.sender} → {r.receiver} {r.share:+.3f}" for r in top.itertuples()))
    smallest = curve.smallest()
    print("faithfulness: " + ", ".join(f"{n:,} edges {f:.0%}" for n, f in zip(curve.sizes, curve.faithfulness))
          + (f"; the smallest circuit reaching {AC.TARGET:.0%} has {smallest:,} edges" if smallest else ""))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
