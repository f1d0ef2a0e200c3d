"""Tasks of many prompt pairs on tiny random Llama and Gemma 3 models: the task's per-pair values and averages
against the one-pair functions of analysis.effects (themselves checked against transformers' hooks in
test_effects.py), batching, the intervals' coverage and the sign-flip p-values by simulation, and a user's
CSV with bad rows."""
import numpy as np
import pytest
import torch

from analysis.effects import logit_attribution, patch_heads, patch_residual
from analysis.stats import corrected, interval, sign_flip_p
from analysis.tasks.effects import run_task, table
from analysis.tasks.build import Task, from_csv, from_rows
from models import HeadLensError, load_model
from tests import test_gemma3, test_llama

# pairs of three lengths, sharing many first tokens with their corrupted prompt, a few, or none
ROWS = [{"clean": c, "corrupted": k, "answer": " the", "distractor": " you"} for c, k in [
    ("The cat sat on the mat because it was warm.", "The cat sat on the mat because it was cold."),
    ("The cat sat on the mat.", "The mat sat on the cat."),
    ("Please close the door.", "Please close the room."),
    ("Which do you like better, coffee or tea?", "Which do you like better, tea or coffee?"),
    ("Hello world!", "Hi world!")]]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"tasks-{request.param}")
    if request.param == "llama":
        test_llama.build("llama", folder)
    else:
        test_gemma3.build(folder, 2)
    model = load_model(folder, backend="scratch")
    model.stack.double()  # the averages are compared at 1e-6: float64, so rounding does not decide
    return model


def _task(model) -> Task:
    task = from_rows(model, ROWS)
    assert not task.problems and len({len(p) for p in task.pairs}) >= 3
    return task


@pytest.mark.parametrize("method", ["exact", "attribution"])
def test_a_tasks_values_are_each_pairs_own_and_its_averages_their_means(tiny, method):
    task = _task(tiny)
    effects = run_task(tiny, task, method=method, batch_pairs=3)
    L, H = tiny.n_layers, tiny.n_heads
    heads, attributions, lds = [], [], []
    for i, p in enumerate(task.pairs):
        one = patch_heads(tiny, p.clean, p.corrupted, p.answer, p.distractor, method=method)
        heads.append(one["recovered"].to_numpy().reshape(L, H))
        lds.append((one.attrs["ld_clean"], one.attrs["ld_corrupted"]))
        attributions.append(logit_attribution(tiny, p.clean, p.answer, p.distractor)["attribution"]
                            .to_numpy().reshape(L, H))
        residual = patch_residual(tiny, p.clean, p.corrupted, p.answer, p.distractor, method=method)
        grid = residual["recovered"].to_numpy().reshape(L, len(p))
        for r, role in enumerate(effects.roles):
            np.testing.assert_allclose(effects.recovered("residual")[i, :, r], grid[:, p.role(role)], atol=1e-6)
    lds = np.array(lds)
    np.testing.assert_allclose(effects.clean, lds[:, 0], atol=1e-6)
    np.testing.assert_allclose(effects.corrupted, lds[:, 1], atol=1e-6)
    np.testing.assert_allclose(effects.recovered("heads"), np.stack(heads), atol=1e-6)
    np.testing.assert_allclose(effects.attribution, np.stack(attributions), atol=1e-6)

    by_pair = table(effects, "heads", "pair")
    np.testing.assert_allclose(by_pair["mean"].to_numpy().reshape(L, H), np.mean(heads, axis=0), atol=1e-6)
    by_set = table(effects, "heads", "set")
    patched = np.stack(heads) * (lds[:, 0] - lds[:, 1])[:, None, None] + lds[:, 1][:, None, None]
    expected = (patched.mean(0) - lds[:, 1].mean()) / (lds[:, 0].mean() - lds[:, 1].mean())
    np.testing.assert_allclose(by_set["mean"].to_numpy().reshape(L, H), expected, atol=1e-6)
    assert (by_set["low"] <= by_set["mean"] + 1e-12).all() and (by_set["mean"] <= by_set["high"] + 1e-12).all()
    np.testing.assert_allclose(table(effects, "attribution")["mean"].to_numpy().reshape(L, H),
                               np.mean(attributions, axis=0), atol=1e-6)


