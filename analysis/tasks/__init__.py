"""Tasks: many prompt pairs built for one model's tokenizer (``build``: the generators and a user's CSV; ``focus``:
an encoder's; ``pairs`` and ``words``: what they are made of), and what is measured over them (``effects``: every
head attributed and patched, with intervals; ``ablation``: the heads kept and the rest mean-ablated; ``run``: the
same on a Ray cluster, from the command line)."""
from .build import TASKS, from_csv, from_rows, make_task
from .effects import METRICS, TaskEffects, run_task, table
from .pairs import Task, TaskPair

__all__ = ["METRICS", "TASKS", "Task", "TaskEffects", "TaskPair", "from_csv", "from_rows", "make_task", "run_task",
           "table"]
