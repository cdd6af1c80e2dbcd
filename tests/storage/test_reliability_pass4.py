"""Issue 48, the fourth reliability pass: a query cannot write into its store, a received student's size is
bounded before anything is built, and every JSON/TOML kd reads fails with kd's message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store, tiny_student
from typer.testing import CliRunner

import kd.student
from kd.cli import app
from kd.common.errors import InputError, KdError, StoreError
from kd.storage.manifest import Manifest

HUGE = "9" * 5000  # past Python's 4,300-digit int conversion limit


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pass4")
    return make_store(root / "store", rows=40, shards=2, tmp=root)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- 1. kd query is read-only on the store ------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "COPY (SELECT 1 AS x) TO '{s}/texts/part-00000.parquet' (FORMAT parquet)",
    "COPY (SELECT 1 AS x) TO '{s}/manifest.json' (FORMAT csv)",
    "EXPORT DATABASE '{s}/exported'",
    "ATTACH '{s}/planted.db' AS p; CREATE TABLE p.t AS SELECT 1",
    "SET enable_external_access = true; COPY (SELECT 1) TO '{s}/x.csv'",
    "SET lock_configuration = false",
    "SELECT * FROM read_csv('{s}/manifest.json')",
    "INSTALL httpfs",
])
def test_no_sql_writes_or_reads_a_file(store, sql):
    before = _snapshot(store)
    res = CliRunner().invoke(app, ["query", str(store), sql.format(s=store)])
    assert res.exit_code == 2 and "query failed" in res.output, res.output
    assert _snapshot(store) == before
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0


def test_results_still_leave_through_out(store, tmp_path):
    out = tmp_path / "rows.parquet"
    res = CliRunner().invoke(app, ["query", str(store), "SELECT id, text FROM texts ORDER BY id", "-o", str(out),
                                   "-f", "parquet"])
    assert res.exit_code == 0, res.output
    assert pq.read_table(out).num_rows == 40
    res = CliRunner().invoke(app, ["query", str(store), "SELECT count(*) AS n FROM tiny", "-f", "csv"])
    assert res.exit_code == 0 and res.output.splitlines() == ["n", "40"], res.output


def test_ctrl_c_stops_a_running_query(store):
    """A query of minutes stops within seconds of SIGINT, with kd's message and exit code 130."""
    sql = "SELECT sum(hash(a.i * b.i)) FROM range(100000) a(i), range(100000) b(i)"
    proc = subprocess.Popen([sys.executable, "-m", "kd", "query", str(store), sql], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
    time.sleep(8)  # interpreter start, imports, the store opened: the query is running by now
    assert proc.poll() is None, proc.communicate()[0]
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10, "the query ran on after Ctrl-C"
    assert proc.returncode == 130 and "interrupted" in out, out


def test_a_result_of_any_size_shows_its_head_in_bounded_memory(store):
    """The terminal table reads the first rows of a result as a stream: 10 billion rows (80 GB as one table, as
    the table was built before) show their first 50 in seconds under a 3 GB address-space limit."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    proc = subprocess.run([sys.executable, "-m", "kd", "query", str(store), "SELECT * FROM range(10000000000) r(i)"],
                          capture_output=True, text=True, timeout=120, preexec_fn=limited,
                          env={**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"})
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the first 50 rows; there are more: use --out FILE for all" in said and "│ 49 " in said
    proc = subprocess.run([sys.executable, "-m", "kd", "query", str(store), "SELECT list(range) FROM range(100000000)"],
                          capture_output=True, text=True, timeout=120, preexec_fn=limited,
                          env={**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"})
    said = " ".join((proc.stdout + proc.stderr).split())  # one list of 10^8 numbers: DuckDB's out-of-memory
    assert proc.returncode == 2 and "add a LIMIT or an aggregate, or write it with --out FILE" in said, said
    res = CliRunner().invoke(app, ["query", str(store), "SELECT i FROM range(50) r(i)"])  # exactly the head: all
    assert res.exit_code == 0 and "50 rows" in res.output and "more" not in res.output, res.output


# --- 2. received files are bounded before anything is built -------------------------------------------------


@pytest.fixture(scope="module")
def student(store, tmp_path_factory) -> Path:
    return tiny_student(store, tmp_path_factory.mktemp("pass4s") / "bilstm")


def _forged_copy(student: Path, tmp_path: Path, edit) -> Path:
    import shutil

    copy = tmp_path / "received"
    shutil.copytree(student, copy)
    cfg = json.loads((copy / "config.json").read_text())
    text = edit(cfg)
    (copy / "config.json").write_text(text if isinstance(text, str) else json.dumps(cfg))
    return copy


@pytest.mark.parametrize("arch", ["bilstm", "cnn", "ffn"])
def test_a_billion_layers_is_refused_by_size_without_building_them(student, tmp_path, arch):
    # 10**15 layers: the old estimate built a per-layer list of that length (MemoryError at once)
    received = _forged_copy(student, tmp_path, lambda c: c["student"].update(arch=arch, num_layers=10**15))
    with pytest.raises(KdError, match="GiB"):
        kd.student.load(received)
    res = CliRunner().invoke(app, ["export", str(received), "--out", str(tmp_path / "exp")])
    assert res.exit_code == 2 and "GiB" in res.output, res.output
    assert not (tmp_path / "exp").exists()


def test_a_huge_integer_in_a_student_config_is_kds_message(student, tmp_path):
    forge = lambda c: json.dumps(c).replace('"num_layers": 1', f'"num_layers": {HUGE}')  # noqa: E731
    received = _forged_copy(student, tmp_path, forge)
    assert HUGE in (received / "config.json").read_text()
    with pytest.raises(InputError, match="digits") as e:
        kd.student.load(received)
    assert e.value.where == str(received / "config.json")
    res = CliRunner().invoke(app, ["export", str(received), "--out", str(tmp_path / "exp")])
    assert res.exit_code == 2 and "config.json" in res.output and "Traceback" not in res.output, res.output


def test_a_huge_integer_in_a_manifest_is_a_store_error(store):
    text = (store / "manifest.json").read_text()
    forged = text.replace('"num_rows": 40', f'"num_rows": {HUGE}', 1)
    assert forged != text
    with pytest.raises(StoreError, match="not valid JSON"):
        Manifest.from_json(forged, "manifest.json")


def test_a_huge_integer_in_a_recipe_is_kds_message(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'teacher = "mpnet"\n[[stage]]\nname = "a"\narch = "static"\nepochs = {HUGE}\n')
    res = CliRunner().invoke(app, ["distill", str(tmp_path / "c.txt"), "--recipe", str(recipe), "-o",
                                   str(tmp_path / "run"), "--dry-run"])
    assert res.exit_code == 2 and "digits" in res.output and str(recipe) in res.output, res.output


@pytest.mark.parametrize("text", [HUGE, "-" + HUGE, '{"a": ' + HUGE + "}", "[" * 100000, b"\xff\xfe{}", "{"])
def test_parse_json_turns_every_decode_problem_into_kds_error(text):
    from kd.common.parsing import parse_json

    with pytest.raises(InputError, match="not valid JSON"):
        parse_json(text, "f.json", "fix it")


def test_parse_json_keeps_ordinary_numbers():
    from kd.common.parsing import parse_json, parse_toml

    assert parse_json('{"a": 123456789012345678901234567890, "b": -1.5e300}', "f", "x") == {
        "a": 123456789012345678901234567890, "b": -1.5e300}
    assert parse_toml("a = 1_000\nb = 2.5\n", "f", "x") == {"a": 1000, "b": 2.5}
    with pytest.raises(InputError, match="TOML"):
        parse_toml(f"a = {HUGE}\n", "f", "x")


# --- 5. recipe values: types and layer lists checked when the recipe is read, before any model loads ----------


@pytest.mark.parametrize(("line", "said"), [
    ("epochs = true", "epochs = True is not an integer"),
    ('epochs = "3"', "epochs = '3' is not an integer"),
    ('lr = "1e-4"', "lr = '1e-4' is not a number"),
    ("objectives = \"cosine\"", "objectives must be a non-empty list"),
    ('init_layers = "0,99,-1"', "init_layers '0,99,-1': layers are numbered from 0"),  # no made-up 1024 (probe 6)
])
def test_a_recipe_value_of_the_wrong_type_is_refused_when_read(tmp_path, line, said):
    from kd.apps.distill import recipe as R

    path = tmp_path / "r.toml"
    path.write_text(f'description = "d"\nteacher = "mpnet"\n[outputs]\nteacher = ["sentence", "vocab"]\n'
                    f'[[stage]]\nname = "a"\nfrom = "teacher"\narch = "static"\n{line}\n', encoding="utf-8")
    with pytest.raises(InputError) as e:
        R.load(str(path))
    assert said in e.value.what or said in (e.value.where or ""), e.value
    assert str(path) in (e.value.where or ""), e.value


@pytest.mark.parametrize(("option", "value"), [("arch", "evil"), ("pooling", "sum"), ("schedule", "linear")])
def test_a_recipe_choice_kd_lacks_is_refused_when_read(tmp_path, option, value):
    """`arch = "evil"` passed the recipe's check; kd distill ran the teacher and failed at its third step in the
    student's words, naming no file (the sixth probe). The CLI's choices now hold for recipes and Python calls."""
    from kd.apps.distill import recipe as R

    path = tmp_path / "r.toml"
    lines = {"arch": 'arch = "static"', option: f'{option} = "{value}"'}
    path.write_text('description = "d"\nteacher = "mpnet"\n[outputs]\nteacher = ["sentence", "vocab"]\n'
                    '[[stage]]\nname = "a"\nfrom = "teacher"\n' + "\n".join(lines.values()) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        R.load(str(path))
    assert f"'{value}' is not one of" in e.value.what and str(path) in (e.value.where or ""), e.value
