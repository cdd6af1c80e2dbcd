"""issue 41: delimited files a reader used to misread or crash on, refused with what, where and a fix, by the one
reader `kd precompute` and `kd finetune` share."""

from __future__ import annotations

import pytest
from refusals import read_refused
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError
from kd.common.inputs import ColumnSpec, read_inputs
from kd.common.tasks import Task, read_splits

STRAY = '"a stray "quote" inside'




def test_a_stray_quote_in_a_one_column_csv_is_refused_with_its_line(tmp_path):
    """It was read as `a stray quote" inside` (exit 0)."""
    (tmp_path / "x.csv").write_text(f"text\nfine\n{STRAY}\nafter\n", encoding="utf-8")
    read_refused(tmp_path / "x.csv", ColumnSpec(), "x.csv:3", "not well-formed CSV", '""')


def test_the_same_quote_is_refused_alike_in_several_columns_and_in_finetune_files(tmp_path):
    (tmp_path / "two.csv").write_text(f"text,label\nfine,0\n{STRAY},1\n", encoding="utf-8")
    read_refused(tmp_path / "two.csv", ColumnSpec(label="label"), "two.csv:3", "not well-formed CSV")
    with pytest.raises(InputError, match="not well-formed CSV") as e:
        read_splits([str(tmp_path / "two.csv")], None, Task.classification)
    assert "two.csv:3" in str(e.value)


def test_well_formed_quotes_are_kept(tmp_path):
    (tmp_path / "x.csv").write_text('text\n"a, b"\n"say ""hi"""\nhe said "hi"\n', encoding="utf-8")
    assert read_inputs([str(tmp_path / "x.csv")], ColumnSpec()).texts == ["a, b", 'say "hi"', 'he said "hi"']


def test_backslash_t_as_delimiter_means_a_tab(tmp_path):
    (tmp_path / "x.csv").write_text("text\tlabel\nthe market fell\t1\n", encoding="utf-8")
    spec = ColumnSpec.from_options(label_column="label", delimiter="\\t")
    assert spec.delimiter == "\t" and read_inputs([str(tmp_path / "x.csv")], spec).texts == ["the market fell"]


def test_a_store_made_with_backslash_t_resumes_with_a_real_tab(tmp_path, tiny_teacher):
    """Both spellings mean a tab, so they are one store: the record holds the character read. (A store made with
    `'\\t'` used to refuse the same run typed with a real tab as "other inputs or settings".)"""
    (tmp_path / "x.csv").write_text("text\tlabel\nthe market fell\t1\nrates rose\t0\n", encoding="utf-8")
    base = ["precompute", str(tmp_path / "x.csv"), "-t", f"tiny={tiny_teacher}", "-o", str(tmp_path / "st"),
            "--label-column", "label", "--no-progress", "--delimiter"]
    first = CliRunner().invoke(app, [*base, "\\t"])
    assert first.exit_code == 0 and "2 rows encoded" in first.output, first.output
    again = CliRunner().invoke(app, [*base, "\t"])
    assert again.exit_code == 0 and "already complete for tiny: nothing to do" in again.output, again.output


@pytest.mark.parametrize("delimiter", [";;", "ab", '"'])
def test_a_delimiter_csv_cannot_take_is_refused_at_parse(tmp_path, tiny_teacher, delimiter):
    (tmp_path / "x.csv").write_text("text\nhello\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["precompute", str(tmp_path / "x.csv"), "-t", str(tiny_teacher), "-o",
                                 str(tmp_path / "st"), "--delimiter", delimiter, "--no-progress"])
    assert r.exit_code == 2 and "--delimiter" in r.output and "fix:" in r.output, r.output
    assert not isinstance(r.exception, TypeError) and not (tmp_path / "st").exists()


def test_a_semicolon_csv_read_with_commas_says_which_delimiter_to_pass(tmp_path):
    (tmp_path / "x.csv").write_text("text;label\nhello;1\n", encoding="utf-8")
    msg = read_refused(tmp_path / "x.csv", ColumnSpec(label="label"), "x.csv:1", "--delimiter ';'")
    assert "not in the header" in msg


@pytest.mark.parametrize("name, content, line, fix", [
    ("comma.csv", "id,text\n1,Hello, world and more\n2,Plain text\n", 2, 'quote the field ("Hello, world")'),
    ("ragged.csv", "text,label\nhello,1,extra,cols\nworld\n", 2, "--delimiter"),
    ("tab.tsv", 'text\tlabel\nhe said "hi\tthere\t1\nok\t0\n', 2, "remove the tab"),
])
def test_a_row_with_more_fields_than_the_header_is_refused_with_its_line(tmp_path, name, content, line, fix):
    """The probe's I031/I032/I040/I009: `1,Hello, world and more` stored the text "Hello" with exit 0."""
    (tmp_path / name).write_text(content, encoding="utf-8")
    read_refused(tmp_path / name, ColumnSpec(), f"{name}:{line}", "fields, the header", fix)


def test_a_row_with_fewer_fields_keeps_its_text_when_the_wanted_column_is_there(tmp_path):
    (tmp_path / "x.csv").write_text("text,label\nhello,1\nworld\n", encoding="utf-8")
    assert read_inputs([str(tmp_path / "x.csv")], ColumnSpec()).texts == ["hello", "world"]
