"""Effects over a task from the command line, here or on Ray Data, into a folder of tables.

    python -m analysis.tasks.run TASK --out FOLDER [--model NAME] [--pairs N] [--seed S] [--corruption s2|abc]
                                [--metric logit_diff|prob_diff|greater_than] [--method exact|attribution]
                                [--normalise set|pair] [--no-residual] [--correct-only] [--device auto|cpu|cuda]
                                [--engine local|ray] [--address RAY_ADDRESS] [--actors N]

TASK is a generator's name (``analysis.tasks.build.TASKS``) or a CSV file of pairs (clean, corrupted, answer,
distractor). The model defaults to the bundled SmolLM2. The folder receives ``heads.csv`` (every head's
patching: mean, 95% interval, p, q), ``attribution.csv``, ``residual.csv`` (by layer and role), ``pairs.csv`` (each
pair and its metrics) and ``values.npz`` (every per-pair array of ``analysis.tasks.effects.TaskEffects``).

Engines:
- ``local``: this process, the pairs in batches (``run_task``), a progress bar over the pairs.
- ``ray``: Ray Data sends the pairs, ``CHUNK`` a batch, to actors that each load the model once and return
  each pair's values; this process puts them back in the pairs' order, which gives the local result for the
  same pairs (each pair's values do not depend on the others in its batch). ``--address`` joins a cluster.
"""
from __future__ import annotations

import argparse
import pickle
import sys
import warnings
from pathlib import Path

import numpy as np

from models import HeadLensError, head_label

from ..profiles.ray import check_model, no_restarts, start_ray, worker_errors
from .effects import METRICS, NORMALISE, TaskEffects, run_task, table
from .build import MAX_PAIRS, TASKS, Task, from_csv, make_task

CHUNK = 64            # pairs in one Ray batch
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
FIELDS = ("clean", "corrupted", "attribution", "heads", "residual", "role_attention")


def build_task(model, source: str, pairs: int, seed: int, corruption: str) -> Task:
    """A generator's task, or a CSV file's pairs (up to ``MAX_PAIRS``, each bad row named on stderr)."""
    if source in TASKS:
        options = {"corruption": corruption} if source == "ioi" else {}
        return make_task(model, source, n=pairs, seed=seed, **options)
    path = Path(source)
    if not path.is_file():
        raise HeadLensError(f"'{source}' is neither a task ({', '.join(TASKS)}) nor a CSV file.")
    task = from_csv(model, path.read_bytes(), limit=MAX_PAIRS)
    for problem in task.problems:
        print(problem, file=sys.stderr)
    return task


class TaskBatches:
    """The Ray Data callable: loads the model once per actor; each batch of pairs gives each pair's values."""

    def __init__(self, model: str, device: str, metric: str, method: str, residual: bool):
        from models import load_model

        self.model = load_model(model, backend="scratch", device=device)
        self.metric, self.method, self.residual = metric, method, residual

    def __call__(self, batch: dict) -> dict:
        pairs = tuple(pickle.loads(p) for p in batch["pair"])
        roles = tuple(batch["roles"][0].split(","))
        task = Task("batch", "", pairs)
        effects = run_task(self.model, task, self.metric, self.method, residual=self.residual)
        if tuple(effects.roles) != roles:  # a batch's pairs may share more roles than the task's do
            keep = [effects.roles.index(r) for r in roles]
            effects = _with_roles(effects, keep, roles)
        return {"index": np.asarray(batch["index"]), **{f: getattr(effects, f) for f in FIELDS}}


def _with_roles(effects: TaskEffects, keep: list[int], roles: tuple[str, ...]) -> TaskEffects:
    return TaskEffects(effects.task, effects.metric, effects.method, roles, effects.clean, effects.corrupted,
                       effects.attribution, effects.heads, effects.residual[:, :, keep],
                       effects.role_attention[..., keep])


