"""Why a head attends here: a head's score from a query to a key split over what its query and its key read
(``analysis.qk_attribution``), on a text and over a task, as a section of the Head, Circuits and Explore pages."""
from __future__ import annotations



from analysis import qk_attribution as QA
from models import head_label

from .models import ModelRef, cached_model
from .progress import Bar
from .shared import shared
from .tasks import TaskSpec, built_task


@shared("qk split", entries=32, owned=True, waiting="Splitting the head's scores")
def qk_split(ref: ModelRef, text: str, layer: int, head: int, query: int, key: int | None = None) -> QA.QKAttribution:
    """The split of every key's score; the runs with a writer taken out for ``key``'s largest writers (None: the
    strongest key's)."""
    return QA.qk_attribution(cached_model(ref), text, layer, head, query, key)


@shared("qk task", entries=8, owned=True, waiting="Splitting the head's score on every pair of the task")
def qk_task(ref: ModelRef, spec: TaskSpec, layer: int, head: int, query_role: str, key_role: str) -> QA.QKTask:
    task = built_task(ref, spec)
    bar = Bar(f"Splitting {head_label(layer, head)}'s score on {len(task)} pairs")
    found = QA.qk_attribution_task(cached_model(ref), task, layer, head, query_role, key_role, progress=bar)
    bar.empty()
    return found
