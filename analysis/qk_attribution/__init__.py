"""Why a head attends where it does: a score split exactly over the writers of its query and its key (``split``,
the torch half, norms frozen at the run's scale), and its frames on a prompt and over a task (``frames``)."""
from .frames import (BATCH_PAIRS, GRID, MAX_TOKENS, REMOVED, REST, ROLE_PAIRS, TASK_PAIRS, QKAttribution, QKTask,
                     prompt_tokens, qk_attribution, qk_attribution_task)
from .split import CONSTANT

__all__ = ["BATCH_PAIRS", "GRID", "MAX_TOKENS", "REMOVED", "REST", "ROLE_PAIRS", "TASK_PAIRS", "QKAttribution",
           "QKTask", "prompt_tokens", "qk_attribution", "qk_attribution_task", "CONSTANT"]
