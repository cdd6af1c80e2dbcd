"""Issue 48, the sixth reliability pass: what the third probe still found readers accepting where `kd validate`
refuses, or validate accepting.

- paths in a teacher's meta (`tokenizer`, `input_embeddings`) that leave the store ('/etc', '../../teacher',
  '/dev/zero'): every reader refuses them on open, as validate does;
- a shard swapped for a symlink to /dev/zero with the manifest unchanged: the sound verdict kept in the kd cache
  no longer covers it (the verdict's key holds each file's state);
- a stored tokenizer JSON with an `auto_map`, a key named twice, a 5,000-digit integer: validate reports it and
  --repair sets it aside (it once answered 'nothing to repair' while training refused the store);
- a negative texts `position`; a texts column that allows nulls but holds none is the same data (--add-to
  failed on it in pyarrow's words);
- a stale faiss index is a note of validate, not a problem: the data is sound and only `kd search` needs it;
- `kd eval` refuses a damaged student before timing anything (it footnoted 'not measured' and exited 0);
- `--exclude-ids` naming no row of the store is an error, not a training on every row.
Each store is a real one (news sentences through a tiny BERT teacher), forged by `store_forgery`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import store_forgery
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from store_forgery import (
    TEACHER,
    edit_manifests,
    index,
    init_store,
    refused,
    rewrite_file,
    rewrite_shard,
    set_column,
    train,
    validate,
)
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import StoreError
from kd.dataset.index import search

real, store = store_forgery.real, store_forgery.store  # the sound store and a copy per test
TOKENIZER_CONFIG = "tokenizers/tiny/tokenizer_config.json"


def query(store: Path):
    return CliRunner().invoke(app, ["query", str(store), "SELECT count(*), sum(mean[1]) FROM tiny"])


def leakage(store: Path):
    return CliRunner().invoke(app, ["leakage", str(store)])


def _set_meta(store: Path, field: str, value: str) -> None:
    edit_manifests(store, lambda d: d["tables"][TEACHER]["meta"].__setitem__(field, value)
                   if TEACHER in d["tables"] else None)


@pytest.mark.parametrize(("field", "value"), [("tokenizer", "../../teacher"), ("tokenizer", "/etc"),
                                              ("input_embeddings", "/dev/zero")])
def test_a_meta_path_out_of_the_store_is_refused_by_validate_and_every_reader(store, tmp_path, field, value):
    _set_meta(store, field, value)
    res = validate(store)
    assert res.exit_code == 1 and f"meta.{field} is {value!r}, not a path inside the folder" in res.output, \
        res.output
    for res in (query(store), leakage(store), train(store, tmp_path / "student")):
        refused(res, f"meta.{field}")


def test_a_shard_swapped_for_dev_zero_after_a_sound_verdict_is_checked_again(store, tmp_path, monkeypatch):
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "cache"))
    assert leakage(store).exit_code == 0  # the store's state is checked once and its verdict kept
    shard = store / TEACHER / "part-00000.parquet"
    shard.unlink()
    os.symlink("/dev/zero", shard)  # the manifest is unchanged: its hash alone keyed the verdict before
    refused(leakage(store), "part-00000.parquet")
    refused(query(store), "part-00000.parquet")


@pytest.mark.parametrize(("edit", "said"), [
    (lambda text: text[:-1] + ', "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", null]}}', "auto_map"),
    (lambda text: text[:-1] + ', "model_max_length": 1000000000000000000000000000000}', "appears twice"),
    (lambda text: text[:-1] + ', "padding": ' + "7" * 5000 + "}", "an integer of 5000 digits"),
])
def test_a_stored_tokenizer_file_kd_would_not_write_is_reported_and_repaired(store, tmp_path, edit, said):
    config = json.loads((store / TOKENIZER_CONFIG).read_text())
    config["model_max_length"] = 64
    rewrite_file(store, TOKENIZER_CONFIG, edit(json.dumps(config)).encode())
    res = validate(store)
    assert res.exit_code == 1 and "tokenizer_config.json" in res.output and said in res.output, res.output
    refused(train(store, tmp_path / "student"), "tokenizer_config.json")
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "repair set aside tokenizers/tiny" in " ".join(res.output.split()), res.output
    assert not (store / TOKENIZER_CONFIG).exists()


def test_a_position_below_a_whole_document_s_is_reported_and_refused(store):
    """-1 is a whole document's row (--segment sentences+documents: test_document_rows.py); below it is damage."""
    rewrite_shard(store, "texts", 0, lambda t: set_column(t, "position", [-2] + t["position"].to_pylist()[1:]))
    res = validate(store)
    assert res.exit_code == 1 and "column 'position' is below -1 in 1 row(s), first -2 at row 0" in res.output, \
        res.output
    refused(query(store), "column 'position' is below -1")


