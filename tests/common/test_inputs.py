"""Reading corpora: formats, columns, pairs, segmentation, ids, and the errors users see."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import shared_file

from kd.common.errors import InputError
from kd.common.token_batches import plan_batches
from kd.pipeline.engines.plan import ShardPlan
from kd.pipeline.inputs import ColumnSpec, expand_inputs, read_inputs
from kd.pipeline.rows import build_texts, text_id
from kd.pipeline.segment import segment


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
    rec = read_inputs([str(shared_file("stsb", "sts-test.csv"))], ColumnSpec(pair=("5", "6"), label="4"))
    assert len(rec.texts) == 1379
    table, counts = build_texts(rec, dedup=False, pairs=True)
    assert table.schema.field("label").type == pa.float64()
    assert table["label"].to_pylist()[0] == 2.5
    assert table["text_a"][0].as_py() == "A girl is styling her hair."
    assert len(set(table["id"].to_pylist())) == table.num_rows  # unique even with duplicate pairs


def test_news_segmentation_keeps_doc_and_position():
    rec = read_inputs([str(shared_file("corpus", "news_articles.csv"))], ColumnSpec(text="text"))
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


@pytest.mark.parametrize(("name", "encode", "message", "fix"), [
    ("bom.txt", lambda t: t.encode("utf-16"), "not UTF-8", "iconv -f utf-16"),  # a byte-order mark
    ("le.txt", lambda t: t.encode("utf-16-le"), "NUL characters", "iconv -f utf-16"),  # none: NULs between letters
    ("le.csv", lambda t: ("text\n" + t).encode("utf-16"), "not UTF-8", "iconv -f utf-16"),
    ("latin.txt", lambda t: t.encode("latin1") + "café\n".encode("latin1"), "not UTF-8", "iconv -f latin1"),
    ("twice.txt", lambda t: t.encode("utf-16").decode("latin1").encode("utf-8"), "NUL characters", "ORIGINAL"),
])
def test_a_file_in_another_encoding_gets_the_fix_for_that_encoding(tmp_path, name, encode, message, fix):
    """The probe's I004: a UTF-16 file with its byte-order mark was told to convert from latin1, and the file that
    made (text full of NULs) was accepted."""
    (tmp_path / name).write_bytes(encode("the market fell\nprices rose\n"))
    with pytest.raises(InputError) as e:
        read_inputs([str(tmp_path / name)], ColumnSpec())
    assert message in str(e.value) and fix in e.value.fix and f"{name}:" in str(e.value)


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


def test_batches_run_at_a_steady_rate_of_rows():
    """A pass over sentences and the documents they come from (as --segment sentences+documents writes): half of
    its batches hold about half of its rows, so a bar counting rows has a rate and an ETA that hold from the first
    minutes. Longest first, the documents' batches came first: 3 % of the rows in the first half of the batches."""
    import numpy as np

    rng = np.random.default_rng(1)
    lengths = np.concatenate([rng.integers(8, 60, size=19_000), rng.integers(300, 385, size=1_000)])
    batches = plan_batches(lengths, batch_tokens=4096)
    assert lengths[batches[0]].max() == lengths.max()
    tokens = np.cumsum([len(b) * lengths[b].max() for b in batches])
    rows = np.cumsum([len(b) for b in batches])
    for share in (0.1, 0.25, 0.5, 0.75):  # at each share of the pass's work, about that share of its rows done
        k = int(np.searchsorted(tokens, share * tokens[-1]))
        assert abs(rows[k] / rows[-1] - share) < 0.08, (share, rows[k] / rows[-1])
    assert plan_batches(lengths, 4096)[5].tolist() == batches[5].tolist()  # the same order every time


def test_default_budget_is_cache_sized_on_cpu_and_large_on_gpu(tiny_teacher, sentences):
    """Without --batch-tokens a CPU forward pass gets CPU_BATCH_TOKENS per batch (fewer rows per batch than
    the GPU budget); an exported backend counts as CPU unless it runs ONNX on CUDA."""
    from types import SimpleNamespace

    from kd.common.token_batches import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, default_batch_tokens
    from kd.pipeline.backends.loading import load_teacher
    from kd.pipeline.teacher.batches import _compute_device, encode_all
    from kd.pipeline.teacher.model import Output

    assert default_batch_tokens("cpu") == CPU_BATCH_TOKENS < GPU_BATCH_TOKENS == default_batch_tokens("cuda")
    teacher = load_teacher(str(tiny_teacher), "cpu")
    texts = (sentences * 40)[:2000]
    sizes: dict = {}
    for budget in (None, CPU_BATCH_TOKENS, GPU_BATCH_TOKENS):
        sizes[budget] = []
        encode_all(teacher, texts, [Output.mean], budget, on_batch=sizes[budget].append)
        assert sum(sizes[budget]) == len(texts)
    assert sizes[None] == sizes[CPU_BATCH_TOKENS] and len(sizes[None]) > len(sizes[GPU_BATCH_TOKENS])
    for device, want in ((None, "cpu"), ("cpu", "cpu"), ("cuda:1", "cuda")):
        assert _compute_device(SimpleNamespace(backend=SimpleNamespace(device=device), device=None)) == want


def test_shard_plan_is_disjoint_across_writers():
    plan = ShardPlan(num_rows=1050, shard_rows=100)
    assert plan.num_shards == 11 and plan.bounds(10) == (1000, 1050)
    owned = [plan.owned(i, 3) for i in range(3)]
    assert sorted(sum(owned, [])) == list(range(11)) and not set(owned[0]) & set(owned[1])


