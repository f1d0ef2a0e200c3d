"""Training a small decoder: the data, a seeded induction head, the history against attend, saving."""
import numpy as np
import pytest
import torch

from models import HeadLensError, load_model
from models.training import TrainConfig, head_scores, induction_batch, repeated_batch, train
from models.training_apart import train_apart

SMALL = TrainConfig(steps=40, log_every=10)


def _repeat(row: list[int]) -> tuple[int, int] | None:
    """The (segment length, start) of a back-to-back repeat of at least 2 tokens in ``row``."""
    L = len(row)
    for n in range(2, L // 2 + 1):
        for s in range(L - 2 * n + 1):
            if row[s:s + n] == row[s + n:s + 2 * n]:
                return n, s
    return None


def test_induction_batches_repeat_a_segment_of_random_length_at_random_offsets():
    tokens = induction_batch(torch.Generator().manual_seed(0), 400, 33, 64)
    assert tokens.shape == (400, 33) and 0 <= int(tokens.min()) and int(tokens.max()) < 64
    found = [_repeat(row) for row in tokens.tolist()]
    assert all(f is not None for f in found)
    lengths = {n for n, _ in found}
    starts = {s for _, s in found}
    assert min(lengths) == 2 and max(lengths) >= 14  # the distance between copies varies ...
    assert len(starts) > 15                            # ... and so does where the repeat begins


def test_held_out_sequences_are_a_half_and_the_same_half_again():
    x = repeated_batch(torch.Generator().manual_seed(1), 5, 32, 64)
    assert torch.equal(x[:, :16], x[:, 16:])


def test_head_scores_on_hand_made_patterns():
    L, half = 8, 4
    prev = torch.zeros(L, L)
    prev[0, 0] = 1
    prev[torch.arange(1, L), torch.arange(L - 1)] = 1
    mixed = torch.zeros(L, L)                       # uniform over the first half; then half on q - 1, half on q - 3
    for q in range(half):
        mixed[q, :q + 1] = 1 / (q + 1)
    for q in range(half, L):
        mixed[q, q - 1] = mixed[q, q - half + 1] = 0.5
    w = torch.stack([prev, mixed]).view(1, 2, L, L)  # one layer, two heads
    s = head_scores(torch.stack([w, w]), half)       # a batch of two
    np.testing.assert_allclose(s["prev_token"], [[1.0, (1 / 2 + 1 / 3 + 1 / 4 + 4 * 0.5) / 7]], rtol=1e-6)
    np.testing.assert_allclose(s["induction"], [[0.0, 0.5]], rtol=1e-6)


def test_config_limits_give_sentences():
    with pytest.raises(HeadLensError, match="n_layers must be a whole number from 1 to 4"):
        TrainConfig(n_layers=5).check()
    with pytest.raises(HeadLensError, match="multiple of n_heads"):
        TrainConfig(n_heads=3, d_model=64).check()
    with pytest.raises(HeadLensError, match="Unknown task"):
        TrainConfig(task="chess").check()


@pytest.fixture(scope="module")
def induction_run():
    return train(TrainConfig(steps=400, log_every=20, seed=0), device="cpu")


def test_a_seeded_run_forms_a_previous_token_head_and_an_induction_head_above_it(induction_run):
    run = induction_run
    reached = run.step_reaching(0.4)
    assert reached is not None and reached <= 400
    last = run.history[run.history.step == run.history.step.max()]
    best = last.loc[last.induction.idxmax()]
    assert best.layer == 1 and best.induction >= 0.6
    assert last[last.layer == 0].prev_token.max() >= 0.4
    first = run.history[run.history.step == 0]
    assert first.induction.max() < 0.1 and first.prev_token.max() < 0.2   # untrained: spread out
    # the phase change: the loss falls once the induction head is there
    by_step = run.history.groupby("step").agg(loss=("loss", "first"), induction=("induction", "max"))
    before = by_step[by_step.induction < 0.2].loss.iloc[1:]
    after = by_step[by_step.induction > 0.6].loss
    assert after.min() < before.min() - 0.5


def test_history_scores_agree_with_scores_recomputed_from_attend(induction_run):
    run = induction_run
    weights = np.stack([r.weights for r in run.model.attend(run.held_out)])   # (B, layers, heads, L, L)
    assert [t for t in run.model.attend(run.held_out[0]).tokens] == run.held_out[0].split(" ")
    scores = head_scores(torch.from_numpy(weights), len(run.probe) // 2)
    last = run.history[run.history.step == run.history.step.max()].sort_values(["layer", "head"])
    np.testing.assert_allclose(last.prev_token.to_numpy(), scores["prev_token"].ravel(), atol=1e-5)
    np.testing.assert_allclose(last.induction.to_numpy(), scores["induction"].ravel(), atol=1e-5)
    step, snapshot = run.snapshots[-1]
    assert step == 400
    np.testing.assert_allclose(snapshot, weights[0], atol=1e-5)   # the probe is the first held-out sequence
    start = run.initial_model().attend(run.held_out[0]).weights
    np.testing.assert_allclose(run.snapshots[0][1], start, atol=1e-6)
    first = run.history[run.history.step == 0].sort_values(["layer", "head"])
    again = head_scores(torch.from_numpy(np.stack([r.weights for r in run.initial_model().attend(run.held_out)])),
                        len(run.probe) // 2)
    np.testing.assert_allclose(first.induction.to_numpy(), again["induction"].ravel(), atol=1e-5)


@pytest.mark.slow
def test_a_run_is_deterministic_for_a_seed():
    a, b = train(SMALL, device="cpu"), train(SMALL, device="cpu")
    c = train(TrainConfig(steps=40, log_every=10, seed=1), device="cpu")
    assert a.history.equals(b.history)
    assert not a.history[["loss", "induction"]].equals(c.history[["loss", "induction"]])
    for (s1, w1), (s2, w2) in zip(a.snapshots, b.snapshots):
        assert s1 == s2 and np.array_equal(w1, w2)


def test_history_has_a_row_per_logged_step_and_head():
    run = train(TrainConfig(steps=30, log_every=10, n_layers=3, n_heads=4), device="cpu")
    h = run.history
    assert list(h.columns) == ["step", "layer", "head", "loss", "prev_token", "induction"]
    assert sorted(h.step.unique()) == [0, 10, 20, 30] and len(h) == 4 * 12
    assert h[h.step == 0].loss.isna().all() and h[h.step > 0].loss.notna().all()
    assert run.snapshots[0][1].shape == (3, 4, 32, 32)


def test_should_stop_ends_the_run_at_that_step_and_keeps_it():
    calls = []

    def stop():
        calls.append(1)
        return len(calls) >= 7
    seen = []
    run = train(TrainConfig(steps=100, log_every=5), device="cpu", should_stop=stop,
                on_step=lambda step, r: seen.append((step, r.steps_done)))
    assert run.stopped and run.steps_done == 7
    assert seen == [(0, 0), (5, 5), (7, 7)] and run.snapshots[-1][0] == 7
    timed = train(TrainConfig(steps=20_000), device="cpu", max_seconds=0.5)
    assert timed.stopped and 0 < timed.steps_done < 20_000


def test_snapshots_are_thinned_to_at_most_the_cap(monkeypatch):
    import models.training as training

    monkeypatch.setattr(training, "MAX_SNAPSHOTS", 4)
    run = train(TrainConfig(steps=50, log_every=5, d_model=16), device="cpu")
    steps = [s for s, _ in run.snapshots]
    assert len(steps) <= 4 and steps[0] == 0 and steps[-1] == 50
    assert steps == sorted(steps) and all(s % 20 == 0 for s in steps[:-1])
    monkeypatch.setattr(training, "MAX_SNAPSHOTS", 200)
    monkeypatch.setattr(training, "SNAPSHOT_BYTES", 3 * 2 * 2 * 32 * 32 * 4)   # room for three probes
    run = train(TrainConfig(steps=50, log_every=5, d_model=16), device="cpu")
    assert len(run.snapshots) <= 3 and run.snapshots[-1][0] == 50


@pytest.mark.slow
def test_text_task_trains_on_the_corpus_or_a_given_text():
    text = "the cat sat on the mat . the dog sat on the log . " * 30
    run = train(TrainConfig(task="text", steps=120, log_every=40, vocab_size=32, seq_len=16), device="cpu",
                text=text)
    by_step = run.history.groupby("step").loss.first()
    assert by_step.iloc[-1] < by_step.iloc[1] - 0.5
    words = run.probe
    assert set(words) <= {"the", "cat", "sat", "on", "mat", ".", "dog", "log"}
    assert run.model.attend(" ".join(words)).tokens == words
    corpus = train(TrainConfig(task="text", steps=2, log_every=1, vocab_size=300), device="cpu")
    assert len(corpus.model.tokenizer) == 300 and len(corpus.probe) == 32
    with pytest.raises(HeadLensError, match="too short"):
        train(TrainConfig(task="text", steps=2), device="cpu", text="hi")


def test_a_trained_model_saves_and_opens_with_the_scratch_engine(induction_run, tmp_path):
    run = induction_run
    folder = run.model.save(tmp_path / "trained")
    assert {"config.json", "model.safetensors"} <= {p.name for p in folder.iterdir()}
    again = load_model(str(folder), backend="scratch")
    text = run.held_out[3]
    np.testing.assert_allclose(again.attend(text).weights, run.model.attend(text).weights, atol=1e-6)
    pruned = run.model.pruned([(1, 0)])
    assert run.model.n_heads == 2 and pruned.attend(text).pruned is not None


def test_a_training_in_its_own_process_gives_the_run_trained_here_and_follows_it_as_it_grows():
    config = TrainConfig(steps=40, log_every=10, n_layers=2, n_heads=2, d_model=16)
    seen = []
    apart = train_apart(config, device="cpu", threads=torch.get_num_threads(),
                        on_step=lambda step, run: seen.append((step, len(run.rows), [s for s, _ in run.snapshots])))
    here = train(config, device="cpu")
    assert apart.history.equals(here.history) and not apart.stopped and apart.steps_done == 40
    assert [s for s, _ in apart.snapshots] == [s for s, _ in here.snapshots]
    for (_, a), (_, b) in zip(apart.snapshots, here.snapshots):
        np.testing.assert_array_equal(a, b)
    for name, weight in here.model.decoder.state_dict().items():
        torch.testing.assert_close(apart.model.decoder.state_dict()[name], weight, rtol=0, atol=0)
    text = here.held_out[3]
    np.testing.assert_array_equal(apart.model.attend(text).weights, here.model.attend(text).weights)
    # each logged step arrived as it was made: the rows and kept snapshots of that step
    assert [(s, n) for s, n, _ in seen] == [(0, 4), (10, 8), (20, 12), (30, 16), (40, 20)]
    assert seen[-1][2] == [0, 10, 20, 30, 40]


def test_a_training_in_its_own_process_stops_when_asked_and_says_why_it_failed():
    asked = []
    run = train_apart(TrainConfig(steps=20_000, log_every=5, d_model=16), device="cpu",
                      should_stop=lambda: bool(asked), on_step=lambda step, r: asked.append(step) if step else None)
    assert run.stopped and 5 <= run.steps_done < 20_000 and run.snapshots[-1][0] == run.steps_done
    with pytest.raises(HeadLensError, match="too short"):
        train_apart(TrainConfig(task="text", steps=2), device="cpu", text="hi")