def test_add_to_a_store_whose_texts_column_allows_nulls_but_holds_none(store, tiny_teacher):
    """kd writes the texts columns NOT NULL; a shard written as nullable with the same values is the same data, which
    validate and every reader accept: --add-to failed on it in pyarrow's words ('Schema at index 1 was different')."""
    def nullable(t: pa.Table) -> pa.Table:
        return t.cast(pa.schema([f.with_nullable(f.name == "position") or f for f in t.schema]))

    rewrite_shard(store, "texts", 1, nullable)
    assert validate(store).exit_code == 0
    res = CliRunner().invoke(app, ["precompute", "--add-to", str(store), "-t", f"t2={tiny_teacher}",
                                   "--outputs", "cls", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert validate(store).exit_code == 0
    assert query(store).exit_code == 0


def test_a_stale_index_is_a_note_of_validate_and_kd_search_refuses_it(store):
    res = CliRunner().invoke(app, ["index", str(store), "--table", "tiny", "--column", "mean"])
    assert res.exit_code == 0, res.output
    # both tables' shard 0 in reverse row order, every checksum re-forged: a sound store whose rows moved
    for table in ("texts", TEACHER):
        rewrite_shard(store, table, 0, lambda t: t.take(pa.array(range(t.num_rows - 1, -1, -1))))
    res = validate(store)
    out = " ".join(res.output.split())
    assert res.exit_code == 0 and "note" in out and "is stale" in out and "kd index" in out, res.output
    assert query(store).exit_code == 0
    with pytest.raises(StoreError, match="is stale"):
        search(str(store), np.ones((1, 32), np.float32), k=3)


def test_kd_eval_refuses_a_damaged_student_before_timing_anything(real, tmp_path, tiny_teacher):
    res = train(real, tmp_path / "student")
    assert res.exit_code == 0, res.output
    weights = tmp_path / "student" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # its recorded sha256 no longer holds
    res = CliRunner().invoke(app, ["eval", "--teacher", str(tiny_teacher), "--student", str(tmp_path / "student"),
                                   "--task", "speed", "--no-baseline", "--no-cache", "--no-progress"])
    refused(res, "model.safetensors")
    assert "ms/doc" not in res.output


def test_exclude_ids_naming_no_row_is_an_error_and_a_match_is_counted(real, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"1\r2\r3\r")  # CR line ends: three ids, none of them a row of the store
    refused(train(real, tmp_path / "none", "--exclude-ids", str(ids)), "none of the 3 ids in --exclude-ids")
    assert not (tmp_path / "none").exists()
    import pyarrow.parquet as pq

    first = pq.read_table(real / "texts" / "part-00000.parquet")["id"].to_pylist()[:4]
    ids.write_text("\n".join(map(str, [*first, 5])) + "\n")
    res = train(real, tmp_path / "some", "--exclude-ids", str(ids))
    assert res.exit_code == 0, res.output
    resolved = json.loads((tmp_path / "some" / "config.json").read_text())
    assert resolved["excluded_rows"] == 4 and resolved["train_rows"] + resolved["val_rows"] == 90 - 4


# --- what the fourth probe found (issue 48) ------------------------------------------------------------------------


def test_a_byte_changed_in_place_with_its_mtime_put_back_is_checked_again(store, tmp_path, monkeypatch):
    """The verdict's key holds each file's ctime, which no user can put back: a reader that does not read the
    changed file no longer takes the earlier verdict."""
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "cache"))
    assert leakage(store).exit_code == 0
    vocab = store / "teachers/tiny/vocab.safetensors"
    before = os.stat(vocab)
    data = bytearray(vocab.read_bytes())
    data[-5] ^= 0x40
    vocab.write_bytes(bytes(data))
    os.utime(vocab, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(vocab).st_size == before.st_size and os.stat(vocab).st_mtime_ns == before.st_mtime_ns
    refused(leakage(store), "vocab.safetensors")


def test_add_to_refuses_a_store_whose_manifest_validate_refuses(store, tiny_teacher):
    _set_meta(store, "tokenizer", "/etc")
    res = CliRunner().invoke(app, ["precompute", "--add-to", str(store), "-t", f"t2={tiny_teacher}",
                                   "--outputs", "cls", "--no-progress"])
    refused(res, "meta.tokenizer")
    assert not (store / "teachers" / "t2").exists()


def test_nulls_kd_never_writes_are_reported_not_tracebacks(store, real, tiny_teacher, tmp_path):
    def null_first(column: str):
        def change(t: pa.Table) -> pa.Table:
            schema = pa.schema([f.with_nullable(True) if f.name == column else f for f in t.schema])
            values = [None, *t[column].to_pylist()[1:]]
            return pa.table([pa.array(values, t[column].type) if n == column else t[n] for n in t.column_names],
                            schema=schema)
        return change

    rewrite_shard(store, TEACHER, 0, null_first("truncated"))
    res = validate(store)
    assert res.exit_code == 1 and "column 'truncated' holds 1 null(s)" in res.output, res.output
    res = CliRunner().invoke(app, ["precompute", str(real.parent / "news.txt"), "--reuse", str(store), "-t",
                                   f"tiny={tiny_teacher}", "--outputs", "cls,mean", "--shard-rows", "30",
                                   "-o", str(tmp_path / "new"), "--no-progress"])
    refused(res, "column 'truncated' holds 1 null(s)")
    rewrite_shard(store, "texts", 1, null_first("id"))
    res = validate(store)
    assert res.exit_code == 1 and "column 'id' holds 1 null(s)" in res.output and "Traceback" not in res.output, \
        res.output
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "dropped shard 1 of texts" in res.output, res.output


@pytest.mark.parametrize(("edit", "said"), [
    ({"num_hidden_layers": 1_000_000_000}, "num_hidden_layers is 1000000000"),
    ({"hidden_size": -8}, "hidden_size is -8"),
    ({"vocab_size": "138"}, "vocab_size is '138'"),
    ({"auto_map": {"AutoModel": "evil.Model"}}, "auto_map"),
])
def test_an_init_output_config_kd_cannot_build_from_is_reported_refused_and_repaired(
        tmp_path, tiny_teacher, sentences, edit, said):
    store = init_store(tmp_path, tiny_teacher, sentences)
    (rel,) = [p.relative_to(store).as_posix() for p in store.glob("teachers/tiny/init-*/config.json")]
    config = json.loads((store / rel).read_text()) | edit
    rewrite_file(store, rel, json.dumps(config).encode())
    res = validate(store)
    assert res.exit_code == 1 and said in res.output, res.output
    res = CliRunner().invoke(app, ["train-student", "-s", str(store), "-o", str(tmp_path / "student"), "--arch",
                                   "transformer-init", "--max-steps", "1", "--no-progress"])
    refused(res, said)
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert f"set aside {rel.rsplit('/', 1)[0]}" in " ".join(res.output.split()), res.output


@pytest.mark.parametrize("record", ["manifest.json", "fragment"])
def test_a_manifest_linked_out_of_the_store_is_refused_and_repaired(store, tmp_path, record):
    """A fragment linked out with manifest.json whole: --repair once found no record to trust (it read the fragment
    through the link and saw nothing wrong), the fifth probe."""
    rel = "manifest.json" if record == "manifest.json" else next((store / "manifests").glob("*.json")).relative_to(
        store).as_posix()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes((store / rel).read_bytes())  # the same record: only the link is wrong
    (store / rel).unlink()
    os.symlink(elsewhere, store / rel)
    refused(query(store), rel.rsplit("/", 1)[-1], "--repair")
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    said = "manifest.json rebuilt" if record == "manifest.json" else "damaged; manifest.json holds its records"
    assert res.exit_code == 0 and said in " ".join(res.output.split()), res.output
    assert "re-run the kd precompute" not in res.output, res.output  # nothing of the store's data was lost
    assert not (store / rel).is_symlink() and elsewhere.exists()
    assert validate(store).exit_code == 0 and query(store).exit_code == 0


def test_a_lock_folder_linked_to_dev_null_is_noted_refused_by_writers_and_set_aside(store):
    """No reader takes a lock: validate notes the link without failing (it refused what every reader accepted, the
    fifth probe), writers refuse it in kd's words, --repair removes it."""
    (store / "locks").mkdir(exist_ok=True)
    os.rename(store / "locks", store / "locks-old")
    os.symlink("/dev/null", store / "locks")
    res = validate(store)
    assert res.exit_code == 0 and "note" in res.output, res.output
    assert "a symlink leading out of the store (to /dev/null): writers refuse it" in " ".join(res.output.split())
    assert query(store).exit_code == 0
    refused(CliRunner().invoke(app, ["index", str(store), "--table", "tiny", "--column", "mean"]), "locks")
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "set aside locks" in " ".join(res.output.split()), res.output
    assert "re-run the kd precompute" not in res.output, res.output  # no precompute writes locks/: kd makes it again
    assert CliRunner().invoke(app, ["index", str(store), "--table", "tiny", "--column", "mean"]).exit_code == 0
    assert validate(store).exit_code == 0


def test_a_folder_in_place_of_manifest_json_is_kd_s_error_and_repair_writes_it_again(store):
    """A folder where manifest.json should be: every reader said pyarrow's "is a directory" in a traceback (the
    sixth probe); now kd's error, and --repair sets the folder aside and writes manifest.json again."""
    (store / "manifest.json").unlink()
    (store / "manifest.json").mkdir()
    for res in (query(store), CliRunner().invoke(app, ["info", str(store)]), index(store)):
        refused(res, "a store file is a folder, not a regular file", "--repair")
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert res.exit_code == 0, res.output
    assert validate(store).exit_code == 0 and query(store).exit_code == 0
    assert (store / "manifest.json").is_file()


@pytest.mark.parametrize("command", [["query", "{uri}", "SELECT 1"], ["info", "{uri}"], ["validate", "{uri}"]])
def test_a_store_address_of_a_filesystem_pyarrow_lacks_is_kd_s_error(command):
    """`kd query http://...` ended in pyarrow's "Unrecognized filesystem type" traceback (the sixth probe)."""
    uri = "http://127.0.0.1:9/store"
    refused(CliRunner().invoke(app, [a.format(uri=uri) for a in command]), "no store can be opened at this address",
            uri, "s3://")


def test_validate_walks_the_store_for_links_once(store, monkeypatch):
    """`kd validate` finds links out of the store (problems) and a linked locks/ (a note) in one walk of the store: it
    walked the whole tree twice (a review of the fifth probe's fix), which on a store of many shards is the slow
    part of a check that reads no data."""
    from kd.storage import validate as validate_module

    walks, real_walk = [], validate_module.links_out
    monkeypatch.setattr(validate_module, "links_out", lambda root, *a: walks.append(root) or real_walk(root, *a))
    os.symlink("/dev/null", store / "stray")
    res = validate(store)
    assert res.exit_code == 1 and "stray: a symlink leading out of the store (to /dev/null)" in res.output, res.output
    assert len(walks) == 1, walks


def test_repair_drops_the_few_shard_records_that_disagree_with_the_row_plan(real, store, tiny_teacher):
    """Shard 1's records forged to say 29 rows (files and records agree, the plan says 30): the plan holds with
    every other record, so --repair drops those two and the documented rerun writes them again (it once answered
    that no record could be trusted)."""
    from kd.pipeline.precompute import precompute

    for table in ("texts", TEACHER):
        rewrite_shard(store, table, 1, lambda t: t.slice(0, t.num_rows - 1), rows=True)
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    out = " ".join(res.output.split())
    assert "dropped shard 1 of texts: its record says 29 rows, the row plan 30" in out, res.output
    assert "dropped shard 1 of teachers/tiny" in out, res.output
    precompute([str(real.parent / "news.txt")], str(store), [f"tiny={tiny_teacher}"], shard_rows=30,
               outputs=["cls", "mean", "vocab"], progress=False)
    assert validate(store).exit_code == 0
    for table in ("texts", TEACHER):
        assert (store / table / "part-00001.parquet").read_bytes() == (real / table / "part-00001.parquet").read_bytes()


def test_an_error_quoting_a_two_megabyte_csv_header_is_clipped_and_quick(tmp_path, tiny_teacher):
    """The message named every column of the header: 2 MB that the terminal took minutes to lay out, silently."""
    import time

    (tmp_path / "h.csv").write_text("a" * 2_000_000 + "\nx\n", encoding="utf-8")
    start = time.perf_counter()
    res = CliRunner().invoke(app, ["precompute", str(tmp_path / "h.csv"), "-t", f"tiny={tiny_teacher}", "--outputs",
                                   "mean", "-o", str(tmp_path / "s"), "--no-progress"])
    refused(res, "not in the header", "(2,000,043 characters in all)")
    assert len(res.output) < 10_000 and time.perf_counter() - start < 30


def test_a_baseline_folder_whose_modules_json_points_out_is_refused(tmp_path, tiny_teacher):
    """model2vec never reads modules.json, but what a received folder says of itself is checked wherever it is
    received (kd.student.load_exported refuses the same entry)."""
    folder = tmp_path / "m2v"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "../../../../etc",
                                                      "type": "sentence_transformers.models.StaticEmbedding"}]))
    res = CliRunner().invoke(app, ["eval", "--teacher", str(tiny_teacher), "--baseline-dir", str(folder), "--task",
                                   "speed", "--no-cache", "--no-progress"])
    refused(res, "outside the folder", "modules.json")


