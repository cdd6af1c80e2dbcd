"""Inputs that used to be misread silently or to fail without a place: each is refused naming file and line.

Corpora (kd precompute), id files (train-student --exclude-ids) and scored pair files (kd eval --pairs).
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from refusals import read_refused
from typer.testing import CliRunner

from kd.apps.eval import tasks
from kd.cli import app
from kd.common.errors import InputError
from kd.pipeline.inputs import ColumnSpec, read_inputs
from kd.pipeline.rows import build_texts
from kd.student.setup import read_ids

# --- one-column CSV: a stray quote --------------------------------------------------------------------------

def _one_column_csv(path, texts: list[str], stray: dict[int, str]) -> None:
    """A one-column CSV as csv.writer writes it (texts with commas quoted), with raw lines put in at `stray`."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([["text"], *([t] for t in texts)])
    lines = buf.getvalue().splitlines()
    for i, line in sorted(stray.items()):
        lines.insert(i, line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_stray_quote_in_a_one_column_csv_is_refused_naming_its_line(tmp_path, sentences):
    """One column: no line of the swallowed text looks like a row (no delimiter outside quotes), so the
    quote that never closes (the rest of the file became one text) must be caught by its being unclosed."""
    plain = [s for s in sentences if '"' not in s and "," not in s]
    _one_column_csv(tmp_path / "x.csv", plain[:40], {4: '"' + plain[50]})
    read_refused(tmp_path / "x.csv", ColumnSpec(), "x.csv:5", "quote opened on line 5", "never closed")


def test_a_stray_quote_closed_by_a_later_quote_mid_line_is_refused(tmp_path, sentences):
    """Sentences with quotes (csv.writer quotes them): the stray quote ends at the next quoted one, mid-field."""
    texts = [s for s in sentences if "," not in s]
    assert sum('"' in t for t in texts[4:40]) >= 1
    _one_column_csv(tmp_path / "x.csv", texts[:40], {4: '"' + texts[50]})
    read_refused(tmp_path / "x.csv", ColumnSpec(), "x.csv:5", "quote opened on line 5", "closed mid-field")


def test_a_quoted_paragraph_in_a_one_column_csv_is_kept(tmp_path, sentences):
    """Its lines hold commas (that is why it is quoted): well-formed, so one text, not a runaway quote."""
    para = f"{sentences[1]}\n{sentences[2]}"
    assert "," in para
    _one_column_csv(tmp_path / "x.csv", [sentences[0], para, sentences[3]], {})
    assert read_inputs([str(tmp_path / "x.csv")], ColumnSpec()).texts == [sentences[0], para, sentences[3]]


# --- column options on a .txt -------------------------------------------------------------------------------

def test_text_column_on_a_tab_separated_txt_picks_the_column(tmp_path, sentences):
    (tmp_path / "x.txt").write_text("".join(f"{i}\t{s}\n" for i, s in enumerate(sentences[:5])), encoding="utf-8")
    rec = read_inputs([str(tmp_path / "x.txt")], ColumnSpec(text="1"))
    assert rec.texts == sentences[:5]  # not "0\t..." (the option used to be ignored)


@pytest.mark.parametrize("spec, flag", [(ColumnSpec(text="1"), "--text-column"),
                                        (ColumnSpec(pair=("0", "1")), "--pair-columns"),
                                        (ColumnSpec(label="1"), "--label-column")])
def test_column_options_on_a_txt_without_columns_are_refused(tmp_path, sentences, spec, flag):
    (tmp_path / "x.txt").write_text("\n".join(sentences[:5]) + "\n", encoding="utf-8")
    read_refused(tmp_path / "x.txt", spec, flag, "has none", "x.txt:1")


def test_precompute_refuses_text_column_on_a_plain_txt_and_writes_nothing(tmp_path, tiny_teacher, sentences):
    (tmp_path / "x.txt").write_text("\n".join(sentences[:5]) + "\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["precompute", str(tmp_path / "x.txt"), "-t", str(tiny_teacher), "--text-column",
                                 "1", "-o", str(tmp_path / "st"), "--no-progress"])
    assert r.exit_code == 2 and "--text-column" in r.output and "x.txt" in r.output, r.output
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("name", ["x.jsonl", "x.parquet"])
def test_a_delimiter_on_a_format_with_named_fields_is_refused(tmp_path, sentences, name):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if name.endswith(".jsonl"):
        (tmp_path / name).write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences[:3]))
    else:
        pq.write_table(pa.table({"text": sentences[:3]}), tmp_path / name)
    read_refused(tmp_path / name, ColumnSpec(delimiter=";"), "--delimiter", name)


# --- JSONL decode errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, needle", [
    ('{"text": "prices rose \\ud83d sharply"}', "lone surrogate"),
    # kd's bound and fix, not Python's "use sys.set_int_max_str_digits()" (issue 48's fourth probe)
    ('{"text": "x", "label": ' + "9" * 5000 + "}", "an integer of 5000 digits (kd reads at most 40)"),
    ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", "invalid JSON"),
])
def test_jsonl_lines_python_cannot_use_are_refused_naming_file_and_line(tmp_path, sentences, line, needle):
    (tmp_path / "x.jsonl").write_text(json.dumps({"text": sentences[0]}) + "\n" + line + "\n", encoding="utf-8")
    read_refused(tmp_path / "x.jsonl", ColumnSpec(), needle, "x.jsonl:2")