def run_ray(model_name: str, task: Task, metric: str, method: str, *, residual: bool = True, device: str = "auto",
            address: str | None = None, actors: int = 1, progress=None) -> TaskEffects:
    """``run_task``'s result computed by Ray Data actors and put back in the pairs' order here."""
    ray, on_gpu, resources = start_ray(address, device)
    roles = ",".join(task.roles)
    items = [{"index": i, "pair": pickle.dumps(p), "roles": roles} for i, p in enumerate(task.pairs)]
    with warnings.catch_warnings():  # Ray 2.60 warns that remote-args functions go in 2.64; this version is pinned
        warnings.simplefilter("ignore", DeprecationWarning)
        parts = ray.data.from_items(items, override_num_blocks=max(1, len(items) // CHUNK)).map_batches(
            TaskBatches, batch_size=CHUNK, compute=ray.data.ActorPoolStrategy(size=actors),
            fn_constructor_kwargs={"model": model_name, "device": "cuda" if on_gpu else "cpu", "metric": metric,
                                   "method": method, "residual": residual},
            ray_remote_args_fn=no_restarts, **resources)
    out: dict[str, np.ndarray] = {}
    with worker_errors():  # a worker's error arrives wrapped; a HeadLens one is a sentence for the user
        for batch in parts.iter_batches(batch_size=None, batch_format="numpy"):
            index = batch["index"]
            for f in FIELDS:
                value = np.asarray(batch[f])
                if f not in out:
                    out[f] = np.zeros((len(task), *value.shape[1:]), dtype=value.dtype)
                out[f][index] = value
            if progress is not None:
                progress(len(index))
    return TaskEffects(task, metric, method, tuple(task.roles), **out)


def write(effects: TaskEffects, folder: Path, normalise: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for what in ("heads", "attribution", "residual"):
        table(effects, what, normalise).to_csv(folder / f"{what}.csv", index=False)
    import pandas as pd

    pd.DataFrame({"clean": [p.clean for p in effects.task.pairs], "corrupted": [p.corrupted for p in effects.task.pairs],
                  "template": [p.template for p in effects.task.pairs], "clean_metric": effects.clean,
                  "corrupted_metric": effects.corrupted, "correct": effects.correct}).to_csv(folder / "pairs.csv",
                                                                                             index=False)
    np.savez_compressed(folder / "values.npz", roles=np.array(effects.roles), metric=effects.metric,
                        method=effects.method, **{f: getattr(effects, f) for f in FIELDS})


def task_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments a task's command line takes, here or on Ray (the task, its model and pairs, the engine)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("task", help=f"a task ({', '.join(TASKS)}) or a CSV file of pairs")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write the tables into")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a decoder's folder or name (default: SmolLM2)")
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corruption", choices=["s2", "abc"], default="s2", help="ioi's corruption")
    parser.add_argument("--metric", choices=list(METRICS), default=None, help="default: the task's own")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--engine", choices=["local", "ray"], default="local")
    parser.add_argument("--address", default=None, help="a Ray cluster's address (default: RAY_ADDRESS or local)")
    parser.add_argument("--actors", type=int, default=1, help="Ray actors, each with its own copy of the model")
    return parser


def parsed(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.actors < 1:
        parser.error("--actors takes a whole number of at least 1")
    return args


def opened(args: argparse.Namespace) -> tuple[object, Task, str]:
    """The model a command line names (on the CPU when Ray's workers run it, checked first), its task and the metric
    asked (the task's own by default)."""
    from models import load_model

    if args.engine == "ray":
        check_model(args.model)
    model = load_model(args.model, backend="scratch", device="cpu" if args.engine == "ray" else args.device)
    task = build_task(model, args.task, args.pairs, args.seed, args.corruption)
    return model, task, args.metric or task.metric


def main(argv: list[str] | None = None) -> int:
    parser = task_parser("python -m analysis.tasks.run", __doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=["exact", "attribution"], default="exact")
    parser.add_argument("--normalise", choices=list(NORMALISE), default="set")
    parser.add_argument("--no-residual", action="store_true", help="skip the residual stream by role")
    parser.add_argument("--correct-only", action="store_true", help="average over the pairs the model gets right")
    args = parsed(parser, argv)

    from tqdm import tqdm

    try:
        model, task, metric = opened(args)
        with tqdm(total=len(task), unit=" pairs", desc=f"{task.name} ({args.method})", file=sys.stderr) as bar:
            if args.engine == "ray":
                effects = run_ray(args.model, task, metric, args.method, residual=not args.no_residual,
                                  device=args.device, address=args.address, actors=args.actors,
                                  progress=bar.update)
            else:
                seen = {"pairs": 0}

                def progress(done: int, total: int) -> None:
                    now = done * len(task) // max(total, 1)
                    bar.update(now - seen["pairs"])
                    seen["pairs"] = now

                effects = run_task(model, task, metric, args.method, residual=not args.no_residual,
                                   progress=progress)
        print(f"{len(task):,} pairs; the model gets {effects.accuracy:.0%} right (clean metric above zero)")
        if args.correct_only:
            effects = effects.only(effects.correct)
        write(effects, args.out, args.normalise)
    except HeadLensError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    heads = table(effects, "heads", args.normalise).sort_values("mean", key=abs, ascending=False).head(5)
    print("largest mean effects: " + "; ".join(f"{head_label(r.layer, r.head)} {r.mean:+.3f} [{r.low:+.3f}, {r.high:+.3f}]"
                                                f"{' *' if r.significant else ''}" for r in heads.itertuples()))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