def test_batching_leaves_every_pairs_values_as_they_are(tiny):
    task = _task(tiny)
    alone, together = run_task(tiny, task, batch_pairs=1), run_task(tiny, task, batch_pairs=16)
    for field in ("clean", "corrupted", "attribution", "heads", "residual", "role_attention"):
        np.testing.assert_allclose(getattr(alone, field), getattr(together, field), atol=1e-9)


def test_the_role_attention_is_the_heads_weight_from_the_last_token(tiny):
    task = _task(tiny)
    effects = run_task(tiny, task, method="attribution")
    for i, p in enumerate(task.pairs):
        weights = tiny.attend(p.clean).weights                     # (L, H, n, n), the model's own attention
        for r, role in enumerate(effects.roles):
            np.testing.assert_allclose(effects.role_attention[i, :, :, r], weights[:, :, -1, p.role(role)], atol=1e-5)


def test_keeping_the_pairs_a_model_gets_right_keeps_their_rows(tiny):
    effects = run_task(tiny, _task(tiny), method="attribution")
    right = effects.correct
    assert right.tolist() == (effects.clean > 0).tolist()
    if right.any():
        kept = effects.only(right)
        assert len(kept.task) == right.sum() and kept.accuracy == 1.0
        np.testing.assert_array_equal(kept.heads, effects.heads[right])


def test_a_95_percent_interval_covers_the_mean_about_95_times_in_100():
    rng = np.random.default_rng(0)
    values = rng.normal(0.3, 1.0, size=(40, 400))           # 400 experiments of 40 pairs, true mean 0.3
    low, high = interval(values, resamples=1000)
    coverage = np.mean((low <= 0.3) & (0.3 <= high))
    assert 0.90 <= coverage <= 0.98
    spans = rng.normal(2.0, 0.3, size=40)                   # a ratio of means: true value 0.3 / 2.0
    effects = rng.normal(0.3, 1.0, size=(40, 400))
    low, high = interval(effects, spans + 0 * effects[:, 0])
    assert 0.88 <= np.mean((low <= 0.15) & (0.15 <= high)) <= 0.99


def test_the_sign_flip_p_value_of_no_effect_is_uniform_and_of_a_real_one_small():
    rng = np.random.default_rng(1)
    p = sign_flip_p(rng.normal(0, 1, size=(30, 500)), permutations=999)
    assert abs(np.mean(p < 0.05) - 0.05) < 0.03 and abs(np.mean(p < 0.5) - 0.5) < 0.07
    assert sign_flip_p(rng.normal(1.0, 1.0, size=(30, 3)))[0] < 0.01
    assert sign_flip_p(np.zeros((10, 2)))[0] == 1.0


def test_benjamini_hochberg_by_its_definition():
    p = np.array([0.01, 0.04, 0.03, 0.20])
    # sorted p: 0.01, 0.03, 0.04, 0.20 -> p * m / rank = 0.04, 0.06, 0.0533, 0.20; then the running minimum from the top
    np.testing.assert_allclose(corrected(p), [0.04, 0.0533333, 0.0533333, 0.20], atol=1e-6)


def test_a_csvs_bad_rows_each_get_a_sentence_and_the_good_rows_go_on(tiny):
    text = ("clean,corrupted,answer,distractor\n"
            f"{ROWS[1]['clean']},{ROWS[1]['corrupted']}, the, you\n"
            "The cat sat on the mat.,The dog sat on the mat., the, you\n"
            f"{ROWS[1]['clean']},{ROWS[1]['corrupted']}, the cat, you\n"
            ",The cat sat., the, you\n"
            f"{ROWS[1]['clean']},{ROWS[1]['corrupted']}, the, the\n"
            f"{ROWS[2]['clean']},{ROWS[2]['corrupted']}, the, you\n")
    task = from_csv(tiny, text)
    assert len(task) == 2 and [p.clean for p in task.pairs] == [ROWS[1]["clean"], ROWS[2]["clean"]]
    problems = " ".join(task.problems)
    assert "Row 3: the clean prompt is" in problems and "same number of tokens" in problems
    assert "Row 4: its answer ' the cat' is" in problems
    assert "Row 5: the clean prompt is empty" in problems
    assert "Row 6: its answer and distractor are the same token" in problems
    assert len(task.problems) == 4
    limited = from_csv(tiny, text.replace(",The cat sat.,", f",{ROWS[1]['corrupted']},"), limit=1)
    assert len(limited) == 1 and "Rows 3 to 7 are past the limit of 1 pairs" in limited.problems[-1]
    with pytest.raises(HeadLensError, match="lacks distractor"):
        from_csv(tiny, "clean,corrupted,answer\na,b,c\n")
    with pytest.raises(HeadLensError, match="No row could be made a pair"):
        from_csv(tiny, "clean,corrupted,answer,distractor\n,,,\n")
    first = task.pairs[0]
    differ = next(i for i, (a, b) in enumerate(zip(first.clean_ids, first.corrupted_ids)) if a != b)
    assert first.roles == (("DIFF", differ), ("END", len(first) - 1))


