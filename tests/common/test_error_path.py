"""One error path (issue 41): every failure a user can cause reaches them as kd's what/where/fix message with
exit 2, in the CLI and the Python API alike; a traceback only with --debug, or for a real bug."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import training_runs
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store
from training_runs import SMALL
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError, KdError, StoreError, as_kd_error, located
from kd.common.stop import Stopped

DEEP = "[" * 100000  # json's parser recurses once per level: a RecursionError, not a JSONDecodeError

exported = training_runs.exported  # its store_path is this module's own


def _run(*args: str, **env: str):
    return CliRunner().invoke(app, list(args), env=env or None)


def _clean_exit(res, code: int, *words: str) -> str:
    """The command exited `code` with kd's message (every word in it) and no traceback."""
    assert res.exit_code == code, (res.exit_code, res.output, res.exception)
    assert isinstance(res.exception, SystemExit | None), repr(res.exception)
    assert "Traceback" not in res.output and "error:" in res.output, res.output
    for w in words:
        assert w in res.output, (w, res.output)
    return res.output


def _fail_fsync(monkeypatch, code: int, inside: str) -> None:
    """The disk refuses the bytes of any file under `inside` when they are synced (as a full disk does)."""
    real = os.fsync

    def refuse(fd: int) -> None:
        if inside in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", refuse)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("errpath")
    return make_store(root / "store", rows=80, shards=2, tmp=root)


@pytest.fixture(scope="module")
def trained(store_path, tmp_path_factory) -> Path:
    from kd.student import trainer as T

    out = tmp_path_factory.mktemp("errpath-student") / "student"
    return T.train(T.TrainConfig(str(store_path), str(out), **(SMALL | {"epochs": 1, "max_steps": 2})))


def _copy(src: Path, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(src, tmp_path / name))


