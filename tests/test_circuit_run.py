"""Circuits from the command line on a tiny random Llama built here: the folder's tables equal
``analysis.circuits`` run directly, and Ray Data's engine gives the local result for the same pairs."""
import numpy as np
import pandas as pd
import pytest

from analysis import circuits as AC
from analysis.tasks.build import from_rows
from models import load_model
from tests import test_llama
from tests.test_tasks import ROWS

SIZES = "0,5,20,1000"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("circuits-cli")
    test_llama.build("llama", folder)
    (folder / "pairs.csv").write_text("clean,corrupted,answer,distractor\n" + "".join(
        f"\"{r['clean']}\",\"{r['corrupted']}\",{r['answer']},{r['distractor']}\n" for r in ROWS * 3))
    return folder


def _cli(folder, out, *extra):
    from analysis.circuits import run as circuit_run

    assert circuit_run.main([str(folder / "pairs.csv"), "--out", str(out), "--model", str(folder), "--device", "cpu",
                             "--steps", "3", "--sizes", SIZES, *extra]) == 0
    return np.load(out / "scores.npz"), pd.read_csv(out / "curve.csv"), pd.read_csv(out / "edges.csv")


def test_the_command_line_writes_the_circuits_tables(folder, tmp_path, capsys):
    scores, curve, edges = _cli(folder, tmp_path / "local")
    printed = capsys.readouterr().out
    assert "strongest edges:" in printed and "faithfulness: 0 edges 0%" in printed
    model = load_model(folder, backend="scratch")
    task = from_rows(model, ROWS * 3)
    expected = AC.edge_scores(model, task, "eap_ig", 3)
    np.testing.assert_allclose(scores["scores"], expected.scores, rtol=1e-5, atol=1e-7)
    direct = AC.faithfulness(model, expected, [int(s) for s in SIZES.split(",")])
    np.testing.assert_allclose(curve["faithfulness"], direct.faithfulness, atol=1e-6)
    assert curve["faithfulness"].iloc[0] == pytest.approx(0.0, abs=1e-6)  # no edge: the corrupted run
    top = expected.frame(5)
    assert list(edges["sender"][:5]) == list(top.sender) and list(edges["receiver"][:5]) == list(top.receiver)
    assert list(scores["senders"][:2]) == ["input", "L0 H0"] and scores["receivers"][-1] == "logits"


def test_the_ray_engine_gives_the_local_result_for_the_same_pairs(folder, tmp_path, local_ray, monkeypatch):
    from analysis.circuits import run as circuit_run

    monkeypatch.setattr(circuit_run, "CHUNK", 4)  # several batches, each of several lengths
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    local, local_curve, _ = _cli(folder, tmp_path / "local")
    ray, ray_curve, _ = _cli(folder, tmp_path / "ray", "--engine", "ray")
    np.testing.assert_allclose(ray["scores"], local["scores"], rtol=1e-4, atol=1e-6)  # float32, other batches
    np.testing.assert_allclose(ray_curve["faithfulness"], local_curve["faithfulness"], atol=1e-4)
