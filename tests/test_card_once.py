"""A card is put together once (``analysis.cards.assemble``): from Python each part is computed, on the Head page
each is the shared result its page reads; both open with the defaults table's task, pairs and samples, and give
the same parts for SmolLM2 (a pair's; the task's 50 pairs are not run twice)."""
from __future__ import annotations

import numpy as np
import pytest

from analysis import cards
from analysis.defaults import DECODER_SAMPLE, FIRST_TASK, FIRST_TASK_NAME, FIRST_TASK_PAIRS, PAIRS
from app_pages.results import card as page
from app_pages.results.models import ModelRef
from app_pages.results.pruning import first_measured
from app_pages.results.tasks import first_task
from app_pages.results.threads import here
from models.corpus import corpus_sample

pytestmark = pytest.mark.bundled


@pytest.fixture
def background():
    """Shared results computed as the server's own work: no page to draw a progress bar on."""
    here.background = True
    yield
    here.background = False


def test_the_page_and_python_open_a_card_with_the_same_defaults(smollm2, background):
    ref = ModelRef("smollm2")
    spec = first_task(ref.scratch())[0][1]
    assert (spec.source, spec.pairs) == cards.TASK == (FIRST_TASK, FIRST_TASK_PAIRS)
    measured = first_measured(ref.scratch())[0]
    assert measured[2] == corpus_sample(cards.IMPORTANCE_SAMPLE) == corpus_sample(DECODER_SAMPLE)
    assert page.FromPages(ref).pairs() == cards.Computed(smollm2, []).pairs() == PAIRS


def test_the_page_and_python_assemble_the_same_parts(smollm2, background):
    ref = ModelRef("smollm2")
    ours, python = page.FromPages(ref), cards.Computed(smollm2, [])
    pair = next(iter(PAIRS.values()))
    for a, b in zip(ours.pair(pair), python.pair(pair)):
        np.testing.assert_allclose(a.select_dtypes("number").to_numpy(), b.select_dtypes("number").to_numpy(),
                                   atol=1e-4)
    assert page.TASK_NAME == FIRST_TASK_NAME  # the task itself is the same spec (the test above)
