"""Reading corpora: formats, columns, pairs, segmentation, ids, and the errors users see."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DATA

from pipeline.inputs import ColumnSpec, expand_inputs, read_inputs
from pipeline.plan import ShardPlan, plan_batches
from pipeline.rows import build_texts, text_id
from pipeline.segment import segment
from storage.errors import InputError


def test_every_format_reads_the_same_texts(tmp_path):
    texts = ["first text", "second, with comma", 'third "quoted"']
    (tmp_path / "a.txt").write_text("\n".join(texts) + "\n")
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts))
    import csv

    with open(tmp_path / "a.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        w.writerows([[i, t] for i, t in enumerate(texts)])
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet")
    for name in ("a.txt", "a.jsonl", "a.csv", "a.parquet"):
        rec = read_inputs([str(tmp_path / name)], ColumnSpec())
        assert rec.texts == texts, name
        assert rec.doc_ids[0].startswith(name + ":")


def test_stsb_pairs_by_index_with_ragged_rows():
    rec = read_inputs([str(DATA / "stsb" / "sts-test.csv")], ColumnSpec(pair=("5", "6"), label="4"))
    assert len(rec.texts) == 1379
    table, counts = build_texts(rec, dedup=False, pairs=True)
    assert table.schema.field("label").type == pa.float64()
    assert table["label"].to_pylist()[0] == 2.5
    assert table["text_a"][0].as_py() == "A girl is styling her hair."
    assert len(set(table["id"].to_pylist())) == table.num_rows  # unique even with duplicate pairs


def test_news_segmentation_keeps_doc_and_position():
    rec = read_inputs([str(DATA / "corpus" / "news_articles.csv")], ColumnSpec(text="text"))
    assert len(rec.texts) == 3824
    cut = (x[:20] for x in (rec.texts, rec.labels, rec.doc_ids, rec.sources))
    rec.texts, rec.labels, rec.doc_ids, rec.sources = cut
    sents = segment(rec)
    assert len(sents.texts) > 100
    first_doc = [p for p, d in zip(sents.positions, sents.doc_ids) if d == sents.doc_ids[0]]
    assert first_doc == list(range(len(first_doc)))
    assert all(t == t.strip() and t for t in sents.texts)


def test_ids_are_stable_and_dedup_counts(tmp_path):
    (tmp_path / "x.txt").write_text("a b\n\n  \na b\nc d\n")
    rec = read_inputs([str(tmp_path / "x.txt")], ColumnSpec())
    t1, c1 = build_texts(rec, dedup=False, pairs=False)
    t2, c2 = build_texts(rec, dedup=True, pairs=False)
    assert (c1.empty_dropped, c1.kept) == (2, 3)
    assert (c2.duplicates_dropped, c2.kept) == (1, 2)
    ids = t1["id"].to_pylist()
    assert ids[0] == text_id("a b", 0) and ids[1] == text_id("a b", 1) and len(set(ids)) == 3
    assert t2["id"].to_pylist() == [ids[0], ids[2]]  # same text -> same id in another store


@pytest.mark.parametrize(
    ("content", "spec", "message", "where"),
    [
        (b"ok\n\xff\xfe bad\n", ColumnSpec(), "not UTF-8", "x.txt:2"),
        (b'{"body": "x"}\n', ColumnSpec(), "column 'text' not in this line (keys: body)", "x.jsonl:1"),
        (b"a,b\n1,2\n", ColumnSpec(text="text"), "column 'text' not in the header (columns: a, b)", "x.csv:1"),
        (b"x\ty\n", ColumnSpec(pair=("0", "3")), "column 3 is missing", "x.tsv:1"),
    ],
)
def test_bad_inputs_name_file_line_and_column(tmp_path, content, spec, message, where):
    name = where.split(":")[0]
    (tmp_path / name).write_bytes(content)
    with pytest.raises(InputError) as e:
        read_inputs([str(tmp_path / name)], spec)
    assert message in str(e.value) and where in str(e.value) and "fix:" in str(e.value)


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(InputError, match="input file not found"):
        expand_inputs([str(tmp_path / "nope.txt")])
    (tmp_path / "x.docx").write_text("x")
    with pytest.raises(InputError, match="unsupported input format"):
        expand_inputs([str(tmp_path / "x.docx")])
    with pytest.raises(InputError, match="no file matches"):
        expand_inputs([str(tmp_path / "*.jsonl")])


def test_plan_batches_respects_budget_and_covers_rows():
    import numpy as np

    lengths = np.random.default_rng(0).integers(3, 200, size=1000)
    batches = plan_batches(lengths, batch_tokens=2048)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(1000))
    assert all(len(b) * lengths[b].max() <= 2048 for b in batches)
    assert lengths[batches[0]].max() == lengths.max()  # longest first: OOM shows up at once


def test_shard_plan_is_disjoint_across_writers():
    plan = ShardPlan(num_rows=1050, shard_rows=100)
    assert plan.num_shards == 11 and plan.bounds(10) == (1000, 1050)
    owned = [plan.owned(i, 3) for i in range(3)]
    assert sorted(sum(owned, [])) == list(range(11)) and not set(owned[0]) & set(owned[1])
