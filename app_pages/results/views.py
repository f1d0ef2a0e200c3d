"""How a page shows attention: the sidebar's view of it, and the notes under its heatmaps."""
from __future__ import annotations


import numpy as np

from analysis import flow

from .shared import Named, shared


@shared("flow", entries=32, waiting="Computing attention flow")
def view_flow(v: Named, residual: float) -> np.ndarray:
    """``analysis.attention.flow`` of the view ``v.value``, named by what it was made from: seconds at 64 tokens, so kept."""
    return flow(v.value, residual=residual)