@pytest.mark.parametrize("value", ["42", "3.5", "true", '["a", "b"]', '{"t": "x"}'])
def test_jsonl_text_that_is_not_a_string_is_refused(tmp_path, value):
    (tmp_path / "x.jsonl").write_text('{"text": "the market fell"}\n{"text": ' + value + "}\n")
    with pytest.raises(InputError) as e:
        read_inputs([str(tmp_path / "x.jsonl")], ColumnSpec())
    assert "not a string" in str(e.value) and "x.jsonl:2" in str(e.value)


def test_jsonl_null_text_is_a_missing_text_dropped_and_counted(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"text": "the market fell"}\n{"text": null}\n{"text": "prices rose"}\n')
    table, counts = build_texts(read_inputs([str(tmp_path / "x.jsonl")], ColumnSpec()), dedup=False, pairs=False)
    assert table["text"].to_pylist() == ["the market fell", "prices rose"] and counts.empty_dropped == 1


@pytest.mark.parametrize("column", [pa.array([1, 2]), pa.array([["a"], ["b"]]), pa.array([b"a", b"b"]),
                                    pa.array([1.5, 2.5])])
def test_parquet_text_column_that_is_not_string_is_refused(tmp_path, column):
    pq.write_table(pa.table({"text": column}), tmp_path / "x.parquet")
    with pytest.raises(InputError) as e:
        read_inputs([str(tmp_path / "x.parquet")], ColumnSpec())
    assert "text column 'text' has type" in str(e.value) and "x.parquet" in str(e.value)


@pytest.mark.parametrize(("name", "body", "spec"), [
    ("x.txt", "the market fell\nprices rose\n", ColumnSpec()),
    ("x.jsonl", '{"text": "the market fell"}\n{"text": "prices rose"}\n', ColumnSpec()),
    ("x.csv", "text,label\nthe market fell,1\nprices rose,0\n", ColumnSpec(text="text")),
    ("x.tsv", "the market fell\t1\nprices rose\t0\n", ColumnSpec(text="0")),
])
def test_a_byte_order_mark_changes_no_text_and_no_id(tmp_path, name, body, spec):
    (tmp_path / "plain").mkdir()
    (tmp_path / "bom").mkdir()
    (tmp_path / "plain" / name).write_text(body, encoding="utf-8")
    (tmp_path / "bom" / name).write_text(body, encoding="utf-8-sig")  # writes the BOM first
    assert (tmp_path / "bom" / name).read_bytes().startswith(b"\xef\xbb\xbf")
    ids = [build_texts(read_inputs([str(tmp_path / d / name)], spec), dedup=False, pairs=False)[0]
           for d in ("plain", "bom")]
    assert ids[1]["text"].to_pylist() == ["the market fell", "prices rose"]
    assert ids[0]["id"].to_pylist() == ids[1]["id"].to_pylist()


def test_a_stray_quote_swallowing_rows_is_refused_naming_the_line(tmp_path):
    rows = ["text,label", "the market fell,neg", '"prices rose sharply,pos', "the dog runs,pos",
            "stocks fell again,neg", 'a "quoted" word,pos']
    (tmp_path / "x.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(InputError) as e:
        read_inputs([str(tmp_path / "x.csv")], ColumnSpec(text="text", label="label"))
    msg = str(e.value)
    assert "x.csv:3" in msg and "quote opened on line 3" in msg and "look like rows" in msg and "--delimiter" in msg
    # an unclosed quote near the end swallows the rest of the file, even when only the text is read
    (tmp_path / "y.csv").write_text("text,label\nthe market fell,neg\n\"prices rose,pos\nthe dog runs,pos\n")
    with pytest.raises(InputError, match="y.csv:3"):
        read_inputs([str(tmp_path / "y.csv")], ColumnSpec(text="text"))


def test_quoted_multiline_paragraphs_and_literal_quotes_are_kept(tmp_path):
    body = 'text,label\n"first line of a review\nsecond line of it",pos\n"she said ""no"", then left",neg\n'
    (tmp_path / "x.csv").write_text(body)
    rec = read_inputs([str(tmp_path / "x.csv")], ColumnSpec(text="text", label="label"))
    assert rec.texts == ["first line of a review\nsecond line of it", 'she said "no", then left']
    assert rec.doc_ids == ["x.csv:3", "x.csv:4"]


def test_a_runaway_quote_without_delimiters_is_refused_by_size(tmp_path, monkeypatch):
    import kd.common.inputs as si

    monkeypatch.setattr(si, "MAX_QUOTED_FIELD", 50)
    (tmp_path / "x.csv").write_text('text\n"' + "\n".join(["one more swallowed line"] * 5) + "\n")
    with pytest.raises(InputError, match="characters long"):
        read_inputs([str(tmp_path / "x.csv")], ColumnSpec(text="text"))


def test_a_file_given_twice_is_refused(tmp_path):
    """`kd precompute a.txt 'a*.txt'` read a.txt's rows twice, with exit 0 (the probe's I044)."""
    from kd.common.inputs import expand_inputs

    (tmp_path / "a.txt").write_text("one\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("two\n", encoding="utf-8")
    assert expand_inputs([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]) == [str(tmp_path / "a.txt"),
                                                                                 str(tmp_path / "b.txt")]
    with pytest.raises(InputError, match="given twice") as e:
        expand_inputs([str(tmp_path / "a.txt"), str(tmp_path / "*.txt")])
    assert "pass each file once" in e.value.fix
