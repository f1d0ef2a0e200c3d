"""Opening a saved profile on Head roles and Foci in AppTest: shown as if computed, bad files refused."""
import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from analysis import FOCI, FOCUS_NAMES, strongest_head
from analysis.profiles import run as cli
from models.corpus import CORPUS
from tests.conftest import downloads, figures, shown

LINES = CORPUS[:12]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A profile of 12 corpus sentences written by the command line: (file bytes, frame, metadata)."""
    folder = tmp_path_factory.mktemp("saved")
    (folder / "c.txt").write_text("\n".join(LINES), encoding="utf-8")
    assert cli.main([str(folder / "c.txt"), "--out", str(folder / "p.parquet")]) == 0
    frame, meta = cli.read_profile(folder / "p.parquet")
    return (folder / "p.parquet").read_bytes(), frame, meta


def open_saved(new_app, page: str, data: bytes, query: dict | None = None):
    at = new_app({"corpus": "saved", **(query or {})}, page=page)
    assert "Open a .parquet profile" in at.info[0].value
    at.get("file_uploader")[0].upload("profile.parquet", data, "application/octet-stream").run()
    assert not at.exception, at.exception
    return at


def rewritten(data: bytes, **changes) -> bytes:
    """``data`` with its HeadLens metadata changed."""
    table = pq.read_table(io.BytesIO(data))
    meta = {**json.loads(table.schema.metadata[b"headlens"]), **changes}
    out = io.BytesIO()
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"headlens": json.dumps(meta).encode()}), out)
    return out.getvalue()


def test_head_roles_shows_a_saved_profile_as_if_computed(new_app, saved):
    data, frame, meta = saved
    at = open_saved(new_app, "app_pages/roles.py", data)
    grid = figures(at)[0]
    assert grid["layout"]["title"]["text"] == "Roles over 12 sentences"
    cells = np.array(grid["data"][0]["text"]).ravel()
    assert [c.replace("<br>", " ") for c in cells] == [r.removesuffix(" focus") for r in frame["label"]]
    table = at.dataframe[0].value
    assert table["label"].tolist() == frame["label"].tolist()
    np.testing.assert_allclose(table["object_lift_lo"], frame["object_lift_lo"], atol=1e-12)
    caption = " ".join(shown(c.value) for c in at.caption)
    assert f"Opened profile.parquet: 12 sentences profiled by HeadLens {meta['headlens']} (local engine)" in caption
    assert meta["corpus_sha256"][:12] in caption
    # no sentences in a file: the page says so instead of examples and similar heads
    assert any("holds each head's measures, not its sentences" in i.value for i in at.info)
    assert not at.tabs and "Profile · Parquet" not in downloads(at)


def test_foci_shows_a_saved_profile(new_app, saved):
    data, frame, _ = saved
    at = open_saved(new_app, "app_pages/foci.py", data)
    assert any("Foci found over 12 sentences" in c.value for c in at.caption)
    titles = [f["layout"]["title"]["text"] for f in figures(at)]
    for f in FOCI:
        row = frame.iloc[strongest_head(frame, f)]
        assert f"{FOCUS_NAMES[f].capitalize()} · L{row['layer']} H{row['head']}" in titles


def test_a_profile_computed_in_the_app_saves_and_opens_again(new_app, hf_model):
    text = "The cat sat on the mat.\nDid the dog bark at the mailman?\nWhich do you like better, coffee or tea?"
    at = new_app({"corpus": "sidebar", "text": text}, page="app_pages/roles.py")
    computed = at.dataframe[0].value
    data = downloads(at)["Profile · Parquet"]
    frame, meta = cli.read_profile(io.BytesIO(data))
    assert (meta["engine"], meta["sentences"], meta["model"]) == ("app", 3, hf_model.name)
    assert meta["corpus_sha256"] == cli.corpus_hash(text.splitlines())[1]
    again = open_saved(new_app, "app_pages/roles.py", data)
    table = again.dataframe[0].value
    assert table["label"].tolist() == computed["label"].tolist()
    np.testing.assert_allclose(table["sentiment_lift"], computed["sentiment_lift"], atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("change, message", [
    ({"model": "bert-base-uncased"}, "is of the model bert-base-uncased, not the sidebar's"),
    ({"format": 0}, "is of format 0"),
    ({"layers": 12}, "do not match the layers and heads"),
    ({"heads_off": "everything"}, "heads switched off is damaged"),
])
def test_a_profile_of_another_model_or_format_gets_a_sentence(new_app, saved, change, message):
    at = open_saved(new_app, "app_pages/roles.py", rewritten(saved[0], **change))
    assert message in shown(at.error[0].value) and not at.get("plotly_chart")


def test_files_that_are_not_profiles_get_a_sentence(new_app, saved, tmp_path):
    at = open_saved(new_app, "app_pages/foci.py", b"layer,head\n0,0\n")
    assert "not a Parquet file" in shown(at.error[0].value)
    plain = io.BytesIO()
    saved[1].to_parquet(plain)
    at = open_saved(new_app, "app_pages/roles.py", plain.getvalue())
    assert "not a HeadLens profile" in shown(at.error[0].value)


def test_a_profile_made_with_heads_off_says_so(new_app, saved):
    at = open_saved(new_app, "app_pages/roles.py", rewritten(saved[0], heads_off=[[2, 3]], causal=False))
    assert "heads switched off: L2 H3" in at.warning[0].value
    assert figures(at)[0]["layout"]["title"]["text"] == "Roles over 12 sentences"