# --- the translation itself ---------------------------------------------------------------------------------
def test_user_caused_exceptions_become_kd_errors_and_bugs_do_not():
    full = as_kd_error(OSError(errno.ENOSPC, "No space left on device", "/data/out/x.parquet"))
    assert isinstance(full, KdError) and "disk is full" in full.what and full.where == "/data/out/x.parquet"
    assert full.fix and full.exit_code == 2
    assert "size limit" in as_kd_error(OSError(errno.EFBIG, "File too large")).what
    assert "permission denied" in as_kd_error(PermissionError(errno.EACCES, "Permission denied", "/x")).what
    assert "read-only" in as_kd_error(OSError(errno.EROFS, "Read-only file system", "/x")).what
    assert as_kd_error(FileNotFoundError(errno.ENOENT, "No such file", "/nope")).where == "/nope"
    assert "nested too deeply" in as_kd_error(RecursionError()).what
    with pytest.raises(json.JSONDecodeError) as bad_json:
        json.loads('{"a": }')
    assert "line 1 column 7" in as_kd_error(bad_json.value).where
    assert "not UTF-8" in as_kd_error(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")).what
    err = StoreError("x")
    assert as_kd_error(err) is err
    for bug in (ZeroDivisionError(), KeyError("k"), ValueError("v"), OSError("no errno"), OSError(errno.EBADF, "x")):
        assert as_kd_error(bug) is None, bug


@pytest.mark.parametrize("make", [lambda: StoreError("locked"),
                                  lambda: Stopped(signal.SIGINT, "stopped", None, "rerun")])
def test_an_error_placed_where_it_happened_keeps_its_class_and_exit_code(make):
    """`located` and the CLI give a where-less error a place; Stopped (the signal first) broke a rebuild by
    `type(err)(what, where, fix)` once, so both go through KdError.at."""
    err = make()
    placed = err.at("out/x.parquet")
    assert type(placed) is type(err) and placed.exit_code == err.exit_code and placed.fix == err.fix
    assert placed.where == "out/x.parquet" and "where: out/x.parquet" in str(placed) and err.where is None
    with pytest.raises(type(err)) as raised:
        with located("out/y"):
            raise err
    assert raised.value.where == "out/y" and raised.value.exit_code == err.exit_code


# --- disk full (and the file system's size limit), deep inside each writing command -------------------------
def test_a_full_disk_in_precompute_is_a_message(tiny_teacher, tmp_path, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("the market fell\nthe dog runs\n")
    out = tmp_path / "out"
    _fail_fsync(monkeypatch, errno.EFBIG, str(out))  # EFBIG: precompute's own disk-full handler lets it pass
    res = _run("precompute", str(src), "-t", str(tiny_teacher), "-o", str(out), "--backend", "torch",
               "--no-progress")
    _clean_exit(res, 2, "size limit", "kd precompute")  # a failed write to an open file names no file


def test_debug_shows_the_traceback(tiny_teacher, tmp_path, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("the market fell\n")
    _fail_fsync(monkeypatch, errno.EFBIG, str(tmp_path))
    for args, env in ((["--debug"], {}), ([], {"KD_DEBUG": "1"})):
        res = _run(*args, "precompute", str(src), "-t", str(tiny_teacher), "-o", str(tmp_path / "o"),
                   "--backend", "torch", "--no-progress", **env)
        assert isinstance(res.exception, OSError) and res.exception.errno == errno.EFBIG, repr(res.exception)


def test_a_bug_keeps_its_traceback(store_path, monkeypatch):
    import kd.storage.info as info

    def broken(store: str) -> None:
        raise ZeroDivisionError("a bug in kd")

    monkeypatch.setattr(info, "summary_table", broken)
    res = _run("info", str(store_path))
    assert isinstance(res.exception, ZeroDivisionError)  # not translated: a bug must stay visible


def test_a_full_disk_in_train_student_is_a_message(store_path, tmp_path, monkeypatch):
    out = tmp_path / "s"
    _fail_fsync(monkeypatch, errno.EFBIG, str(out))
    res = _run("train-student", "--shards", str(store_path), "--out", str(out), "--arch", "bilstm",
               "--embed-dim", "16", "--hidden-dim", "16", "--batch-size", "8", "--max-steps", "1", "--no-progress")
    _clean_exit(res, 2, "size limit")


def test_a_full_disk_in_embed_is_a_message(store_path, trained, tmp_path, monkeypatch):
    store = _copy(store_path, tmp_path, "store")
    _fail_fsync(monkeypatch, errno.ENOSPC, str(store / "students"))
    res = _run("embed", str(store), "--student", str(trained), "--no-progress")
    _clean_exit(res, 2, "disk is full")


def test_a_full_disk_in_export_is_a_message(trained, tmp_path, monkeypatch):
    pytest.importorskip("sentence_transformers")
    real = os.replace

    def full(src, dst, *a, **kw):  # the rename needs a new directory block the disk has no room for
        if "kd-partial" in str(src):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", full)
    res = _run("export", str(trained), "--out", str(tmp_path / "e"))
    _clean_exit(res, 2, "disk is full", str(tmp_path / "e"))


def _under_file_size_limit(limit: int, *args: str) -> subprocess.CompletedProcess:
    """`kd ARGS` in a fresh process whose files may not grow past `limit` bytes (`ulimit -f`): every write past it
    fails with EFBIG inside whichever library writes (safetensors, DuckDB), as a full disk does."""
    import resource
    import sys

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "kd", *args], capture_output=True, text=True, env=env,
                          preexec_fn=limit_files, timeout=300)


@pytest.mark.parametrize("command", ["export", "query"])
def test_the_file_size_limit_inside_a_library_write_is_a_message(store_path, trained, tmp_path, command):
    """The probe's X05 (safetensors' SafetensorError traceback from `kd export`) and X07 (`kd query -o` blamed
    the SQL): an OS error reported in a library's own exception type is kd's disk message; nothing is left."""
    if command == "export":
        pytest.importorskip("sentence_transformers")
        res = _under_file_size_limit(2000, "export", str(trained), "--out", str(tmp_path / "e"))
    else:
        res = _under_file_size_limit(2000, "query", str(store_path), "SELECT * FROM texts", "-f", "csv",
                                     "-o", str(tmp_path / "q.csv"))
    assert res.returncode == 2 and "size limit" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert "SQL" not in res.stderr and sorted(p.name for p in tmp_path.iterdir()) == []
    where = str(tmp_path / ("e" if command == "export" else "q.csv"))
    assert f"where: {where}" in res.stderr, res.stderr  # the probe's last wart: query's message had no where


def test_a_library_error_that_is_not_a_disk_error_keeps_its_traceback():
    from safetensors import SafetensorError

    assert "size limit" in as_kd_error(SafetensorError("I/O error: File too large (os error 27)")).what
    assert "disk is full" in as_kd_error(RuntimeError('IO Error: could not write: No space left on device')).what
    assert as_kd_error(SafetensorError("invalid header (os error 9)")) is None  # EBADF: a bug, not the user's
    assert as_kd_error(RuntimeError("shape mismatch")) is None


# --- manifests: deep nesting, and a damaged fragment that --repair now repairs ------------------------------
def test_a_deeply_nested_manifest_is_a_store_error(store_path, tmp_path):
    from kd.storage.store import Store

    store = _copy(store_path, tmp_path)
    (store / "manifest.json").write_text(DEEP)
    with pytest.raises(StoreError, match="nested too deeply"):
        Store.open(str(store))
    _clean_exit(_run("validate", str(store)), 2, "nested too deeply", "manifest.json")
    res = _run("validate", str(store), "--repair")  # the fragments hold the record: manifest.json is rebuilt
    assert res.exit_code == 0 and "rebuilt" in res.output, res.output


def test_repair_sets_a_damaged_fragment_aside_instead_of_failing_as_validate_did(store_path, tmp_path):
    store = _copy(store_path, tmp_path)
    fragment = next((store / "manifests").glob("*.json"))
    fragment.write_text(DEEP)
    _clean_exit(_run("validate", str(store)), 2, "--repair")  # the message sends the user to --repair ...
    res = _run("validate", str(store), "--repair")  # ... which repairs: manifest.json holds the records
    assert res.exit_code == 0 and "set aside manifests/" in res.output, res.output
    assert not fragment.exists() and fragment.with_name(fragment.name + ".damaged").exists()
    assert _run("validate", str(store)).exit_code == 0


def test_repair_says_when_it_cannot_help(store_path, tmp_path):
    store = _copy(store_path, tmp_path)
    next((store / "manifests").glob("*.json")).write_text("{")
    (store / "manifest.json").write_text("{")
    out = _clean_exit(_run("validate", str(store), "--repair"), 2, "--repair cannot rebuild")
    assert "re-run the kd precompute" in out and "run `kd validate" not in out


# --- received folders: teacher pickles, student and export JSON --------------------------------------------
def test_a_pickled_teacher_is_refused_and_never_loaded(tiny_teacher, tmp_path):
    import torch
    from safetensors.torch import load_file

    from kd.pipeline.teacher.resolve import resolve_teacher

    teacher = _copy(tiny_teacher, tmp_path, "teacher")
    torch.save(load_file(str(teacher / "model.safetensors")), teacher / "pytorch_model.bin")
    (teacher / "model.safetensors").unlink()
    with pytest.raises(InputError, match="pickle"):
        resolve_teacher(str(teacher))
    src = tmp_path / "in.txt"
    src.write_text("the market fell\n")
    res = _run("precompute", str(src), "-t", str(teacher), "-o", str(tmp_path / "o"), "--no-progress")
    _clean_exit(res, 2, "pytorch_model.bin", "never loads")
    assert not (tmp_path / "o").exists()
    beside = _copy(tiny_teacher, tmp_path, "beside")
    (beside / "stray.pkl").write_bytes(b"not read")  # beside safetensors weights a pickle is ignored
    assert resolve_teacher(str(beside)).path == str(beside)


@pytest.mark.parametrize("junk,expect", [
    (DEEP, "not valid JSON"),
    ("SHAPE:student", "no student settings"),
    ("SHAPE:tokenizer_sha256", "tokenizer_sha256"),
])
def test_junk_student_config_is_an_input_error(trained, tmp_path, junk, expect):
    from kd import student

    f = _copy(trained, tmp_path)
    if junk.startswith("SHAPE:"):
        cfg = json.loads((f / "config.json").read_text())
        cfg[junk[len("SHAPE:"):]] = 5
        junk = json.dumps(cfg)
    (f / "config.json").write_text(junk)
    with pytest.raises(InputError, match=expect):
        student.load(f)
    src = tmp_path / "in.txt"
    src.write_text("the market fell\n")
    _clean_exit(_run("embed", str(src), "--student", str(f), "--out", str(tmp_path / "v.parquet")), 2, expect)




def _kd_module_config(folder: Path) -> Path:
    entry = next(e for e in json.loads((folder / "modules.json").read_text()) if "KdTokenEncoder" in e["type"])
    return folder / entry["path"] / "kd_student.json"


@pytest.mark.parametrize("damage", ["deep-modules", "deep-kd-student", "kd-student-types", "kd-student-list"])
def test_junk_export_json_is_an_input_error(exported, tmp_path, damage):
    from kd import student

    f = _copy(exported, tmp_path)
    target = f / "modules.json" if damage == "deep-modules" else _kd_module_config(f)
    junk = {"deep-modules": DEEP, "deep-kd-student": DEEP, "kd-student-types": '{"student": 5, "pool": true}',
            "kd-student-list": "[]"}[damage]
    target.write_text(junk)
    with pytest.raises(InputError):
        student.load_exported(f)


def test_a_binary_agreement_file_is_an_input_error(trained, tiny_teacher, tmp_path):
    binary = tmp_path / "texts.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    res = _run("eval", "--student", str(trained), "--teacher", str(tiny_teacher), "--task", "agreement",
               "--agreement-texts", str(binary), "--no-baseline", "--no-progress")
    _clean_exit(res, 2, "not UTF-8", str(binary))


