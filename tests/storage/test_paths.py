"""Paths kd reads from its own records, and paths it writes to, never reach outside what they belong to.

- A path in a manifest, a writer fragment or an export cache spec resolves inside its folder, or is refused
  (validate, repair and the readers) without the outside file being read, hashed or renamed; so is a
  symlink that leads out of the store.
- Counts in a manifest are bounded before anything is allocated (num_shards 10**12: refused at once).
- Every output (--out, --overwrite, --json, --plot, ...) goes through `common.outputs.claim_output`:
  never an input, a folder holding one, a store or another student.
- A damaged export cache is an error naming the cache folder and how to clear it.

The store: real news sentences through a tiny random BERT; a student trained on it for two steps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import precompute_news
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import KdError, StoreError
from kd.storage.repair import repair
from kd.storage.store import Store
from kd.storage.validate import check


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_teacher, sentences) -> dict[str, Path]:
    from kd.student.trainer import TrainConfig, train

    root = tmp_path_factory.mktemp("paths")
    store = precompute_news(root, tiny_teacher, sentences, 150, 50)
    student = train(TrainConfig(str(store), str(root / "students" / "st"), arch="bilstm", target="tiny.mean",
                                embed_dim=8, hidden_dim=8, max_steps=2, batch_size=16, progress=False))
    return {"root": root, "store": store, "student": Path(student)}


@pytest.fixture
def store(built, tmp_path) -> Path:
    """A fresh copy of the store (the tests damage it)."""
    return Path(shutil.copytree(built["store"], tmp_path / "store"))


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _edit_records(store: Path, edit) -> None:
    """Apply `edit(manifest_dict)` to manifest.json and every fragment (as a hand edit of all of them would)."""
    for f in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(f.read_text())
        edit(d)
        f.write_text(json.dumps(d))


# --- paths read from a manifest --------------------------------------------------------------------------


def test_a_shard_path_out_of_the_store_is_refused_and_the_file_left_alone(store, tmp_path):
    outside = tmp_path / "elsewhere" / "x"
    outside.parent.mkdir()
    outside.write_bytes((store / "texts" / "part-00000.parquet").read_bytes())
    before = outside.read_bytes()
    _edit_records(store, lambda d: d["tables"]["texts"]["shards"]["0"].update(file="../elsewhere/x"))

    res = _cli("validate", str(store))
    assert res.exit_code == 2 and "tables.texts.shards.0.file" in res.output and "manifest" in res.output
    res = _cli("validate", str(store), "--repair")
    assert res.exit_code == 2 and "tables.texts.shards.0.file" in res.output
    with pytest.raises(StoreError, match=r"tables\.texts\.shards\.0\.file"):
        Store.open(store).read_table("texts")
    assert outside.read_bytes() == before and not outside.with_name("x.damaged").exists()
    assert (store / "manifest.json").exists()  # repair did not throw the record away either


def test_a_symlink_out_of_the_store_is_never_read_nor_renamed(store, tmp_path):
    shard = store / "teachers" / "tiny" / "part-00001.parquet"
    outside = tmp_path / "outside.parquet"
    shutil.copyfile(shard, outside)  # the same bytes: only where it lies is wrong
    shard.unlink()
    shard.symlink_to(outside)

    with pytest.raises(StoreError, match="leads out") as e:
        Store.open(store).read_table("teachers/tiny")
    assert "part-00001" in str(e.value)
    problems = check(str(store))[1]
    assert [p.file for p in problems] == [str(shard)] and "leads out" in problems[0].what
    report = repair(str(store))
    assert [(t, k) for t, k, _ in report.dropped] == [("teachers/tiny", 1)]
    # the target is never touched; the link itself is removed (renamed aside it would still lead out of the
    # store), so the rerun of precompute writes a real file there
    assert outside.is_file() and not os.path.lexists(shard)
    assert not os.path.lexists(shard.with_name(shard.name + ".damaged"))


def test_a_huge_num_shards_is_refused_at_once_with_little_memory(store, tmp_path):
    """num_shards 10**12 in manifest.json and the fragment: validate answers in seconds, under a 3 GB cap."""
    def edit(d):
        d["inputs"]["num_shards"] = 10**12
    _edit_records(store, edit)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
            "from kd.cli import main; sys.argv = ['kd', 'validate', sys.argv[1]]; main()")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "inputs.num_shards" in res.stdout + res.stderr and "Traceback" not in res.stderr
    assert time.perf_counter() - t0 < 60


def test_a_shard_number_past_the_plan_is_refused(store):
    _edit_records(store, lambda d: d["tables"]["texts"]["shards"].update(
        {str(10**12): d["tables"]["texts"]["shards"]["0"]}))
    with pytest.raises(StoreError, match="outside the plan"):
        Store.open(store)


# --- outputs --------------------------------------------------------------------------------------------


def test_export_overwrite_never_deletes_the_student_or_a_store(built, store, tmp_path):
    student, parent = built["student"], built["student"].parent
    kept = _snapshot(student)
    res = _cli("export", str(student), "--format", "onnx", "--out", str(parent), "--overwrite")
    assert res.exit_code == 2 and "contains the input" in res.output
    assert _snapshot(student) == kept
    before = _snapshot(store)
    res = _cli("export", str(student), "--format", "onnx", "--out", str(store), "--overwrite")
    assert res.exit_code == 2 and "kd precompute" in res.output and _snapshot(store) == before
    other = Path(shutil.copytree(student, tmp_path / "other"))
    res = _cli("export", str(student), "--format", "onnx", "--out", str(other), "--overwrite")
    assert res.exit_code == 2 and "kd train-student" in res.output and _snapshot(other) == kept
    res = _cli("export", str(student), "--format", "onnx", "--out", str(tmp_path / "e"))
    assert res.exit_code == 0, res.output
    res = _cli("export", str(student), "--format", "onnx", "--out", str(tmp_path / "e"), "--overwrite")
    assert res.exit_code == 0, res.output  # a previous export is what --overwrite replaces


def test_train_student_never_writes_into_the_store(built, store):
    before = _snapshot(store)
    for out in (store, store / "students" / "new"):
        res = _cli("train-student", "--shards", str(store), "--out", str(out), "--max-steps", "1", "--no-progress")
        assert res.exit_code == 2 and "input" in res.output, res.output
    assert _snapshot(store) == before


def test_overwrite_replaces_only_what_the_command_wrote(built, tmp_path, sentences, tiny_teacher):
    hf = tmp_path / "my-model"  # someone's Hugging Face model: train-student --overwrite must not touch it
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "bert"}')
    (hf / "model.safetensors").write_bytes(b"weights")
    res = _cli("train-student", "--shards", str(built["store"]), "--out", str(hf), "--overwrite", "--max-steps",
               "1", "--no-progress")
    assert res.exit_code == 2 and "only replaces a folder written by kd train-student" in res.output
    assert (hf / "model.safetensors").read_bytes() == b"weights"
    src = tmp_path / "news.txt"
    src.write_text("\n".join(sentences[:20]) + "\n", encoding="utf-8")
    other = Path(shutil.copytree(built["student"], tmp_path / "student"))
    kept = _snapshot(other)
    res = _cli("precompute", str(src), "--out", str(other), "--teacher", f"tiny={tiny_teacher}",
               "--overwrite", "--no-progress")
    assert res.exit_code == 2 and "kd train-student" in res.output and _snapshot(other) == kept


def test_file_outputs_never_land_in_a_store(built, store, tmp_path):
    before = _snapshot(store)
    src = tmp_path / "texts.txt"
    src.write_text("the market fell\n", encoding="utf-8")
    res = _cli("embed", str(src), "--student", str(built["student"]), "--out", str(store / "v.parquet"),
               "--no-progress")
    assert res.exit_code == 2 and "inside a store" in res.output
    res = _cli("query", str(store), "SELECT 1 AS x", "--format", "json", "--out", str(store / "manifest.json"))
    assert res.exit_code == 2 and "inside the input" in res.output
    assert _snapshot(store) == before


def test_eval_outputs_are_checked_before_the_work(built, tmp_path, monkeypatch):
    from kd.apps.eval import run as E

    def work(*a, **kw):
        raise AssertionError("the evaluation started")

    monkeypatch.setattr(E, "_models", work)
    res = _cli("eval", "--store", str(built["store"]), "--json", str(tmp_path), "--no-progress")
    assert res.exit_code == 2 and "--json" in res.output and "existing folder" in res.output, res.output
    taken = tmp_path / "taken.txt"
    taken.write_text("mine")
    res = _cli("eval", "--store", str(built["store"]), "--plot", str(taken), "--no-progress")
    assert res.exit_code == 2 and "--plot" in res.output and taken.read_text() == "mine"
    res = _cli("eval", "--store", str(built["store"]), "--markdown", str(taken / "r.md"), "--no-progress")
    assert res.exit_code == 2 and "not a folder" in res.output


# --- the export cache -----------------------------------------------------------------------------------


def _needs_onnx() -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")


def test_a_cache_that_is_a_file_is_a_clear_error(tmp_path, tiny_teacher, monkeypatch):
    from kd.pipeline.backends import loading

    _needs_onnx()
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "cache"))
    with pytest.raises(KdError, match="export cache cannot be written") as e:
        loading.load(str(tiny_teacher), "onnx")
    assert str(tmp_path / "cache") in e.value.where and "KD_CACHE" in e.value.fix


def test_a_damaged_cache_names_its_folder_and_how_to_clear_it(tmp_path, tiny_teacher, monkeypatch):
    from kd.pipeline.backends import loading
    from kd.pipeline.backends import runtime as backends
    from kd.storage import fs

    _needs_onnx()
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "cache"))
    folder = loading.load(str(tiny_teacher), "onnx").backend.folder
    spec = json.loads((folder / backends.SPEC).read_text())
    # a graph cut short whose record was rewritten to match: only the runtime can tell
    graph = folder / spec["file"]
    graph.write_bytes(graph.read_bytes()[:2000])
    spec["files"][spec["file"]] = fs.file_sha256(graph)
    (folder / backends.SPEC).write_text(json.dumps(spec))
    with pytest.raises(KdError, match="cannot be run") as e:
        loading.load(str(tiny_teacher), "onnx")
    assert e.value.where == str(folder) and f"delete {folder}" in e.value.fix
    shutil.rmtree(folder)  # what the error says: the next run exports again
    monkeypatch.setitem(backends.THRESHOLDS, "float32", 1.5)  # nothing reaches it
    with pytest.raises(KdError, match="departs from torch fp32") as e:
        loading.load(str(tiny_teacher), "onnx")
    assert str(folder) in e.value.where and f"delete {folder}" in e.value.fix


def test_a_cache_spec_naming_a_file_outside_is_never_read(tmp_path, tiny_teacher, monkeypatch):
    from kd.pipeline.backends import loading
    from kd.pipeline.backends import runtime as backends
    from kd.storage import fs

    _needs_onnx()
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "cache"))
    folder = loading.load(str(tiny_teacher), "onnx").backend.folder
    secret = tmp_path / "secret"
    secret.write_text("not kd's")
    spec = json.loads((folder / backends.SPEC).read_text())
    spec["files"]["../../../secret"] = fs.file_sha256(secret)
    (folder / backends.SPEC).write_text(json.dumps(spec))
    hashed = []
    real = fs.file_sha256
    monkeypatch.setattr(fs, "file_sha256", lambda p: hashed.append(Path(p).resolve()) or real(p))
    loading.load(str(tiny_teacher), "onnx")  # the cache is rebuilt, as for any other damage
    assert secret.resolve() not in hashed and secret.read_text() == "not kd's"
    assert "../../../secret" not in json.loads((folder / backends.SPEC).read_text())["files"]


def test_overwrite_never_deletes_a_kd_folder_below_the_output(built, tmp_path):
    from kd.common.outputs import EXPORT, claim_output

    old = tmp_path / "old-export"
    old.mkdir()
    (old / "kd_onnx.json").write_text('{"format": "kd-onnx"}')
    shutil.copytree(built["student"], old / "kept-student")  # someone put a student in it
    with pytest.raises(KdError, match="would delete a student"):
        claim_output(old, "kd export", (EXPORT,), overwrite=True, fresh=True, remove=True)
    assert (old / "kept-student" / "config.json").exists()
    (old / "kept-student").rename(tmp_path / "moved")
    assert claim_output(old, "kd export", (EXPORT,), overwrite=True, fresh=True, remove=True) == old.resolve()
    assert not old.exists()  # removed: only a previous export was there