@pytest.mark.parametrize(("key", "value"), [("vocab_size", 30_000_000), ("num_attention_heads", 0)])
def test_a_received_transformer_init_student_is_bounded_before_it_is_built(tmp_path, tiny_teacher, sentences,
                                                                           key, value):
    """`student.bert.vocab_size` 3e7 in a student's config.json: load built a 3.8 GB table the model never uses
    (peak RSS 4.2 GB) before anything checked it; 0 heads ended in a ZeroDivisionError."""
    from kd import student
    from kd.common.errors import KdError

    store = init_store(tmp_path, tiny_teacher, sentences)
    res = CliRunner().invoke(app, ["train-student", "-s", str(store), "-o", str(tmp_path / "s"), "--arch",
                                   "transformer-init", "--max-steps", "1", "--no-progress"])
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    cfg["student"]["bert"][key] = value
    (tmp_path / "s" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KdError, match=f"bert: the config's {key} is {value}"):
        student.load(tmp_path / "s")
    refused(CliRunner().invoke(app, ["export", str(tmp_path / "s"), "--out", str(tmp_path / "x")]), key)


def test_a_teacher_folder_with_auto_map_is_refused_before_transformers_reads_it(tmp_path, tiny_teacher, monkeypatch):
    """On a terminal transformers asked whether to run the folder's code, and a y ran it: kd refuses the folder
    before any transformers call (here: AutoConfig would fail the test)."""
    import shutil

    import transformers

    folder = Path(shutil.copytree(tiny_teacher, tmp_path / "teacher"))
    cfg = json.loads((folder / "config.json").read_text()) | {"auto_map": {"AutoModel": "evil.Model"}}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "evil.py").write_text("raise SystemExit('evil ran')\n")

    def never(*args, **kwargs):
        raise AssertionError("transformers read a folder kd should have refused")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", never)
    (tmp_path / "news.txt").write_text("a sentence\nanother one\n")
    res = CliRunner().invoke(app, ["precompute", str(tmp_path / "news.txt"), "-t", f"t={folder}", "--outputs",
                                   "mean", "--backend", "torch", "-o", str(tmp_path / "s"), "--no-progress"])
    refused(res, "auto_map", "config.json")