def test_a_greater_than_metric_on_pairs_without_years_gets_a_sentence(tiny):
    with pytest.raises(HeadLensError, match="choose the greater_than task"):
        run_task(tiny, _task(tiny), "greater_than")
    with pytest.raises(HeadLensError, match="Unknown metric"):
        run_task(tiny, _task(tiny), "accuracy")


def test_a_probability_metric_is_the_softmaxs_difference(tiny):
    task = _task(tiny)
    effects = run_task(tiny, task, "prob_diff", method="attribution")
    stack = tiny.stack
    for i, p in enumerate(task.pairs):
        with torch.inference_mode():
            x, _ = stack.run_layers(stack.embed(torch.tensor([p.clean_ids], device=tiny.device)), need_weights=False)
            probs = torch.softmax(stack.logits(stack.finish(x))[0, -1], -1)
        assert effects.clean[i] == pytest.approx(float(probs[p.answer] - probs[p.distractor]), abs=1e-9)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tasks-cli")
    test_llama.build("llama", folder)
    csv = folder / "pairs.csv"
    csv.write_text("clean,corrupted,answer,distractor\n" + "".join(
        f"\"{r['clean']}\",\"{r['corrupted']}\",{r['answer']},{r['distractor']}\n" for r in ROWS * 3)
        + "\"Hello world!\",\"Hi there world!\", the, you\n")
    return folder, csv


def _cli_values(folder, out, *extra):
    from analysis.tasks import run as task_run

    assert task_run.main([str(folder / "pairs.csv"), "--out", str(out), "--model", str(folder), "--device", "cpu",
                          *extra]) == 0
    return np.load(out / "values.npz")


def test_the_command_line_writes_the_tasks_values_and_tables(tiny_folder, tmp_path, capsys):
    folder, _ = tiny_folder
    got = _cli_values(folder, tmp_path / "local", "--method", "attribution")
    printed = capsys.readouterr()
    assert "Row 17: the clean prompt is" in printed.err and "15 pairs; the model gets" in printed.out
    model = load_model(folder, backend="scratch")
    expected = run_task(model, from_rows(model, ROWS * 3), method="attribution")
    for field in ("clean", "corrupted", "heads", "residual", "attribution"):
        np.testing.assert_allclose(got[field], getattr(expected, field), atol=1e-5)
    import pandas as pd

    heads = pd.read_csv(tmp_path / "local" / "heads.csv")
    np.testing.assert_allclose(heads["mean"], table(expected)["mean"], atol=1e-5)
    assert list(pd.read_csv(tmp_path / "local" / "residual.csv")["role"].unique()) == ["DIFF", "END"]


def test_the_ray_engine_gives_the_local_result_for_the_same_pairs(tiny_folder, tmp_path, local_ray, monkeypatch):
    from analysis.tasks import run as task_run

    folder, _ = tiny_folder
    monkeypatch.setattr(task_run, "CHUNK", 4)  # several batches, each of several lengths
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    local = _cli_values(folder, tmp_path / "local")
    ray = _cli_values(folder, tmp_path / "ray", "--engine", "ray")
    for field in task_run.FIELDS:
        np.testing.assert_allclose(ray[field], local[field], rtol=1e-5, atol=1e-5)  # float32, other batches
