"""Circuits from the command line on a tiny random Llama built here: the folder's tables and what it prints equal
``analysis.circuits`` run directly, its Ray actors' batches are those pairs' results, and Ray Data's engine gives
the local result for the same pairs."""
import pickle

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
                             "--sizes", SIZES, *extra]) == 0
    return np.load(out / "scores.npz"), pd.read_csv(out / "curve.csv"), pd.read_csv(out / "edges.csv")


def _printed(scores: AC.EdgeScores, curve: AC.Curve, out) -> str:
    """What the command line prints, worked from the scores and the curve themselves."""
    top = scores.frame(5)
    smallest = curve.smallest()
    return ("strongest edges: " + "; ".join(f"{s} → {r} {x:+.3f}" for s, r, x in zip(top.sender, top.receiver,
                                                                                    top.share)) + "\n"
            + "faithfulness: " + ", ".join(f"{n:,} edges {f:.0%}" for n, f in zip(curve.sizes, curve.faithfulness))
            + (f"; the smallest circuit reaching 80% has {smallest:,} edges" if smallest is not None else "")
            + f"\n-> {out}\n")


def test_the_command_line_writes_the_circuits_tables(folder, tmp_path, capsys):
    scores, curve, edges = _cli(folder, tmp_path / "local")
    model = load_model(folder, backend="scratch")
    task = from_rows(model, ROWS * 3)
    expected = AC.edge_scores(model, task, "eap_ig", 5)  # EAP-IG's five steps when none are asked for
    assert scores["steps"] == 5 and scores["method"] == "eap_ig"
    np.testing.assert_allclose(scores["scores"], expected.scores, rtol=1e-5, atol=1e-7)
    sizes = [int(s) for s in SIZES.split(",")]
    direct = AC.curve_of(sizes, *AC.circuit_values(model, expected, sizes), seed=0)  # the interval's seed: 0
    np.testing.assert_allclose(curve[["faithfulness", "low", "high"]], direct.frame()[["faithfulness", "low", "high"]],
                               atol=1e-6)
    assert list(curve["edges"]) == [0, 5, 20, 1000]
    assert curve["faithfulness"].iloc[0] == pytest.approx(0.0, abs=1e-6)  # no edge: the corrupted run
    top = expected.frame(5)
    assert list(edges["sender"][:5]) == list(top.sender) and list(edges["receiver"][:5]) == list(top.receiver)
    assert list(scores["senders"][:2]) == ["input", "L0 H0"] and scores["receivers"][-1] == "logits"
    pairs = pd.read_csv(tmp_path / "local" / "pairs.csv")
    assert list(pairs.clean) == [r["clean"] for r in ROWS * 3] and list(pairs.corrupted) == [r["corrupted"]
                                                                                           for r in ROWS * 3]
    np.testing.assert_allclose(pairs.clean_metric, expected.clean, atol=1e-5)
    np.testing.assert_allclose(pairs.corrupted_metric, expected.corrupted, atol=1e-5)
    assert direct.smallest() is not None  # the line names the smallest circuit reaching the target
    assert capsys.readouterr().out == _printed(expected, direct, tmp_path / "local")


def test_eap_on_the_command_line_takes_one_step_and_names_no_circuit_short_of_the_target(folder, tmp_path, capsys):
    from analysis.circuits import run as circuit_run

    out = tmp_path / "eap"
    assert circuit_run.main([str(folder / "pairs.csv"), "--out", str(out), "--model", str(folder), "--device", "cpu",
                             "--method", "eap", "--sizes", "0,1"]) == 0
    saved = np.load(out / "scores.npz")
    assert saved["steps"] == 1 and saved["method"] == "eap"
    model = load_model(folder, backend="scratch")
    expected = AC.edge_scores(model, from_rows(model, ROWS * 3), "eap")
    np.testing.assert_allclose(saved["scores"], expected.scores, rtol=1e-5, atol=1e-7)
    curve = AC.faithfulness(model, expected, [0, 1])
    assert curve.smallest() is None
    assert capsys.readouterr().out == _printed(expected, curve, out)


