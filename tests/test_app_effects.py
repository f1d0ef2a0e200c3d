"""The Effects page in AppTest on SmolLM2: its grids against attribution and patching computed directly, a head
picked by URL and by the picker, your own prompts with their answer among the tokenizer's pieces, bad input,
per-position patching, downloads, and an encoder's sentence."""
import io

import numpy as np
import pandas as pd
import pytest

from analysis.defaults import PAIRS

from analysis.effects import logit_attribution, patch_heads, patch_residual
from tests.conftest import decode, downloads, figures, heatmaps, shown, title_text

PAGE = "app_pages/effects.py"
MARY = PAIRS["Indirect object: Mary and John"]


def grid_of(at, title: str) -> np.ndarray:
    fig = next(f for f in figures(at) if title in title_text(f))
    return decode(heatmaps(fig)[0]["z"])


@pytest.fixture(scope="module")
def expected(smollm2):
    return (logit_attribution(smollm2, MARY.clean, MARY.answer, MARY.distractor),
            patch_heads(smollm2, MARY.clean, MARY.corrupted, MARY.answer, MARY.distractor),
            patch_residual(smollm2, MARY.clean, MARY.corrupted, MARY.answer, MARY.distractor))


def test_the_grids_are_attribution_and_patching_of_the_pair(new_app, expected, smollm2):
    attribution, heads, residual = expected
    at = new_app({"model": "smollm2", "effects_head": "17.4"}, page=PAGE)
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Clean"] == "+6.12" and metrics["Corrupted"] == "-5.49" and metrics["Best head"] == "L23 H3"
    table = next(d.value for d in at.dataframe if "recovered" in d.value.columns)
    assert table["head"].tolist()[:3] == ["L23 H3", "L29 H1", "L24 H4"]
    assert table["recovered"].iloc[0] == pytest.approx(heads["recovered"].max(), abs=1e-6)
    np.testing.assert_allclose(grid_of(at, "Direct logit attribution"),
                               attribution["attribution"].to_numpy().reshape(30, 9), atol=1e-5)
    np.testing.assert_allclose(grid_of(at, "share of the difference recovered"),
                               heads["recovered"].to_numpy().reshape(30, 9), atol=1e-5)
    np.testing.assert_allclose(grid_of(at, "The residual stream"),
                               residual.pivot(index="layer", columns="position", values="recovered"), atol=1e-5)
    fig = next(f for f in figures(at) if "The residual stream" in title_text(f))
    assert fig["layout"]["xaxis"]["ticktext"][8:10] == [",", "John/Mary"]  # as a reader writes them, not "ĠJohn"
    # the head from the link, drawn on both prompts
    assert at.selectbox(key="effects_head").value == (17, 4)
    clean = next(f for f in figures(at) if title_text(f) == "L17 H4 · clean prompt")
    want = smollm2.attend(MARY.clean).weights[17, 4]
    np.testing.assert_allclose(decode(heatmaps(clean)[0]["z"]), np.where(np.triu(np.ones_like(want), 1) > 0, np.nan,
                                                                           want), atol=1e-5)
    caption = next(c.value for c in at.caption if c.value.startswith("L17 H4: recovers"))
    assert "Head detector: **induction**" in caption and "induction 0.8" in caption
    files = downloads(at)
    table = pd.read_csv(io.BytesIO(files["Patching and attribution per head · CSV"]))
    np.testing.assert_allclose(table["recovered"], heads["recovered"], atol=1e-9)
    parts = pd.read_csv(io.BytesIO(files["Every part of the attribution · CSV"]))
    assert parts["attribution"].sum() == pytest.approx(attribution.attrs["logit_diff"], abs=1e-3)
    # the picker moves the outline and the head section
    at.selectbox(key="effects_head").set_value((29, 1)).run()
    assert not at.exception, at.exception
    assert any(title_text(f) == "L29 H1 · corrupted prompt" for f in figures(at))
    assert at.query_params["effects_head"] in ("29.1", ["29.1"])


def test_your_own_prompts_pick_answers_among_the_tokenizers_pieces_and_bad_input_gets_a_sentence(new_app, smollm2):
    at = new_app({"model": "smollm2_scratch"}, page=PAGE)
    at.segmented_control(key="effects_source").set_value("own").run()
    assert not at.exception, at.exception
    at.text_input(key="effects_clean").input("The Eiffel Tower is located in the city of").run()
    at.text_input(key="effects_corrupted").input("The Colosseum is located in the city of").run()
    assert not at.exception, at.exception
    answer = at.selectbox(key="effects_answer")
    paris = smollm2.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
    assert answer.value == paris  # the clean prompt's most likely next token comes first
    assert answer.format_func(paris).startswith("“ Paris” · id 7042 · clean prompt's #1 next token")
    at.selectbox(key="effects_distractor").set_value(smollm2.tokenizer(" Rome", add_special_tokens=False)["input_ids"][0])
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    want = patch_heads(smollm2, "The Eiffel Tower is located in the city of", "The Colosseum is located in the city of",
                       " Paris", " Rome")
    np.testing.assert_allclose(grid_of(at, "share of the difference recovered"),
                               want["recovered"].to_numpy().reshape(30, 9), atol=1e-5)
    at.text_input(key="effects_corrupted").input("The Colosseum is in Rome, in the city of").run()
    assert not at.exception, at.exception
    assert "clean prompt has 10, the corrupted one 12" in shown(at.error[0].value)
    at.text_input(key="effects_corrupted").input("The Colosseum is located in the city of").run()
    assert not at.exception and not at.error