def test_a_surrogate_pair_in_jsonl_is_one_character(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"text": "prices rose \\ud83d\\ude00"}\n', encoding="utf-8")
    table, _ = build_texts(read_inputs([str(tmp_path / "x.jsonl")], ColumnSpec()), dedup=False, pairs=False)
    assert table["text"].to_pylist() == ["prices rose \U0001f600"]


# --- --exclude-ids ------------------------------------------------------------------------------------------

def test_an_id_file_with_a_byte_order_mark_reads(tmp_path):
    (tmp_path / "ids.txt").write_text("-4611686018427387904\n17\n", encoding="utf-8-sig")
    assert read_ids(str(tmp_path / "ids.txt")) == (-4611686018427387904, 17)


@pytest.mark.parametrize("value", [str(2**63), str(-(2**63) - 1), "1" + "0" * 30])
def test_an_id_outside_int64_is_refused_with_its_line(tmp_path, value):
    (tmp_path / "ids.txt").write_text(f"# ids\n17\n{value}\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        read_ids(str(tmp_path / "ids.txt"))
    assert "line 3" in str(e.value) and "64-bit" in str(e.value) and "ids.txt:3" in str(e.value)


# --- kd eval --pairs ------------------------------------------------------------------------------------------

def _stsb_rows(n: int) -> list[str]:
    sts = tasks.load_stsb("dev").head(n)
    return [f"{s}\t{a}\t{b}" for s, a, b in zip(sts.scores, sts.a, sts.b)]


@pytest.mark.parametrize("body", ["", "\n\n", "score\tsentence1\tsentence2\n"])
def test_a_pair_file_without_pairs_is_refused(tmp_path, body):
    (tmp_path / "p.tsv").write_text(body, encoding="utf-8")
    column = "score" if body.startswith("score") else "0"
    with pytest.raises(InputError, match="holds no pairs"):
        tasks.load_pairs(str(tmp_path / "p.tsv"), column)


@pytest.mark.parametrize("bad", ["nan", "inf", ""])
def test_a_gold_score_that_is_not_a_finite_number_is_refused_with_its_row(tmp_path, bad):
    rows = _stsb_rows(5)
    rows[3] = bad + rows[3][rows[3].index("\t"):]
    (tmp_path / "p.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        tasks.load_pairs(str(tmp_path / "p.tsv"), "0")
    assert "p.tsv:4" in str(e.value), str(e.value)


def test_a_nan_score_in_jsonl_pairs_is_refused_with_its_line(tmp_path):
    sts = tasks.load_stsb("dev").head(3)
    lines = [json.dumps({"score": float(s), "sentence1": a, "sentence2": b}) for s, a, b in zip(sts.scores, sts.a,
                                                                                               sts.b)]
    lines[1] = lines[1].replace(f'"score": {float(sts.scores[1])}', '"score": NaN')
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="not a finite number") as e:
        tasks.load_pairs(str(tmp_path / "p.jsonl"), "score")
    assert "p.jsonl:2" in str(e.value)


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_pair_row_with_more_fields_than_its_header_is_refused_with_its_line(tmp_path, suffix):
    """The probe's wart: eval's own pair reader kept such a row, its second text cut at the unquoted delimiter
    (the corpus readers refuse it). A well-formed file with quoted commas still reads."""
    sts = tasks.load_stsb("dev").head(4)
    d = "," if suffix == ".csv" else "\t"
    q = (lambda t: '"' + t.replace('"', '""') + '"') if suffix == ".csv" else (lambda t: t)
    rows = [f"score{d}sentence1{d}sentence2"] + [f"{s}{d}{q(a)}{d}{q(b)}" for s, a, b in zip(sts.scores, sts.a, sts.b)]
    (tmp_path / f"ok{suffix}").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert tasks.load_pairs(str(tmp_path / f"ok{suffix}"), "score").b == sts.b
    rows[3] = f"{sts.scores[2]}{d}{q(sts.a[2])}{d}Half a sentence{d} and the rest"
    (tmp_path / f"p{suffix}").write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="row has 4 fields, the header 3") as e:
        tasks.load_pairs(str(tmp_path / f"p{suffix}"), "score")
    assert f"p{suffix}:4" in str(e.value), str(e.value)


def test_eval_with_an_empty_pair_file_exits_2(tmp_path, tiny_teacher):
    (tmp_path / "p.tsv").write_text("", encoding="utf-8")
    r = CliRunner().invoke(app, ["eval", "--teacher", f"tiny={tiny_teacher}", "--task", "sts", "--pairs",
                                 str(tmp_path / "p.tsv"), "--score-column", "0", "--no-baseline", "--no-progress"])
    assert r.exit_code == 2 and "holds no pairs" in r.output and "p.tsv" in r.output, r.output


def test_a_scored_pair_file_still_reads(tmp_path):
    (tmp_path / "p.tsv").write_text("\n".join(_stsb_rows(6)) + "\n", encoding="utf-8")
    got = tasks.load_pairs(str(tmp_path / "p.tsv"), "0")
    want = tasks.load_stsb("dev").head(6)
    assert got.a == want.a and got.b == want.b and np.allclose(got.scores, want.scores)


@pytest.mark.parametrize("given", ["a,a", "0, 0"])
def test_pair_columns_naming_one_column_twice_are_refused(given):
    """`--pair-columns a,a` made every pair a text with itself, exit 0 (the sixth probe)."""
    from kd.common.inputs import parse_pair_columns

    with pytest.raises(InputError, match="names the same column twice"):
        parse_pair_columns(given)
    assert parse_pair_columns("a,b") == ("a", "b")
