"""--segment sentences+documents (issue 50): a student learns whole documents beside their sentences."""

from __future__ import annotations

import csv

import pyarrow.compute as pc
import pytest
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from typer.testing import CliRunner

from kd.cli import app
from kd.common.ids import row_ids
from kd.pipeline.segment import DOCUMENT
from kd.storage.store import Store


def _precompute(articles, out, teacher, segment: str, *extra: str):
    return CliRunner().invoke(app, ["precompute", str(articles), "--text-column", "text", "--segment", segment,
                                    "-t", f"tiny={teacher}", "-o", str(out), "--no-progress", *extra])


@pytest.fixture
def articles(tmp_path, sentences):
    """20 news documents of three sentences each, and one of a single sentence."""
    path = tmp_path / "articles.csv"
    docs = [" ".join(sentences[3 * i:3 * i + 3]) for i in range(20)] + [sentences[200]]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["doc", "text"])
        w.writerows(enumerate(docs))
    return path, docs


def test_documents_follow_their_sentences_as_rows_of_their_own(tmp_path, articles, tiny_teacher):
    path, docs = articles
    assert _precompute(path, tmp_path / "s", tiny_teacher, "sentences").exit_code == 0
    res = _precompute(path, tmp_path / "sd", tiny_teacher, "sentences+documents")
    assert res.exit_code == 0, res.output
    only = Store.open(str(tmp_path / "s")).read_table("texts")
    both = Store.open(str(tmp_path / "sd")).read_table("texts")
    whole = both.filter(pc.equal(both["position"], DOCUMENT))
    # every multi-sentence document is one more row, its text as written; the one-sentence one is its sentence
    assert sorted(whole["text"].to_pylist()) == sorted(docs[:20])
    assert both.num_rows == only.num_rows + 20
    assert set(only["text"].to_pylist()) <= set(both["text"].to_pylist())
    assert whole["id"].to_pylist() == row_ids(whole["text"].to_pylist()).tolist()  # content-hash ids, as any row
    # each document row shares its doc_id with its sentences
    for doc_id in whole["doc_id"].to_pylist():
        assert pc.sum(pc.equal(both["doc_id"], doc_id)).as_py() >= 2
    vectors = Store.open(str(tmp_path / "sd")).read_table("teachers/tiny")
    assert vectors.num_rows == both.num_rows


def test_a_store_with_document_rows_validates_and_resumes(tmp_path, articles, tiny_teacher):
    """A document row's position (-1) is no damage: kd validate passes the store, and a rerun (a resume after a
    kill, or a --reuse of it) reads its shards back. Both refused it as "position is negative": a killed
    sentences+documents precompute could not resume."""
    path, _ = articles
    out = tmp_path / "sd"
    for _ in range(2):  # the second: every shard read back and checked, nothing to do
        res = _precompute(path, out, tiny_teacher, "sentences+documents", "--shard-rows", "16")
        assert res.exit_code == 0, res.output
    assert "nothing to do" in res.output
    res = CliRunner().invoke(app, ["validate", str(out)])
    assert res.exit_code == 0, res.output
    res = _precompute(path, tmp_path / "again", tiny_teacher, "sentences+documents", "--reuse", str(out))
    assert res.exit_code == 0 and "0 rows encoded" in " ".join(res.output.split()), res.output


def test_documents_and_pairs_do_not_mix(tmp_path, tiny_teacher):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\nthe cat sat.\ta cat sat.\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["precompute", str(pairs), "--pair-columns", "a,b", "--segment",
                                   "sentences+documents", "-t", f"tiny={tiny_teacher}", "-o", str(tmp_path / "o"),
                                   "--no-progress"])
    assert res.exit_code == 2 and "--segment sentences+documents splits documents" in res.output, res.output
    assert not (tmp_path / "o").exists()
