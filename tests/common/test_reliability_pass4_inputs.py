"""Issue 48, the fourth reliability pass (the probe's input warts): old Mac line ends, pipes and devices as inputs,
duplicate columns, a text of megabytes, received folders with links out or junk settings, and a user's folder as
`kd precompute -o`: each is read right or refused with kd's message (exit 2), before a teacher loads or anything is
written."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from named_pipes import make_fifo, unblocking
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store, tiny_student
from typer.testing import CliRunner

import kd.student
from kd.cli import app
from kd.common.errors import InputError, KdError
from kd.common.inputs import MAX_TEXT_BYTES, ColumnSpec, expand_inputs, read_inputs
from kd.pipeline.backends import loading


def _precompute(*args: str):
    return CliRunner().invoke(app, ["precompute", *args, "--no-progress"])


@pytest.fixture
def no_teacher(monkeypatch):
    """A teacher that is loaded fails the test: the refusal must come first."""
    def load(*args, **kwargs):
        raise AssertionError("a teacher was loaded before the refusal")

    monkeypatch.setattr(loading, "load", load)


# --- 1. a .txt with old Mac line ends (a lone \r) is read line by line --------------------------------------


@pytest.mark.parametrize("name", ["news.txt", "news.jsonl"])
def test_cr_line_ends_split_lines_as_lf_and_crlf_do(tmp_path, sentences, name):
    lines = [json.dumps({"text": s}) if name.endswith(".jsonl") else s for s in sentences[:30]]
    read = {}
    for end in ("\n", "\r\n", "\r"):
        path = tmp_path / f"{len(end)}{end == chr(13)}-{name}"
        path.write_bytes((end.join(lines) + end).encode("utf-8"))
        rec = read_inputs([str(path)], ColumnSpec())
        read[end] = (rec.texts, [d.split(":")[-1] for d in rec.doc_ids])
    assert read["\r"] == read["\n"] == read["\r\n"]
    assert read["\r"][0] == sentences[:30] and read["\r"][1][-1] == "30"


def test_a_cr_only_tab_separated_txt_picks_its_columns(tmp_path, sentences):
    """The first line decides whether a .txt has columns: with \r ends it is the header, not the whole file."""
    rows = ["label\ttext"] + [f"{i % 2}\t{s}" for i, s in enumerate(sentences[:10])]
    (tmp_path / "pairs.txt").write_bytes("\r".join(rows).encode("utf-8") + b"\r")
    rec = read_inputs([str(tmp_path / "pairs.txt")], ColumnSpec(text="text", label="label"))
    assert rec.texts == sentences[:10] and rec.labels == ["0", "1"] * 5


# --- 2. a device or a named pipe is refused as such, without being opened -----------------------------------


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pipe_or_device_as_input_is_not_a_regular_file(tmp_path, tiny_teacher, no_teacher, kind):
    source = str(make_fifo(tmp_path / "corpus.txt")) if kind == "fifo" else "/dev/zero"
    timer = unblocking(Path(source)) if kind == "fifo" else None
    res = _precompute(source, "-t", f"tiny={tiny_teacher}", "-o", str(tmp_path / "store"))
    if timer:
        timer.cancel()
    said = "a named pipe (FIFO)" if kind == "fifo" else "a character device"
    assert res.exit_code == 2 and "not a regular file" in res.output and said in res.output, res.output
    assert source in res.output and "not found" not in res.output
    assert not (tmp_path / "store").exists()


def test_a_folder_and_a_missing_file_keep_their_own_messages(tmp_path):
    (tmp_path / "corpus").mkdir()
    with pytest.raises(InputError, match="is a folder, not a file"):
        expand_inputs([str(tmp_path / "corpus")])
    with pytest.raises(InputError, match="input file not found"):
        expand_inputs([str(tmp_path / "nope.txt")])


def test_a_pipe_is_refused_by_every_reader(tmp_path):
    """`read_inputs` (kd embed and kd finetune read files with it, not only after `expand_inputs`) and kd's JSON
    reader: opening a named pipe to read blocks until something writes into it."""
    from kd.common.parsing import read_json

    corpus, config = make_fifo(tmp_path / "texts.txt"), make_fifo(tmp_path / "config.json")
    timers = [unblocking(corpus), unblocking(config)]
    with pytest.raises(InputError, match="named pipe"):
        read_inputs([str(corpus)], ColumnSpec())
    with pytest.raises(InputError, match="config.json is not a regular file but a named pipe"):
        read_json(config, "copy it again")
    for t in timers:
        t.cancel()


# --- 3. a column read by name must be named once -------------------------------------------------------------


@pytest.mark.parametrize("name", ["dup.csv", "dup.tsv"])
def test_a_duplicate_header_column_is_refused(tmp_path, sentences, name, tiny_teacher, no_teacher):
    sep = "\t" if name.endswith(".tsv") else ","
    rows = [f"text{sep}text"] + [f"{a.replace(sep, ' ')}{sep}{b.replace(sep, ' ')}"
                                 for a, b in zip(sentences[:10], sentences[10:20])]
    (tmp_path / name).write_text("\n".join(rows).replace('"', "") + "\n", encoding="utf-8")
    res = _precompute(str(tmp_path / name), "-t", f"tiny={tiny_teacher}", "-o", str(tmp_path / "store"))
    assert res.exit_code == 2 and "'text' appears 2 times" in res.output and f"{name}:1" in res.output, res.output
    assert not (tmp_path / "store").exists()


def test_a_duplicate_parquet_column_is_refused_and_an_unread_one_is_not(tmp_path, sentences):
    table = pa.Table.from_arrays([pa.array(sentences[:5]), pa.array(sentences[5:10])], names=["text", "text"])
    pq.write_table(table, tmp_path / "dup.parquet")
    with pytest.raises(InputError, match="'text' appears 2 times") as e:
        read_inputs([str(tmp_path / "dup.parquet")], ColumnSpec())
    assert e.value.where == str(tmp_path / "dup.parquet")
    (tmp_path / "notes.csv").write_text("note,note,text\na,b,the market fell\n", encoding="utf-8")
    assert read_inputs([str(tmp_path / "notes.csv")], ColumnSpec()).texts == ["the market fell"]


# --- 4. a text of megabytes is refused at once, naming its line ------------------------------------------------


def _megabyte_line(sentences: list[str], mib: float) -> str:
    """News sentences run together to `mib` MiB: what a file that lost its line breaks holds."""
    text = " ".join(sentences)
    return (text * (int(mib * 2**20) // len(text) + 1))[: int(mib * 2**20)]


def test_a_text_of_megabytes_is_refused_before_a_teacher_loads(tmp_path, sentences, tiny_teacher, no_teacher):
    lines = sentences[:20] + [_megabyte_line(sentences, 3)] + sentences[20:40]
    (tmp_path / "news.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = _precompute(str(tmp_path / "news.txt"), "-t", f"tiny={tiny_teacher}", "-o", str(tmp_path / "store"))
    assert res.exit_code == 2 and "over kd's limit of 1 MiB" in res.output, res.output
    assert f"{tmp_path / 'news.txt'}:21" in res.output.replace("\n", "")
    assert not (tmp_path / "store").exists()


def test_the_limit_counts_utf8_bytes_in_every_format(tmp_path, sentences):
    """Under the limit in characters but over it in bytes (4-byte emoji) is refused; a long text just under the
    limit is kept; a JSONL row and a CSV row are named by their line."""
    under = _megabyte_line(sentences, 1).encode()[: MAX_TEXT_BYTES - 10].decode("utf-8", "ignore")
    assert len(under) < len(under.encode()) <= MAX_TEXT_BYTES  # (the news holds characters of several bytes)
    emoji = "\U0001f600" * (MAX_TEXT_BYTES // 4 + 1)
    (tmp_path / "ok.txt").write_text(f"{sentences[0]}\n{under}\n", encoding="utf-8")
    assert read_inputs([str(tmp_path / "ok.txt")], ColumnSpec()).texts[1] == under
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in (sentences[0], emoji)) + "\n",
                                      encoding="utf-8")
    with pytest.raises(InputError, match="over kd's limit") as e:
        read_inputs([str(tmp_path / "a.jsonl")], ColumnSpec())
    assert e.value.where == f"{tmp_path / 'a.jsonl'}:2"
    (tmp_path / "p.tsv").write_text(f"a\tb\n{sentences[0]}\t{sentences[1]}\n{sentences[2]}\t{under}x{under}\n",
                                    encoding="utf-8")
    with pytest.raises(InputError, match="over kd's limit") as e:
        read_inputs([str(tmp_path / "p.tsv")], ColumnSpec(pair=("a", "b")))
    assert e.value.where == f"{tmp_path / 'p.tsv'}:3"


def test_a_long_document_to_be_split_into_sentences_is_read(tmp_path, sentences):
    """--segment sentences: the teacher reads the sentences (held to the limit in `segment`), not the document."""
    doc = _megabyte_line(sentences, 2)
    (tmp_path / "book.txt").write_text(doc + "\n", encoding="utf-8")
    assert read_inputs([str(tmp_path / "book.txt")], ColumnSpec(), documents=True).texts == [doc]


# --- 5-7. received student and export folders: links out, junk settings, pipes for weights -------------------


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pass4i")
    return tiny_student(make_store(root / "store", rows=40, shards=2, tmp=root), root / "bilstm")


@pytest.fixture(scope="module")
def export(student, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pass4e") / "bilstm-st"
    res = CliRunner().invoke(app, ["export", str(student), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _weights_module(export: Path) -> str:
    """The export's first module folder that holds weights (which modules an arch exports is st_fit's choice)."""
    return sorted(p.parent.name for p in export.glob("*/model.safetensors"))[0]


def _copy(folder: Path, tmp_path: Path, name: str = "received") -> Path:
    return Path(shutil.copytree(folder, tmp_path / name))


def _link_out(folder: Path, rel: str, tmp_path: Path) -> Path:
    """`rel` moved out of the folder, a symlink to it left in its place."""
    outside = tmp_path / "elsewhere" / rel
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(folder / rel, outside)
    (folder / rel).symlink_to(outside, target_is_directory=outside.is_dir())
    return outside


@pytest.mark.parametrize(("kind", "rel"), [("student", "tokenizer"), ("student", "tokenizer/tokenizer.json"),
                                           ("student", "README.md"), ("export", "MODULE"),
                                           ("export", "modules.json"), ("export", "tokenizer.json")])
def test_a_received_folder_with_a_link_out_of_it_is_refused(request, tmp_path, kind, rel):
    received = _copy(request.getfixturevalue(kind), tmp_path)
    rel = _weights_module(received) if rel == "MODULE" else rel
    _link_out(received, rel, tmp_path)
    with pytest.raises(InputError, match="symlink that leads out of the folder") as e:
        (kd.student.load if kind == "student" else kd.student.load_exported)(received)
    assert e.value.where == str(received / rel)
    if kind == "student":  # kd export reads it the same way, and writes nothing
        res = CliRunner().invoke(app, ["export", str(received), "--out", str(tmp_path / "exp")])
        assert res.exit_code == 2 and "leads out of the folder" in res.output, res.output
        assert not (tmp_path / "exp").exists()


def test_links_that_stay_inside_and_a_hub_snapshot_load(student, export, tmp_path, sentences):
    """A student reached through a link, and an export as the Hugging Face cache holds it (every file a link into
    the repository's blobs/), load: only a link out of the folder is refused."""
    alias = tmp_path / "best"
    alias.symlink_to(student, target_is_directory=True)
    assert kd.student.load(alias).encode(sentences[:2]).shape == (2, 16)
    repo = tmp_path / "hub" / "models--me--bilstm-st"
    snapshot = repo / "snapshots" / "0123abcd"
    for i, p in enumerate(sorted(p for p in export.rglob("*") if p.is_file())):
        blob = repo / "blobs" / f"{i:040x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, blob)
        link = snapshot / p.relative_to(export)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    assert kd.student.load_exported(snapshot).encode(sentences[:2]).shape == (2, 16)


def test_a_string_for_an_integer_in_config_json_is_a_type_error(student, tmp_path):
    received = _copy(student, tmp_path)
    cfg = json.loads((received / "config.json").read_text())
    cfg["student"]["embed_dim"] = str(cfg["student"]["embed_dim"])
    (received / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KdError, match="embed_dim is '8' \\(a string\\), not an integer") as e:
        kd.student.load(received)
    assert e.value.where == str(received / "config.json") and "do not fit" not in str(e.value)
    res = CliRunner().invoke(app, ["export", str(received), "--out", str(tmp_path / "exp")])
    assert res.exit_code == 2 and "embed_dim" in res.output and "config.json" in res.output, res.output


def test_every_student_config_field_has_its_json_type_checked():
    from kd.student.models import _JSON_TYPES, StudentConfig

    assert {str(f.type) for f in fields(StudentConfig)} <= set(_JSON_TYPES)


@pytest.mark.parametrize(("settings", "said"), [
    ({"similarity_fn_name": 5}, "similarity_fn_name is 5, not a string"),
    (["cosine"], "is not a JSON object"),
    ({"prompts": ["query: "]}, "prompts is ['query: '], not an object"),
    ({"similarity_fn_name": "maxsim"}, "holds a setting sentence-transformers refuses"),
    ({"prompts": {"query": "q: "}, "default_prompt_name": "passage"}, "Default prompt name 'passage'"),
])
def test_junk_sentence_transformers_settings_are_kds_message(export, tmp_path, settings, said):
    received = _copy(export, tmp_path)
    (received / "config_sentence_transformers.json").write_text(json.dumps(settings))
    with pytest.raises(InputError) as e:
        kd.student.load_exported(received)
    assert said in e.value.what and e.value.where == str(received / "config_sentence_transformers.json"), e.value


@pytest.mark.parametrize("weights", ["fifo", "/dev/zero", "truncated"])
def test_a_weights_file_that_is_no_weights_file_is_named(student, export, tmp_path, weights):
    for folder, load, rel in ((student, kd.student.load, "model.safetensors"),
                              (export, kd.student.load_exported, "MODULE/model.safetensors")):
        received = _copy(folder, tmp_path, folder.name)
        rel = rel.replace("MODULE", _weights_module(received)) if "MODULE" in rel else rel
        path = received / rel
        data = path.read_bytes()
        path.unlink()
        if weights == "fifo":
            timer = unblocking(make_fifo(path))
        elif weights == "/dev/zero":
            path.symlink_to("/dev/zero")
        else:
            path.write_bytes(data[:40])
        with pytest.raises(InputError) as e:
            load(received)
        if weights == "fifo":
            timer.cancel()
        assert rel.split("/")[0] in str(e.value.where) and "Traceback" not in str(e.value), e.value


# --- 8. kd precompute -o a folder of the user's: refused before the teacher loads ------------------------------


def test_a_folder_of_the_users_files_is_refused_before_the_teacher_loads(tmp_path, sentences, tiny_teacher,
                                                                            no_teacher):
    (tmp_path / "news.txt").write_text("\n".join(sentences[:20]) + "\n", encoding="utf-8")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    res = _precompute(str(tmp_path / "news.txt"), "-t", f"tiny={tiny_teacher}", "-o", str(mine))
    assert res.exit_code == 2 and "holds no kd store" in res.output, res.output
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
