"""The Effects page over a task in AppTest on SmolLM2: its grids, metrics, a head's per-pair strip and role
attention against run_task computed directly; a head from the URL and a click; a CSV with a bad row; the
heads-kept curve; downloads."""
import io

import numpy as np
import pandas as pd
import pytest

from analysis.tasks.ablation import kept_curve, order_by_effect
from analysis.tasks.effects import run_task, table
from analysis.tasks.build import ioi
from tests.conftest import decode, downloads, figures, heatmaps, title_text

PAGE = "app_pages/effects.py"
LINK = {"model": "smollm2", "effects_scope": "task", "task": "ioi", "task_pairs": "10", "task_head": "23.3"}


@pytest.fixture(scope="module")
def expected(smollm2):
    task = ioi(smollm2, n=10, seed=0)
    return task, run_task(smollm2, task, method="attribution")


def _figure(at, title: str) -> dict:
    return next(f for f in figures(at) if title in title_text(f))


def test_a_task_is_averaged_on_the_page_as_run_task_averages_it(new_app, expected):
    task, effects = expected
    at = new_app(LINK, page=PAGE)
    assert not at.error, [e.value for e in at.error]
    heads, attribution = table(effects), table(effects, "attribution")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Pairs"] == "10" and metrics["Model right"] == f"{effects.accuracy:.0%}"
    assert metrics["Clean"] == f"{effects.clean.mean():+.3f}"
    assert metrics["Passing"] == str(int(heads["significant"].sum()))
    patching = _figure(at, "mean share recovered over 10 pairs")
    np.testing.assert_allclose(decode(heatmaps(patching)[0]["z"]), heads["mean"].to_numpy().reshape(30, 9), atol=1e-6)
    dots = next(t for t in patching["data"] if t.get("name") == "significant")
    assert len(decode(dots["x"])) == int(heads["significant"].sum())
    np.testing.assert_allclose(decode(heatmaps(_figure(at, "Direct attribution"))[0]["z"]),
                               attribution["mean"].to_numpy().reshape(30, 9), atol=1e-6)
    residual = decode(heatmaps(_figure(at, "residual stream patched at each role"))[0]["z"])
    np.testing.assert_allclose(residual, table(effects, "residual")["mean"].to_numpy().reshape(30, -1), atol=1e-6)
    # the head from the link: its value on each pair, and its attention from END to each role
    assert at.selectbox(key="task_head").value == (23, 3)
    strip = _figure(at, "L23 H3 patched, pair by pair")
    points = np.concatenate([decode(t["y"]) for t in strip["data"] if t.get("type") == "box"])
    np.testing.assert_allclose(np.sort(points), np.sort(effects.heads[:, 23, 3]), atol=1e-6)
    assert {t["name"] for t in strip["data"] if t.get("type") == "box"} == {"ABBA", "BABA"} & {
        p.template.split()[0] for p in task.pairs}
    bars = _figure(at, "L23 H3: attention from the last token")["data"][0]
    assert list(bars["x"]) == list(effects.roles)
    np.testing.assert_allclose(decode(bars["y"]), effects.role_attention[:, 23, 3].mean(0), atol=1e-6)
    files = downloads(at)
    table_csv = pd.read_csv(io.BytesIO(files["Patching per head, with intervals · CSV"]))
    np.testing.assert_allclose(table_csv["mean"], heads["mean"], atol=1e-9)


def test_a_picked_head_and_only_the_pairs_the_model_gets_right(new_app, expected):
    _, effects = expected
    at = new_app(LINK, page=PAGE)
    at.selectbox(key="task_head").set_value((29, 1)).run()
    strip = _figure(at, "L29 H1 patched, pair by pair")
    points = np.concatenate([decode(t["y"]) for t in strip["data"] if t.get("type") == "box"])
    np.testing.assert_allclose(np.sort(points), np.sort(effects.heads[:, 29, 1]), atol=1e-6)
    assert at.query_params["task_head"] in ("29.1", ["29.1"]) and at.query_params["effects_scope"] in ("task", ["task"])
    at.toggle(key="task_correct").set_value(True).run()
    assert {m.label: m.value for m in at.metric}["Pairs"] == str(int(effects.correct.sum()))


def test_a_csvs_bad_row_is_named_and_the_others_run(new_app, smollm2):
    at = new_app({"model": "smollm2", "effects_scope": "task", "task": "csv"}, page=PAGE)
    assert any("Upload a CSV" in i.value for i in at.info)
    text = ("clean,corrupted,answer,distractor\n"
            "\"When Mary and John went to the store, John gave a drink to\","
            "\"When Mary and John went to the store, Mary gave a drink to\", Mary, John\n"
            "The Eiffel Tower is located in the city of,The Colosseum is in the city of, Paris, Rome\n"
            "\"When Anna and Tom went to the park, Tom gave a ball to\","
            "\"When Anna and Tom went to the park, Anna gave a ball to\", Anna, Tom\n")
    at.get("file_uploader")[0].upload("pairs.csv", text.encode(), "text/csv").run()
    assert not at.error, [e.value for e in at.error]
    warning = " ".join(w.value for w in at.warning)
    assert "1 row left out" in warning and "Row 3" in warning and "same number of tokens" in warning
    assert {m.label: m.value for m in at.metric}["Pairs"] == "2"
    one = "clean,corrupted,answer,distractor\n" + text.splitlines()[1] + "\n"
    at.get("file_uploader")[0].upload("one.csv", one.encode(), "text/csv").run()
    assert not at.exception and "needs at least two pairs" in " ".join(e.value for e in at.error)


def test_the_heads_kept_curve_is_the_metric_with_the_rest_mean_ablated(new_app, expected, smollm2):
    task, effects = expected
    at = new_app({**LINK, "task_curve": "true"}, page=PAGE)
    assert not at.error, [e.value for e in at.error]
    fig = _figure(at, "with k heads kept")
    by_effect = next(t for t in fig["data"] if t["name"] == "by the task's mean effect")
    want = kept_curve(smollm2, task, {"effect": order_by_effect(effects)}, counts=[0, 1, 270])
    x, y = decode(by_effect["x"]), decode(by_effect["y"])
    for k, value in zip(want["kept"], want["metric"]):
        assert y[list(x).index(k)] == pytest.approx(value, abs=1e-4)
    assert y[-1] == pytest.approx(effects.clean.mean(), abs=1e-4)  # every head kept: the model itself
    assert any(t["name"].startswith("by importance") for t in fig["data"])
