"""The view option "Weight by what each key sends": the pages draw value norms (Kobayashi et al. 2020),
each row scaled to 1, from the from-scratch engine with the sidebar model's weights."""
import numpy as np
import pytest

from analysis import renormalise_rows
from tests.conftest import decode, figures, heatmaps

TEXT = "Which do you like better, coffee or tea?"


@pytest.mark.parametrize("engine", ["minilm", "smollm2"])
def test_explore_draws_each_row_as_the_share_of_what_reaches_the_query(new_app, scratch_model, smollm2, engine):
    at = new_app({"model": engine, "text": TEXT, "moved": "true", "layer": "1"})
    twin = scratch_model if engine == "minilm" else smollm2
    want = renormalise_rows(twin.value_norms(TEXT))[1]
    for h, trace in enumerate(heatmaps(figures(at)[0])):
        z = decode(trace["z"]).astype(float)
        seen = ~np.isnan(z)
        np.testing.assert_allclose(z[seen], want[h][seen], atol=1e-5)
        assert seen.sum() == (want[h].size if engine == "minilm" else want[h].shape[0] * (want[h].shape[0] + 1) // 2)
    assert any("what its key sends" in c.value for c in at.caption)
    raw = twin.attend(TEXT).weights[1]
    assert not np.allclose(want, raw, atol=0.02)  # it is another picture, not the raw weights


def test_the_option_is_off_for_a_custom_model_and_moves_nothing_there(new_app, tiny):
    at = new_app({"model": "custom", "custom_model": str(tiny("bloom")), "moved": "true"})
    assert at.sidebar.toggle(key="moved").disabled
    assert not any("what its key sends" in c.value for c in at.caption)
