"""Head roles for a decoder: the head detector's scores as a grid, and a chosen head on a repeated sequence."""
from __future__ import annotations

import pandas as pd

from analysis.roles.detector import LENGTH, SENTENCES, SEQUENCES, detector_labels, head_detector
from models.corpus import corpus_sample

from .models import ModelRef, cached_model
from .progress import Bar
from .shared import Warm, shared


def _engines(ref: ModelRef) -> list[tuple]:
    """The detector on the sidebar's model and, when that is a transformers one, on it on the from-scratch engine: Effects names a
    head's label on the engine it patches with."""
    return [(ref,)] if ref.analysed == ref else [(ref,), (ref.analysed,)]


@shared("detector", entries=8, copy=True, waiting="Detecting this model's heads", warm=Warm(2, _engines))
def detected(ref: ModelRef) -> pd.DataFrame:
    """``head_detector`` on the model behind ``ref``, with a progress bar."""
    bar = Bar(f"Running {SEQUENCES} repeated sequences")
    df = head_detector(cached_model(ref), sentences=corpus_sample(SENTENCES), n_sequences=SEQUENCES, length=LENGTH,
                       progress=bar)
    bar.empty()
    return df.assign(label=detector_labels(df))