@pytest.mark.parametrize("call", ["Store.open", "connect", "run_query", "export_format", "export_format_list",
                                  "export_out_int", "load_exported", "encode"])
def test_python_calls_with_a_wrong_type_are_kd_s_errors(real, store, tmp_path, call):
    """Five public functions raised a bare TypeError or ValueError for an int path, int SQL or an unknown format,
    and encode took batch_size=0 (the sixth probe)."""
    from kd.common.errors import InputError
    from kd.dataset import query as Q
    from kd.storage.store import Store
    from kd.student.st_load import load_exported

    calls = {"Store.open": lambda: Store.open(5), "connect": lambda: Q.connect(5),
             "run_query": lambda: Q.run_query(real, 5), "load_exported": lambda: load_exported(5),
             "export_format": lambda: Q.export(real, "SELECT 1", tmp_path / "q.x", "xlsx"),
             "export_format_list": lambda: Q.export(real, "SELECT 1", tmp_path / "q.x", ["csv"]),
             "export_out_int": lambda: Q.export(real, "SELECT 1", 5, "csv"),
             "encode": lambda: _student(store, tmp_path).encode(["a cat"], batch_size=0)}
    with pytest.raises(InputError) as e:
        calls[call]()
    assert e.value.fix and any(s in e.value.what for s in ("not 5 (int)", "xlsx", "['csv']", "batch_size"))