def test_per_position_patching_shows_the_strongest_heads_position_by_position(new_app, smollm2):
    pair = PAIRS["Induction: a repeated sequence"]
    at = new_app({"model": "smollm2", "effects_pair": pair.name, "effects_method": "attribution"}, page=PAGE)
    at.toggle(key="effects_positions").set_value(True).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    fig = next(f for f in figures(at) if "patched at one position" in title_text(f)
               and "heads" in title_text(f))
    rows = fig["layout"]["yaxis"]["ticktext"]
    want = patch_heads(smollm2, pair.clean, pair.corrupted, pair.answer, pair.distractor, per_position=True,
                       method="attribution").set_index(["layer", "head", "position"])["recovered"]
    first = tuple(int(x[1:]) for x in rows[0].split(" "))
    np.testing.assert_allclose(decode(heatmaps(fig)[0]["z"])[0], want.loc[first].to_numpy(), atol=1e-6)
    assert len(rows) == 12 and "Every head at each position · CSV" in downloads(at)


def test_the_default_encoder_gets_the_pair_and_the_task_modes(new_app, scratch_model):
    """MiniLM, the model the app opens with: the founding sentence's objects changed, its grids against patching and
    attribution computed directly, no sentence asking for a decoder; then a task of the relation focus."""
    from analysis.defaults import ENCODER_PAIRS
    from analysis.tasks.effects import run_task, table
    from analysis.tasks.build import make_task

    pair = next(iter(ENCODER_PAIRS.values()))
    at = new_app(page=PAGE)
    assert not at.error and not at.exception, [e.value for e in at.error]
    assert not any("decoder" in i.value for i in at.info)
    heads = patch_heads(scratch_model, pair.clean, pair.corrupted, pair.answer, pair.distractor)
    attribution = logit_attribution(scratch_model, pair.clean, pair.answer, pair.distractor)
    np.testing.assert_allclose(grid_of(at, "share of the difference recovered"),
                               heads["recovered"].to_numpy().reshape(6, 12), atol=1e-5)
    np.testing.assert_allclose(grid_of(at, "Direct attribution · cos(e, “tea”) − cos(e, “juice”)"),
                               attribution["attribution"].to_numpy().reshape(6, 12), atol=1e-5)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Clean"] == f"{heads.attrs['ld_clean']:+.2f}" and metrics["Best head"] == "L5 H5"
    assert "Compared: cos(e, “tea”) − cos(e, “juice”)" in " ".join(shown(c.value) for c in at.caption)
    parts = pd.read_csv(io.BytesIO(downloads(at)["Every part of the attribution · CSV"]))
    assert parts["attribution"].sum() == pytest.approx(attribution.attrs["logit_diff"], abs=1e-4)

    at.segmented_control(key="effects_scope").set_value("task").run(timeout=300)
    at.selectbox(key="task").set_value("relation").run(timeout=300)
    assert not at.error and not at.exception, [e.value for e in at.error]
    effects = run_task(scratch_model, make_task(scratch_model, "relation", 50), "embedding", "attribution")
    frame = table(effects)
    best = frame.loc[frame["mean"].idxmax()]
    shown_table = next(d.value for d in at.dataframe if "95% low" in d.value.columns)
    assert shown_table["head"].iloc[0] == f"L{int(best['layer'])} H{int(best['head'])}" == "L5 H9"
    assert shown_table["recovered"].iloc[0] == pytest.approx(best["mean"], abs=1e-6)
    assert {m.label: m.value for m in at.metric}["Clean"] == f"{effects.clean.mean():+.3f}"


def test_your_own_encoder_pair_takes_probe_texts(new_app):
    at = new_app({"effects_source": "own", "effects_clean": "I like coffee.", "effects_corrupted": "I hate coffee.",
                  "effects_probe_answer": "I like it.", "effects_probe_distractor": "I hate it."}, page=PAGE)
    assert not at.error and not at.exception, [e.value for e in at.error]
    assert "Compared: cos(e, “I like it.”) − cos(e, “I hate it.”)" in " ".join(shown(c.value) for c in at.caption)
    at.text_input(key="effects_corrupted").set_value("I really hate coffee.").run(timeout=300)
    assert "both need as many tokens" in at.error[0].value