def test_a_folder_with_only_a_lock_and_metrics_is_not_called_a_student(store_path, tmp_path):
    """What a kill before the first checkpoint leaves: neither a student nor a refusal (it asked for --overwrite),
    the same command trains again from step 0, the dead run's metrics replaced."""
    from kd.common.outputs import TRAIN_LOCK
    from kd.student.metrics import METRICS

    out = tmp_path / "s"
    out.mkdir()
    (out / TRAIN_LOCK).write_text("")
    (out / METRICS).write_text('{"step": 1, "loss": 123.5}\n')
    res = _run("train-student", "--shards", str(store_path), "--out", str(out), "--max-steps", "1", "--no-progress")
    assert res.exit_code == 0 and "holds a student" not in res.output, res.output
    assert (out / "model.safetensors").is_file() and "123.5" not in (out / METRICS).read_text()


@pytest.mark.parametrize("delimiter", [";;", "", '"', "\n"])
def test_a_bad_delimiter_is_refused_by_name(tmp_path, delimiter):
    from kd.common.inputs import ColumnSpec, read_inputs

    src = tmp_path / "in.csv"
    src.write_text("text,label\nthe cat runs,1\n")
    with pytest.raises(InputError, match="--delimiter"):
        read_inputs([str(src)], ColumnSpec.from_options("text", delimiter=delimiter))
    res = _run("precompute", str(src), "-o", str(tmp_path / "o"), "--text-column", "text", "--delimiter", delimiter,
               "--no-progress")
    _clean_exit(res, 2, "--delimiter must be one character")
    assert not (tmp_path / "o").exists()


