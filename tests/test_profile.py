"""Profiles at scale: the command line, its Parquet file, merged partial sums, and the Ray engine."""
from __future__ import annotations

import hashlib
import json
import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.profiles import run as cli
from analysis.roles.measure import PROFILE_COLUMNS, HeadProfiler, load_spacy, measure_heads, profile_heads
from harness.browser import free_port
from tests.conftest import ROOT

CORPUS = [s for s in (ROOT / "assets" / "corpus.txt").read_text(encoding="utf-8").splitlines() if s.strip()][:40]


@pytest.fixture(scope="module")
def nlp():
    return load_spacy()


@pytest.fixture(scope="module")
def reference(hf_model, nlp):
    """What ``profile_heads`` gives in-process for the corpus."""
    return profile_heads(hf_model, CORPUS, nlp=nlp)


def assert_same_profile(got: pd.DataFrame, want: pd.DataFrame, tol: float = 1e-6) -> None:
    assert list(got.columns) == list(want.columns) == list(PROFILE_COLUMNS)
    numbers = want.select_dtypes("number").columns
    np.testing.assert_allclose(got[numbers].to_numpy(float), want[numbers].to_numpy(float), rtol=0, atol=tol,
                               equal_nan=True)
    for column in want.columns.difference(numbers):
        assert got[column].tolist() == want[column].tolist(), column