def test_a_heads_vocabulary_the_copying_grid_and_the_routes_are_what_they_say(new_app, smollm2):
    from analysis.effects.routes import flow_graph, flow_heads, prediction_flow
    from analysis.effects.vocabulary import copying_scores, head_vocabulary

    at = new_app({"model": "smollm2", "effects_head": "23.3", "effects_copying": "true"}, page=PAGE)
    assert not at.error, [e.value for e in at.error]
    # what the head writes at the prediction, on both prompts: the bars are head_vocabulary's logits
    for prompt, what in ((MARY.clean, "clean"), (MARY.corrupted, "corrupted")):
        fig = next(f for f in figures(at) if title_text(f) == f"What L23 H3 writes at “to” ({what})")
        want = head_vocabulary(smollm2, prompt, 23, 3)
        bars = fig["data"][0]
        order = pd.concat([want[want["direction"] == "up"], want[want["direction"] == "down"].iloc[::-1]])
        np.testing.assert_allclose(decode(bars["x"]), order["logit"], atol=1e-5)
        assert [c[0] for c in bars["customdata"]] == order["token"].tolist()
    clean_down = next(f for f in figures(at) if title_text(f) == "What L23 H3 writes at “to” (clean)")["data"][0]
    assert "“ John”" in clean_down["hovertext"][-1]  # the repeated subject, the token it lowers most
    # the copying grid: copying less suppression for every head
    scores = copying_scores(smollm2)
    grid = grid_of(at, "Copying (red) and suppression (blue)")
    np.testing.assert_allclose(grid, (scores["copying"] - scores["suppression"]).to_numpy().reshape(30, 9), atol=1e-9)
    # the routes: one line's middle per drawn edge (heads of one token pair together), the table from flow_heads
    flow = prediction_flow(smollm2, MARY.clean)
    fig = next(f for f in figures(at) if title_text(f).startswith("The routes to “to”"))
    edges = next(t for t in fig["data"] if t.get("name") == "edges")
    graph = flow_graph(flow)
    assert len(edges["hovertext"]) == graph.groupby(["kind", "layer", "source", "target", "from_level"]).ngroups
    assert any(text.startswith("L23 H0 0.107") and "Mary → to" in text for text in edges["hovertext"])
    table = next(d.value for d in at.dataframe if "passes through it" in d.value.columns)
    through = flow_heads(flow)
    top = np.argsort(-through, axis=None, kind="stable")[:10]
    assert table["head"].tolist() == [f"L{i // 9} H{i % 9}" for i in top]
    np.testing.assert_allclose(table["passes through it"], through.reshape(-1)[top], atol=1e-9)
    # a higher threshold draws fewer edges; the corrupted prompt and another token have routes of their own
    at.slider(key="effects_threshold").set_value(0.2).run()
    at.segmented_control(key="effects_flow_prompt").set_value("corrupted").run()
    at.selectbox(key="effects_flow_at").set_value(9).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    fig = next(f for f in figures(at) if title_text(f).startswith("The routes to “Mary” (corrupted prompt)"))
    graph = flow_graph(prediction_flow(smollm2, MARY.corrupted), 9, 0.2)
    edges = next(t for t in fig["data"] if t.get("name") == "edges")
    assert len(edges["hovertext"]) == graph.groupby(["kind", "layer", "source", "target", "from_level"]).ngroups
    assert at.query_params["effects_threshold"] in ("0.2", ["0.2"])
    files = downloads(at)
    routes = pd.read_csv(io.BytesIO(files["The routes drawn, one edge a row · CSV"]))
    np.testing.assert_allclose(routes["share"], graph["share"], atol=1e-9)
    written = pd.read_csv(io.BytesIO(files["What L23 H3 writes, both prompts · CSV"]))
    assert set(written["prompt"]) == {"clean", "corrupted"} and len(written) == 40


def test_one_view_runs_each_prompt_once_and_a_head_click_none_again(new_app, smollm2, monkeypatch):
    """Attribution, both patchings, the vocabulary, the routes and the heatmaps read one trace of each prompt
    (TransformerLens's clean cache): the model embeds the clean prompt once and the corrupted once; the patched
    copies start from the trace's residual stream. Picking another head runs neither again."""
    from app_pages.results import shared
    from models.stacks.llama import Llama

    pair = PAIRS["Indirect object: Anna and James"]
    ids = {what: tuple(smollm2.tokenizer(text)["input_ids"]) for what, text in
           (("clean", pair.clean), ("corrupted", pair.corrupted))}
    runs, real = [], Llama.embed

    def counting(self, input_ids, token_type_ids=None):
        runs.extend(tuple(row) for row in input_ids.tolist())
        return real(self, input_ids, token_type_ids)

    monkeypatch.setattr(shared, "_caches", {})  # nothing of this pair computed before; the run's caches come back after
    monkeypatch.setattr(Llama, "embed", counting)
    at = new_app({"model": "smollm2", "effects_pair": pair.name}, page=PAGE)
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key="effects_pair").value == pair.name
    assert [runs.count(ids["clean"]), runs.count(ids["corrupted"])] == [1, 1]
    at.selectbox(key="effects_head").set_value((20, 1)).run()
    assert not at.exception and any(title_text(f) == "L20 H1 · corrupted prompt" for f in figures(at))
    assert [runs.count(ids["clean"]), runs.count(ids["corrupted"])] == [1, 1]