def _student(store: Path, tmp_path: Path):
    from kd.student import load

    res = train(store, tmp_path / "student")
    assert res.exit_code == 0, res.output
    return load(tmp_path / "student")


def test_kd_query_never_makes_its_temporary_folder_inside_the_store(store, monkeypatch):
    """With TMPDIR inside the store, `kd query -f csv` made a folder there and then blamed an --out never given
    (the sixth probe): a read-only command writes nothing into the store, not even for a moment."""
    import tempfile

    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    monkeypatch.setattr(tempfile, "tempdir", str(store / "texts"))
    for address in (str(store), f"file://{store}"):  # a file:// address is the same folder (the re-run)
        res = CliRunner().invoke(app, ["query", address, "SELECT 1 AS a", "-f", "csv"])
        refused(res, "lies inside the store", "TMPDIR")
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before


def test_paths_with_brackets_print_whole(real, tmp_path):
    """kd printed through rich's markup: a store at `x[/]y/store` ended validate and info in a MarkupError
    traceback after the work was done, and `s[red]` lost its `[red]` (the sixth probe's re-run)."""
    import shutil

    for name in ("s[red]", "x[/]y"):
        store = Path(shutil.copytree(real, tmp_path / name / "store"))
        res = CliRunner().invoke(app, ["validate", str(store)])
        assert res.exit_code == 0 and f"{name}/store: every shard matches" in " ".join(res.output.split()), res.output
        res = CliRunner().invoke(app, ["info", str(store)])
        assert res.exit_code == 0 and "Traceback" not in res.output, res.output
        res = CliRunner().invoke(app, ["validate", str(store / "nothing[bold]")])
        assert res.exit_code == 2 and "nothing[bold]" in res.output, res.output