def test_a_remote_storage_failure_is_kds_message():
    """`kd info s3://bucket/x` without a network printed pyarrow's bare OSError as a traceback (the probe's
    O162): it has no errno, only the service's text."""
    from kd.common.errors import as_kd_error

    err = as_kd_error(OSError("When resolving region for bucket 'b': AWS Error NETWORK_CONNECTION during HeadBucket "
                              "operation: curlCode: 6, Could not resolve hostname"))
    assert err is not None and err.exit_code == 2 and "cannot reach the remote storage" in str(err)
    assert "credentials" in err.fix
    assert as_kd_error(OSError("something else entirely")) is None  # a bug keeps its traceback


@pytest.mark.parametrize("command", [["info"], ["validate"], ["query", "SELECT 1"], ["index"]])
def test_debug_shows_the_traceback_of_kds_own_errors_in_every_command(tmp_path, command):
    """Issue 52 item 2: the command runner is the one place that turns a KdError into a message, so --debug shows
    the traceback of every command's error (a command that caught KdError itself printed the message anyway)."""
    from kd.common.errors import KdError

    missing = str(tmp_path / "no-store")
    argv = [command[0], missing, *command[1:]]
    plain = _run(*argv)
    assert plain.exit_code == 2 and "error:" in plain.output and not isinstance(plain.exception, KdError)
    res = _run("--debug", *argv)
    assert isinstance(res.exception, KdError), (res.output, repr(res.exception))
