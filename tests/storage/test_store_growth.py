"""Stores grow in place (issue 40): `kd precompute --add-to STORE` adds outputs or a teacher with only the new
options (the store's inputs and row options are reused, its rows not encoded again), and a store made from other
inputs or settings is refused naming what differs, never with --overwrite as the fix."""

from __future__ import annotations

import csv

import pytest
from conftest import build_tiny_bert
from typer.testing import CliRunner

import kd
from kd.cli import app
from kd.storage.store import Store
from kd.storage.validate import validate

SHARD_ROWS = "25"


def _cli(*args: str):
    return CliRunner().invoke(app, [*args, "--no-progress"])


@pytest.fixture
def articles(tmp_path, sentences):
    """A CSV of 20 documents of three sentences each (an id column first: --text-column matters)."""
    path = tmp_path / "articles.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["doc", "text"])
        for i in range(20):
            w.writerow([i, " ".join(sentences[3 * i:3 * i + 3])])
    return path


@pytest.fixture
def store(tmp_path, articles, tiny_teacher):
    """The store `kd precompute articles.csv --text-column text --segment sentences --shard-rows 25` made."""
    out = tmp_path / "store"
    res = _cli("precompute", str(articles), "--text-column", "text", "--segment", "sentences", "--shard-rows",
               SHARD_ROWS, "-t", f"tiny={tiny_teacher}", "-o", str(out))
    assert res.exit_code == 0, res.output
    return out


def _shard_bytes(root, table: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / table).glob("part-*.parquet"))}


def test_outputs_and_a_teacher_are_added_with_only_the_new_options(store, tiny_teacher, tmp_path):
    before = _shard_bytes(store, "teachers/tiny")
    texts = _shard_bytes(store, "texts")
    assert len(before) >= 2  # the sentences made more than one shard

    res = _cli("precompute", "--add-to", str(store), "-t", f"tiny={tiny_teacher}", "--outputs", "vocab")
    assert res.exit_code == 0, res.output
    assert "wrote the per-teacher outputs" in res.output and "0 rows encoded" in res.output, res.output

    second = build_tiny_bert(tmp_path / "tiny2", seed=3)
    grown = kd.precompute(add_to=str(store), teachers=[f"tiny2={second}"], progress=False)  # the Python API too

    assert _shard_bytes(store, "teachers/tiny") == before  # the first teacher's rows were not encoded again
    assert _shard_bytes(store, "texts") == texts
    m = grown.manifest
    assert "teachers/tiny/vocab.safetensors" in m.extras["files"]
    assert m.is_complete("teachers/tiny2") and m.inputs["options"]["segment"] == "sentences"
    for k in sorted(m.tables["texts"].shards):  # the new table is aligned with the texts, row for row
        assert grown.read_shard("teachers/tiny2", k)["id"].equals(grown.read_shard("texts", k)["id"])
    assert validate(Store.open(store)) == []


def test_a_changed_input_file_is_named(store, articles, tmp_path):
    with articles.open("a", encoding="utf-8") as f:
        f.write("99,One more document.\n")
    second = build_tiny_bert(tmp_path / "tiny2", seed=3)
    res = _cli("precompute", "--add-to", str(store), "-t", f"tiny2={second}")
    assert res.exit_code == 2 and (res.exception is None or isinstance(res.exception, SystemExit)), res.output
    out = " ".join(res.output.split())
    assert str(articles) in out and "changed since the store was made" in out and "restore" in out, out
    assert "--overwrite" not in out.replace("--overwrite would delete", "")
    assert "teachers/tiny2" not in Store.open(store).manifest.tables  # refused before anything was written

    articles.unlink()
    res = _cli("precompute", "--add-to", str(store), "-t", f"tiny2={second}")
    assert res.exit_code == 2 and "input file of the store is missing" in res.output and articles.name in res.output


def test_explicit_inputs_that_differ_name_the_setting_and_both_values(store, articles, tiny_teacher):
    before = _shard_bytes(store, "teachers/tiny")
    res = _cli("precompute", str(articles), "--text-column", "text", "-t", f"tiny={tiny_teacher}", "-o", str(store),
               "--outputs", "vocab,init", "--shard-rows", SHARD_ROWS)
    out = " ".join(res.output.split())
    assert res.exit_code == 2, out
    assert "--segment: the store has 'sentences', this run 'none'" in out, out
    assert f"--add-to {store}" in out and "--overwrite" not in out, out
    assert _shard_bytes(store, "teachers/tiny") == before

    res = _cli("precompute", "--add-to", str(store), "-t", f"tiny={tiny_teacher}", "--dedup", "--outputs", "vocab")
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "--dedup: the store has off, this run on" in out, out

    res = _cli("precompute", "--add-to", str(store), "-t", f"tiny={tiny_teacher}", "--dtype", "float16",
               "--outputs", "vocab")
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "--dtype: the store has 'float32', this run 'float16'" in out, out
    assert "--overwrite" not in out and _shard_bytes(store, "teachers/tiny") == before