def test_the_command_line_says_what_it_takes(folder, tmp_path, capsys):
    from analysis.circuits import run as circuit_run

    with pytest.raises(SystemExit) as exit:
        circuit_run.main(["--help"])
    assert exit.value.code == 0
    shown = " ".join(capsys.readouterr().out.split()) + " "
    assert "A circuit over a task from the command line, here or on Ray Data, into a folder." in shown
    assert "--sizes SIZES circuit sizes, comma-separated (default: 10 to 10,000) " in shown
    assert "--steps STEPS EAP-IG's steps " in shown
    with pytest.raises(SystemExit) as exit:
        circuit_run.main([str(folder / "pairs.csv"), "--out", str(tmp_path), "--sizes", "10,ten"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("python -m analysis.circuits.run: error: --sizes takes whole "
                                                        "numbers separated by commas, such as 10,100,1000")
    assert not any(tmp_path.iterdir())


def test_a_ray_actors_batch_is_its_pairs_scores_and_circuits(folder, monkeypatch):
    """The actors run in this process on one batch: its pairs' indices padded to the chunk, their metrics, their
    summed scores, and each pair's metric in each circuit, against ``analysis.circuits`` on those pairs alone."""
    from analysis.circuits import run as circuit_run
    from analysis.tasks.pairs import Task

    monkeypatch.setattr(circuit_run, "CHUNK", 8)
    model = load_model(folder, backend="scratch")
    task = from_rows(model, ROWS * 3)
    index = np.array([3, 5, 6])
    batch = {"index": index, "pair": [pickle.dumps(task.pairs[i]) for i in index]}
    options = {"model": str(folder), "device": "cpu", "metric": task.metric, "method": "eap_ig", "steps": 2}
    got = circuit_run.ScoreBatches(**options)(batch)
    alone = AC.edge_scores(model, Task("batch", "", tuple(task.pairs[i] for i in index)), "eap_ig", 2)
    assert got["index"].tolist() == [[3, 5, 6, -1, -1, -1, -1, -1]]
    np.testing.assert_allclose(got["clean"][0], np.pad(alone.clean, (0, 5)), atol=1e-5)
    np.testing.assert_allclose(got["corrupted"][0], np.pad(alone.corrupted, (0, 5)), atol=1e-5)
    np.testing.assert_allclose(got["scores"][0], alone.scores * 3, rtol=1e-5, atol=1e-7)
    clean = np.zeros(len(task))
    clean[index] = alone.clean
    curves = circuit_run.CurveBatches(scores=alone.scores, sizes=[0, 5, 1000], clean=clean, **options)(batch)
    values, _, corrupted = AC.circuit_values(model, alone, [0, 5, 1000])
    assert curves["index"].tolist() == [3, 5, 6]
    np.testing.assert_allclose(curves["values"], values, atol=1e-5)
    np.testing.assert_allclose(curves["clean"], alone.clean, atol=1e-6)
    np.testing.assert_allclose(curves["corrupted"], corrupted, atol=1e-5)


def test_the_ray_engine_gives_the_local_result_for_the_same_pairs(folder, tmp_path, local_ray, monkeypatch):
    from analysis.circuits import run as circuit_run

    monkeypatch.setattr(circuit_run, "CHUNK", 4)  # several batches, each of several lengths
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    local, local_curve, _ = _cli(folder, tmp_path / "local")
    ray, ray_curve, _ = _cli(folder, tmp_path / "ray", "--engine", "ray")
    np.testing.assert_allclose(ray["scores"], local["scores"], rtol=1e-4, atol=1e-6)  # float32, other batches
    np.testing.assert_allclose(ray_curve["faithfulness"], local_curve["faithfulness"], atol=1e-4)
