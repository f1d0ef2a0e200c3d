"""The Pruning page in AppTest: its grid, curves, pruned model and ablation are the model's own numbers."""
import io
import re
import zipfile

import numpy as np
import pytest

from models import load_model
from tests.conftest import decode, downloads, figures, heatmaps, shown

SENTENCES = ["Which do you like better, coffee or tea?", "The cat sat on the mat.", "Dogs bark at night.",
             "She reads long books about the sea.", "The sun is hot today.", "We walked to the river.",
             "He plays the piano every evening.", "Birds fly south in winter."]
LINK = {"prune_on": "sidebar", "text": "\n".join(SENTENCES)}


@pytest.fixture(scope="module")
def means(scratch_model):
    return scratch_model.head_means(SENTENCES)


def off(*heads):
    mask = np.ones((6, 12), dtype=np.float32)
    for l, h in heads:
        mask[l, h] = 0
    return mask


def removed(at) -> list[tuple[int, int]]:
    caption = next(shown(c.value) for c in at.caption if c.value.startswith("Removed:"))
    return [(int(l), int(h)) for l, h in re.findall(r"L(\d+) H(\d+)", caption)]


def test_grid_is_each_heads_importance_and_the_curve_point_is_the_pruned_model(new_app, scratch_model, means):
    at = new_app(LINK, page="app_pages/pruning.py")
    grid, curves = figures(at)[:2]
    assert grid["layout"]["title"]["text"].startswith("Importance · 8 sentences · mean ablation")
    z = decode(heatmaps(grid)[0]["z"])
    full = scratch_model.embed(SENTENCES)
    for l, h in [(0, 0), (2, 5), (5, 11)]:  # each head switched off alone, its mean in its place
        alone = scratch_model.embed(SENTENCES, head_mask=off((l, h)), head_means=means)
        assert z[l, h] == pytest.approx(np.mean(1 - np.sum(alone * full, axis=1)), abs=1e-6)
    # 40% by default: 29 heads, drawn grey and listed
    heads = removed(at)
    assert len(heads) == 29
    grey = decode(heatmaps(grid)[1]["z"])
    assert sorted(zip(*np.nonzero(np.isfinite(grey)))) == sorted(heads)
    # the curve's point is that pruned model, measured
    pruned = scratch_model.pruned(heads, head_means=means)
    fidelity = float(np.mean(np.sum(pruned.embed(SENTENCES) * full, axis=1)))
    line = next(t for t in curves["data"] if t["name"] == "by importance" and t["xaxis"] == "x")
    x, y = decode(line["x"]), decode(line["y"])
    assert y[list(x).index(40.3)] == pytest.approx(fidelity, abs=1e-5)
    assert at.metric[0].label == "Fidelity" and at.metric[0].value == f"{fidelity:.3f}"
    assert y[0] == pytest.approx(1.0, abs=1e-6) and len(x) == 11
    assert {t["name"] for t in curves["data"]} == {"by importance", "at random (mean of 3 seeds)", "by attention alone"}
    # the downloaded model is that pruned model
    with zipfile.ZipFile(io.BytesIO(downloads(at)["Pruned model · ZIP"])) as z_file:
        names = z_file.namelist()
        assert {"headlens-pruned/config.json", "headlens-pruned/model.safetensors",
                "headlens-pruned/tokenizer.json"} <= set(names)
        z_file.extractall(at_dir := __import__("tempfile").mkdtemp())
    opened = load_model(f"{at_dir}/headlens-pruned", backend="scratch")
    np.testing.assert_allclose(opened.embed(SENTENCES), pruned.embed(SENTENCES), atol=1e-6)
    importance_csv = downloads(at)["Importance · CSV"].decode().splitlines()
    assert importance_csv[0] == "layer,head,importance,pruned" and len(importance_csv) == 73


def test_prune_to_another_point_and_zero_ablation(new_app, scratch_model):
    at = new_app({**LINK, "ablation": "zero", "prune_to": "50"}, page="app_pages/pruning.py")
    grid = figures(at)[0]
    assert "zero ablation" in grid["layout"]["title"]["text"] and "pruned at 69%" in grid["layout"]["title"]["text"]
    heads = removed(at)
    assert len(heads) == 50
    z = decode(heatmaps(grid)[0]["z"])
    full = scratch_model.embed(SENTENCES)
    alone = scratch_model.embed(SENTENCES, head_mask=off((1, 7)))
    assert z[1, 7] == pytest.approx(np.mean(1 - np.sum(alone * full, axis=1)), abs=1e-6)
    at.select_slider(key="prune_to").set_value(7).run()
    assert len(removed(at)) == 7
    assert at.subheader[0].value == "Pruned to 10%: 7 of 72 heads removed"


