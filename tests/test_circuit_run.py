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
    assert "TASK is a generator's name" not in shown  # the docstring's first paragraph alone
    with pytest.raises(SystemExit) as exit:
        circuit_run.main([str(folder / "pairs.csv"), "--out", str(tmp_path), "--method", "eap-ig"])
    assert exit.value.code == 2 and "argument --method: invalid choice: 'eap-ig'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        circuit_run.main([str(folder / "pairs.csv"), "--out", str(tmp_path), "--steps", "five"])
    assert exit.value.code == 2 and "argument --steps: invalid int value: 'five'" in capsys.readouterr().err
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
    # a metric other than the task's own, which the actors must be told
    options = {"model": str(folder), "device": "cpu", "metric": "prob_diff", "method": "eap_ig", "steps": 2}
    got = circuit_run.ScoreBatches(**options)(batch)
    alone = AC.edge_scores(model, Task("batch", "", tuple(task.pairs[i] for i in index)), "eap_ig", 2, "prob_diff")
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


class _Bar:
    """tqdm as the command line makes it: what it was made with, and each update."""

    made: list = []

    def __init__(self, **how):
        self.how, self.updates = how, []
        _Bar.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n):
        self.updates.append(n)


def test_the_command_lines_bar_counts_each_pair_once_a_pass_and_its_options_reach_the_scores(folder, tmp_path,
                                                                                              monkeypatch, capsys):
    """EAP-IG in two steps on the probability difference, at the default sizes, into a folder not made yet and then
    into it again: the scores are that computation, the bar goes to twice the pairs (scoring, then the circuits) in
    whole pairs, and each table's header is its columns alone."""
    import sys

    import tqdm

    from analysis.circuits import run as circuit_run

    _Bar.made = []
    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    out = tmp_path / "a" / "b"
    argv = [str(folder / "pairs.csv"), "--out", str(out), "--model", str(folder), "--device", "cpu",
            "--steps", "2", "--metric", "prob_diff"]
    assert circuit_run.main(argv) == 0 and circuit_run.main(argv) == 0  # a second run into the same folder
    model = load_model(folder, backend="scratch")
    task = from_rows(model, ROWS * 3)
    expected = AC.edge_scores(model, task, "eap_ig", 2, "prob_diff")
    saved = np.load(out / "scores.npz")
    assert saved["steps"] == 2 and saved["method"] == "eap_ig"
    np.testing.assert_allclose(saved["scores"], expected.scores, rtol=1e-5, atol=1e-7)
    curve = AC.faithfulness(model, expected)  # the default sizes
    assert pd.read_csv(out / "curve.csv")["edges"].tolist() == list(curve.sizes)
    bar = _Bar.made[-1]
    n = len(task)
    assert bar.how == {"total": 2 * n, "unit": " pairs", "desc": "yours (eap_ig)", "file": sys.stderr}
    assert all(u >= 0 and u == int(u) for u in bar.updates), bar.updates
    passed = np.cumsum(bar.updates)
    assert passed[-1] == 2 * n and n in passed and len(bar.updates) > 4  # each pass to its pairs, step by step
    headers = {name: (out / name).read_text().splitlines()[0] for name in ("edges.csv", "curve.csv", "pairs.csv")}
    assert headers == {"edges.csv": "rank,sender,receiver,kind,sender_layer,receiver_layer,score,share",
                       "curve.csv": "edges,faithfulness,low,high",
                       "pairs.csv": "clean,corrupted,clean_metric,corrupted_metric"}


def test_the_bars_second_pass_counts_from_no_pairs_when_its_first_report_is_already_pairs_in(folder, tmp_path,
                                                                                           monkeypatch, capsys):
    """One circuit size: the circuits' first report is a whole batch of pairs done, which the bar adds in full."""
    import tqdm

    from analysis.circuits import run as circuit_run

    _Bar.made = []
    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    assert circuit_run.main([str(folder / "pairs.csv"), "--out", str(tmp_path / "one"), "--model", str(folder),
                             "--device", "cpu", "--method", "eap", "--sizes", "3"]) == 0
    n = len(from_rows(load_model(folder, backend="scratch"), ROWS * 3))
    passed = np.cumsum(_Bar.made[-1].updates)
    after = passed[passed > n]
    assert passed[-1] == 2 * n and len(after) and after[0] - n >= 1, passed  # the first batch of the circuits


def test_the_command_line_hands_ray_the_task_and_every_option(folder, tmp_path, monkeypatch, capsys):
    """``--engine ray``: ``run_ray`` gets the model's name, the pairs, the metric, one step for EAP, the sizes, the
    device, the cluster's address, the actors and the bar; what it returns is written and printed."""
    from analysis.circuits import run as circuit_run

    model = load_model(folder, backend="scratch")
    task = from_rows(model, ROWS * 3)
    expected = AC.edge_scores(model, task, "eap", 1, "prob_diff")
    curve = AC.faithfulness(model, expected, [0, 1])
    asked = []

    def run_ray(*args, **kwargs):
        asked.append((args, kwargs))
        kwargs["progress"](2 * len(task))
        return expected, curve

    monkeypatch.setattr(circuit_run, "run_ray", run_ray)
    monkeypatch.setattr(circuit_run, "check_model", lambda name: None, raising=False)
    out = tmp_path / "ray"
    assert circuit_run.main([str(folder / "pairs.csv"), "--out", str(out), "--model", str(folder), "--device", "cpu",
                             "--method", "eap", "--metric", "prob_diff", "--sizes", "0,1", "--engine", "ray",
                             "--address", "ray://head:10001", "--actors", "3"]) == 0
    (args, kwargs), = asked
    name, pairs, metric, method, steps, sizes = args
    assert (name, metric, method, steps, sizes) == (str(folder), "prob_diff", "eap", 1, [0, 1])
    assert pairs.pairs == task.pairs
    assert {k: v for k, v in kwargs.items() if k != "progress"} == {"device": "cpu", "address": "ray://head:10001",
                                                                  "actors": 3}
    np.testing.assert_array_equal(np.load(out / "scores.npz")["scores"], expected.scores)
    assert capsys.readouterr().out == _printed(expected, curve, out)


def test_a_task_the_model_cannot_run_is_a_sentence_and_exit_status_2(folder, tmp_path, capsys):
    from analysis.circuits import run as circuit_run

    bad = tmp_path / "bad.csv"
    bad.write_text("clean,corrupted,answer,distractor\n\"The cat sat.\",\"The cat sat down on it.\", the, you\n")
    assert circuit_run.main([str(bad), "--out", str(tmp_path / "out"), "--model", str(folder), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("error: ") and "token" in err[-1], err
    assert not (tmp_path / "out").exists()