def write_corpus(folder, parts: list[list[str]]) -> None:
    folder.mkdir()
    for i, lines in enumerate(parts):
        (folder / f"part{i}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_cli_writes_what_profile_heads_gives(tmp_path, reference, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS[:20]) + "\n\n   \n" + "\r\n".join(CORPUS[20:]) + "\n", encoding="utf-8")
    out = tmp_path / "profile.parquet"
    assert cli.main([str(corpus), "--out", str(out), "--batch-size", "8"]) == 0
    assert "40 sentences, 72 heads" in capsys.readouterr().out
    frame, meta = cli.read_profile(out)
    assert_same_profile(frame, reference)
    from models import __version__
    assert meta == {"format": cli.FORMAT, "headlens": __version__, "model": "sentence-transformers/all-MiniLM-L6-v2",
                    "backend": "transformers", "engine": "local", "sentences": 40, "skipped": 0,
                    "corpus_sha256": hashlib.sha256("".join(s + "\n" for s in CORPUS).encode()).hexdigest(),
                    "layers": 6, "heads": 12, "heads_off": [], "causal": False}
    # pandas opens it as it is, and the metadata is in the schema
    assert pd.read_parquet(out).shape == (72, len(PROFILE_COLUMNS))
    assert json.loads(pq.read_schema(out).metadata[b"headlens"])["sentences"] == 40


def test_a_folder_is_read_in_name_order_and_chunks_change_nothing(tmp_path, monkeypatch, reference):
    write_corpus(tmp_path / "texts", [CORPUS[:15], CORPUS[15:33], CORPUS[33:]])
    (tmp_path / "texts" / "notes.md").write_text("not a sentence file", encoding="utf-8")
    monkeypatch.setattr(cli, "CHUNK", 7)  # many chunks, each a partial sum
    budget = 2 * 24**2 * 4 * 72  # two 24-token sentences' attention weights
    monkeypatch.setattr(cli, "CHUNK_BYTES", budget)
    groups = []  # the weights' bytes of each group of sentences measured at once
    real_add = HeadProfiler.add
    monkeypatch.setattr(HeadProfiler, "add",
                        lambda self, atts: groups.append([a.weights.nbytes for a in atts]) or real_add(self, atts))
    out = tmp_path / "p.parquet"
    assert cli.main([str(tmp_path / "texts"), "--out", str(out)]) == 0
    frame, meta = cli.read_profile(out)
    assert meta["sentences"] == 40 == sum(map(len, groups))
    assert all(sum(g) <= budget or len(g) == 1 for g in groups) and len(groups) > 40 / 7  # within the budget
    assert_same_profile(frame, reference)


def test_lines_the_model_cannot_read_are_left_out_and_counted(tmp_path, capsys, hf_model, nlp):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS[:6] + ["\u0301", "\u200b\u200b"] + CORPUS[6:10]), encoding="utf-8")
    out = tmp_path / "p.parquet"
    assert cli.main([str(corpus), "--out", str(out)]) == 0
    assert "(1 line the model could not read was left out)" in capsys.readouterr().out
    frame, meta = cli.read_profile(out)
    assert (meta["sentences"], meta["skipped"]) == (10, 1)
    assert_same_profile(frame, profile_heads(hf_model, CORPUS[:10], nlp=nlp))


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    (b"", "no sentences"),
    (" \n\t\n\u200b\n".encode(), "no sentences"),
    ("caf\u00e9 au lait\n".encode("latin-1"), "not UTF-8"),
    ("folder", "holds no .txt file"),
], ids=["missing", "empty", "blank", "latin-1", "empty folder"])
def test_bad_input_gets_a_sentence_and_exit_code_2(tmp_path, capsys, content, message):
    path = tmp_path / "input.txt"
    if content == "folder":
        path = tmp_path / "folder"
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    assert cli.main([str(path), "--out", str(tmp_path / "p.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "p.parquet").exists()


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_an_unknown_model_gets_a_sentence_and_exit_code_2(tmp_path, capsys, engine):
    corpus = tmp_path / "c.txt"
    corpus.write_text("A sentence.\n", encoding="utf-8")
    assert cli.main([str(corpus), "--out", str(tmp_path / "p.parquet"), "--model", str(tmp_path / "nope"),
                     "--engine", engine]) == 2
    err = capsys.readouterr().err
    assert "No model" in err and "was found" in err
    assert "Profiling" not in err  # refused before the progress bar starts


def test_an_output_folder_that_does_not_exist_gets_a_sentence(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("A sentence.\n", encoding="utf-8")
    assert cli.main([str(corpus), "--out", str(tmp_path / "no" / "p.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_merging_three_shards_equals_one_pass(hf_model, nlp):
    attentions = hf_model.attend(CORPUS)
    whole = measure_heads(attentions, nlp)
    shards = [HeadProfiler(nlp) for _ in range(3)]
    for shard, part in zip(shards, (attentions[:9], attentions[9:25], attentions[25:])):
        shard.add(part)
    merged = HeadProfiler(nlp)
    for shard in shards:
        merged.merge(pickle.loads(pickle.dumps(shard)))  # as a worker sends it back
    assert merged.n_sentences == len(CORPUS)
    assert_same_profile(merged.measures().frame(), whole.frame(), tol=1e-9)
    for name in ("prev_token", "object_lift", "cls"):  # each sentence keeps its own number
        np.testing.assert_allclose(merged.measures().per_sentence(name), whole.per_sentence(name), atol=1e-12)


def test_kept_sums_do_not_grow_with_the_corpus(hf_model, nlp):
    """Without per-sentence values a profiler holds per-head sums only: 8x the sentences, same size."""
    attentions = hf_model.attend(CORPUS)
    sizes = []
    for copies in (1, 8):
        profiler = HeadProfiler(nlp, keep_sentences=False)
        profiler.add(attentions * copies)
        sizes.append(len(pickle.dumps(profiler)))
    assert sizes[1] < 1.01 * sizes[0], sizes
    kept = HeadProfiler(nlp)
    kept.add(attentions)
    assert len(pickle.dumps(kept)) > 1.05 * sizes[1]  # the app's profiler does keep each sentence's values


def test_read_profile_refuses_what_is_not_a_profile(tmp_path, reference):
    with pytest.raises(ValueError, match="There is no file"):
        cli.read_profile(tmp_path / "missing.parquet")
    text = tmp_path / "a.parquet"
    text.write_text("not parquet", encoding="utf-8")
    with pytest.raises(ValueError, match="not a Parquet file"):
        cli.read_profile(text)
    plain = tmp_path / "plain.parquet"
    reference.to_parquet(plain)
    with pytest.raises(ValueError, match="no HeadLens metadata"):
        cli.read_profile(plain)
    meta = {"format": cli.FORMAT, "model": "m", "layers": 6, "heads": 12}
    old = tmp_path / "old.parquet"
    cli.write_profile(reference, {**meta, "format": 0}, old)
    with pytest.raises(ValueError, match="format 0"):
        cli.read_profile(old)
    partial = tmp_path / "partial.parquet"
    cli.write_profile(reference.drop(columns=["object_lift_lo", "label"]), meta, partial)
    with pytest.raises(ValueError, match="lacks the columns object_lift_lo, label"):
        cli.read_profile(partial)
    short = tmp_path / "short.parquet"
    cli.write_profile(reference.head(10), meta, short)
    with pytest.raises(ValueError, match="do not match the layers and heads"):
        cli.read_profile(short)
    damaged = tmp_path / "damaged.parquet"
    table = pa.Table.from_pandas(reference).replace_schema_metadata({b"headlens": b"{oops"})
    pq.write_table(table, damaged)
    with pytest.raises(ValueError, match="damaged"):
        cli.read_profile(damaged)


def test_the_ray_engine_equals_profile_heads(tmp_path, monkeypatch, reference, local_ray, capsys):
    write_corpus(tmp_path / "texts", [CORPUS[:25], CORPUS[25:] + ["   ", "\u0301"]])
    monkeypatch.setattr(cli, "CHUNK", 9)  # several batches, so several partial sums to merge
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "ray.parquet"
    assert cli.main([str(tmp_path / "texts"), "--out", str(out), "--engine", "ray"]) == 0
    assert "(1 line the model could not read was left out)" in capsys.readouterr().out
    frame, meta = cli.read_profile(out)
    assert (meta["engine"], meta["sentences"], meta["skipped"]) == ("ray", 40, 1)
    assert meta["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert_same_profile(frame, reference)
    resources = local_ray.available_resources()
    assert resources.get("CPU", 0) > 0  # the actor left CPU for read tasks and is gone


def test_a_ray_address_that_does_not_answer_gets_a_sentence(tmp_path, capsys, local_ray):
    local_ray.shutdown()
    corpus = tmp_path / "c.txt"
    corpus.write_text("A sentence.\n", encoding="utf-8")
    port = free_port()
    assert cli.main([str(corpus), "--out", str(tmp_path / "p.parquet"), "--engine", "ray",
                     "--address", f"127.0.0.1:{port}"]) == 2
    assert f"No Ray cluster answered at 127.0.0.1:{port}" in capsys.readouterr().err


def test_the_ray_engine_refuses_cuda_on_a_cluster_without_gpus(tmp_path, monkeypatch, local_ray, capsys):
    monkeypatch.setattr(local_ray, "cluster_resources", lambda: {"CPU": 2.0})
    corpus = tmp_path / "c.txt"
    corpus.write_text("A sentence.\n", encoding="utf-8")
    assert cli.main([str(corpus), "--out", str(tmp_path / "p.parquet"), "--engine", "ray", "--device", "cuda"]) == 2
    assert "no GPU" in capsys.readouterr().err