def test_switching_heads_off_shows_what_changes_later(new_app, scratch_model, means):
    at = new_app(LINK, page="app_pages/pruning.py")
    at.multiselect(key="ablate").set_value([(3, 4)]).run()
    change = next(f for f in figures(at) if f["layout"]["title"]["text"].startswith("Change in each head"))
    values = decode(heatmaps(change)[0]["z"])
    assert np.isnan(values[3, 4]) and not values[:3].any()
    full = scratch_model.attend(SENTENCES)
    ablated = scratch_model.attend(SENTENCES, head_mask=off((3, 4)), head_means=means)
    expected = np.mean([0.5 * np.abs(a.weights - b.weights).sum(-1).mean(-1) for a, b in zip(full, ablated)], axis=0)
    np.testing.assert_allclose(values[4:], expected[4:], atol=1e-6)
    table = at.dataframe[-1].value
    emb = scratch_model.embed(SENTENCES, head_mask=off((3, 4)), head_means=means)
    np.testing.assert_allclose(table["cosine to the full model"], np.sum(emb * scratch_model.embed(SENTENCES), 1).round(4),
                               atol=1e-4)


def test_what_the_page_cannot_do_it_says(new_app, tiny):
    at = new_app({"model": "custom", "custom_model": str(tiny("bloom"))}, page="app_pages/pruning.py")
    assert "from-scratch engine" in at.info[0].value and not figures(at)
    at = new_app({"prune_on": "sidebar", "text": "Only one sentence here."}, page="app_pages/pruning.py")
    assert "at least two" in at.info[0].value and not figures(at)


def test_a_cold_pages_importance_comes_first_on_its_first_sentences_then_on_all_of_them_in_place(
        new_app, scratch_model, monkeypatch):
    """On a server that has not measured these sentences, the grid is first each head switched off on the first
    sentences alone (``FIRST_SENTENCES``: three here, of six), then on all six, drawn in its place: each measured
    once, each against the model's own embeddings with that head's mean in its place."""
    from app_pages.results import pruning as results
    from app_pages.results import shared
    from app_pages.ui import exports

    texts = ["Rain fell on the old roof.", "A fox crossed the frozen lake.", "The baker opens at six.",
             "Children sang in the hall.", "My brother fixed the bike.", "Clouds hid the mountain top."]
    monkeypatch.setattr(results, "FIRST_SENTENCES", 3)
    measured_on, drawn = [], []
    compute, chart = results.importance.compute, exports.chart

    def measuring(ref, ablation, sentences, method="ablation"):
        measured_on.append(list(sentences))
        return compute(ref, ablation, sentences, method)

    def drawing(fig, key, **kwargs):
        if key.startswith("prune-grid"):
            drawn.append((fig.layout.title.text, np.array(fig.data[0].z, dtype=float)))
        elif key == "prune-curves":
            curves.append((fig.layout.title.text, len(fig.data[0].x)))
        return chart(fig, key, **kwargs)

    curves, notes, leave = [], [], shared.leave_for_later
    monkeypatch.setattr(results.importance, "compute", measuring)
    monkeypatch.setattr(exports, "chart", drawing)
    monkeypatch.setattr(shared, "leave_for_later", lambda result, args, queue, says, how: (
        notes.append((result.name, says)), leave(result, args, queue, says, how)))
    at = new_app({"prune_on": "sidebar", "text": "\n".join(texts)}, page="app_pages/pruning.py")
    assert measured_on == [texts[:3], texts]
    assert notes == [("importance", "A first answer: each head measured on the first 3 of the 6 sentences. The full one"),
                     ("curves", "A first answer: the curves at 3 sizes (none, half and every head pruned), each head "
                      "switched off on the first 3 sentences. The full one")]
    # the curves at 3 sizes on the first three sentences, until the full ones: 11 sizes on the six
    assert curves[0] == ("Pruning curves · 3 sentences · mean ablation", 3) and curves[-1] == (
        "Pruning curves · 6 sentences · mean ablation", 11)
    assert ("Pruning curves · 6 sentences · mean ablation", 3) not in curves  # never at 3 sizes on the six

    def by_hand(sentences, layer, head):
        full = scratch_model.embed(sentences)
        alone = scratch_model.embed(sentences, head_mask=off((layer, head)),
                                    head_means=scratch_model.head_means(sentences))
        return np.mean(1 - np.sum(alone * full, axis=1))

    first, last = drawn[0], figures(at)[0]
    assert first[0] == "Importance · 3 sentences · mean ablation"
    assert last["layout"]["title"]["text"].startswith("Importance · 6 sentences · mean ablation")
    for l, h in [(0, 3), (4, 9)]:
        assert first[1][l, h] == pytest.approx(by_hand(texts[:3], l, h), abs=1e-6)
        assert decode(heatmaps(last)[0]["z"])[l, h] == pytest.approx(by_hand(texts, l, h), abs=1e-6)
    assert by_hand(texts[:3], 4, 9) != pytest.approx(by_hand(texts, 4, 9), abs=1e-6)  # the two forms differ
    assert not [i for i in at.info if i.value.startswith("A first answer")]  # its note gone with it
