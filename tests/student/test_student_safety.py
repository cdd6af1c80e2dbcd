"""Nothing from a received folder runs code, and a checkpoint only resumes the run it belongs to."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
import training_runs
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store
from training_runs import SMALL, killed_run, train_cli

from kd.student import trainer as T

# module fixtures (this module's own): a 140-row synthetic store, and a bilstm trained 3 steps on it
store_path, trained, exported = training_runs.store_path, training_runs.trained, training_runs.exported

MARKER = Path(os.environ.get("TMPDIR", "/tmp")) / "kd-pwned-marker"


class _Evil:
    """Unpickling this runs `touch MARKER` (what a malicious checkpoint would do)."""

    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def test_a_malicious_checkpoint_is_refused_and_never_run(store_path, tmp_path):
    MARKER.unlink(missing_ok=True)
    out = tmp_path / "received"
    out.mkdir()
    (out / ".kd-train.lock").touch()  # a copied run folder, as kd left it (without it: not kd's, refused earlier)
    torch.save({"config": {}, "world": 1, "model": {}, "rng": [], "evil": _Evil()}, out / "checkpoint.pt")
    res = train_cli("--shards", str(store_path), "--out", str(out), "--arch", "bilstm", "--max-steps", "2")
    assert res.exit_code == 2, res.output
    assert "refusing to load" in res.output and "checkpoint.pt" in res.output
    assert not MARKER.exists()


def test_a_truncated_checkpoint_is_a_clear_error(store_path, tmp_path, monkeypatch):
    out = tmp_path / "out"
    killed_run(store_path, out, monkeypatch)
    data = (out / "checkpoint.pt").read_bytes()
    (out / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    res = train_cli("--shards", str(store_path), "--out", str(out), *_small_args())
    assert res.exit_code == 2 and "cannot be read" in res.output and "checkpoint.pt" in res.output


def test_resume_refuses_a_rebuilt_store(store_path, tmp_path, monkeypatch):
    """Kill training, change the store at the same path, rerun: refused instead of mixing two datasets."""
    store = tmp_path / "store"
    shutil.copytree(store_path, store)
    out = tmp_path / "out"
    killed_run(store, out, monkeypatch)
    shutil.rmtree(store)
    make_store(store, rows=140, shards=2, seed=1, tmp=tmp_path)  # rebuilt from other inputs, same path
    with pytest.raises(Exception, match="another store"):
        T.train(T.TrainConfig(str(store), str(out), **SMALL))
    shutil.rmtree(store)
    shutil.copytree(store_path, store)  # the original store again: the run resumes and finishes
    T.train(T.TrainConfig(str(store), str(out), **SMALL))
    assert (out / "config.json").exists() and not (out / "checkpoint.pt").exists()


def _small_args() -> list[str]:
    return ["--arch", "bilstm", "--embed-dim", "16", "--hidden-dim", "16", "--batch-size", "8", "--epochs", "2",
            "--val-percent", "10"]


def _copy(trained: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "copy"))


def _load_error(folder: Path) -> str:
    from kd import student

    with pytest.raises(Exception) as e:
        student.load(folder)
    assert type(e.value).__name__ == "InputError", repr(e.value)
    return str(e.value)


def test_flipped_weight_bytes_are_refused(trained, tmp_path):
    f = _copy(trained, tmp_path)
    data = bytearray((f / "model.safetensors").read_bytes())
    data[-8:] = b"\xff" * 8  # the last values of a tensor: a NaN/garbage weight, header intact
    (f / "model.safetensors").write_bytes(bytes(data))
    assert "does not match the checksum" in _load_error(f)


@pytest.mark.parametrize("damage,expect", [
    ("no-weights", "no model.safetensors"),
    ("no-tokenizer", "no tokenizer/"),
    ("truncated-weights", "does not match the checksum"),
    ("garbage-config", "not valid JSON"),
    ("config-list", "not a kd student config"),
    ("shape-mismatch", "do not fit the student"),
])
def test_damaged_student_folders_give_clear_errors(trained, tmp_path, damage, expect):
    import json

    f = _copy(trained, tmp_path)
    if damage == "no-weights":
        (f / "model.safetensors").unlink()
    elif damage == "no-tokenizer":
        shutil.rmtree(f / "tokenizer")
    elif damage == "truncated-weights":
        data = (f / "model.safetensors").read_bytes()
        (f / "model.safetensors").write_bytes(data[: len(data) // 3])
    elif damage == "garbage-config":
        (f / "config.json").write_bytes(b"\x00{not json")
    elif damage == "config-list":
        (f / "config.json").write_text("[]")
    else:
        cfg = json.loads((f / "config.json").read_text())
        cfg["student"]["hidden_dim"] = cfg["student"]["hidden_dim"] * 2
        (f / "config.json").write_text(json.dumps(cfg))
    assert expect in _load_error(f)


def test_encode_takes_a_string_and_refuses_none(trained):
    from kd import student

    s = student.load(trained)
    one = s.encode("the market fell")
    assert one.shape == (s.dim,)
    assert torch.allclose(torch.from_numpy(one), torch.from_numpy(s.encode(["the market fell"])[0]))
    with pytest.raises(Exception, match="item 1 is NoneType"):
        s.encode(["fine", None])


def test_cuda_without_cuda_is_a_clear_error(trained, monkeypatch):
    from kd import student

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(Exception, match="no CUDA device"):
        student.load(trained, device="cuda")


def test_a_second_run_into_the_same_folder_is_refused(store_path, tmp_path):
    """Two train-student processes into one --out: the second stops at once, naming the lock."""
    import subprocess
    import sys

    from kd.storage import fs

    out = tmp_path / "out"
    held = fs.exclusive_lock(str(out / ".kd-train.lock"))  # what a running first process holds
    assert held is not None
    code = ("import sys; from typer.testing import CliRunner; from cli import app; "
            "r = CliRunner().invoke(app, sys.argv[1:]); print(r.output); sys.exit(r.exit_code)")
    res = subprocess.run([sys.executable, "-c", code, "train-student", "--shards", str(store_path), "--out", str(out),
                          "--max-steps", "2", "--no-progress"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    held.close()
    assert res.returncode == 2 and "another kd train-student" in res.stdout, res.stdout + res.stderr
    assert not (out / "model.safetensors").exists()
    T.train(T.TrainConfig(str(store_path), str(out), **(SMALL | {"epochs": 1, "max_steps": 2})))  # free again
    assert (out / "model.safetensors").exists()


def test_out_that_is_a_file_is_refused(store_path, tmp_path):
    f = tmp_path / "taken.txt"
    f.write_text("mine")
    res = train_cli("--shards", str(store_path), "--out", str(f))
    assert res.exit_code == 2 and "existing file" in res.output and f.read_text() == "mine"


def _embed(*args: str):
    from typer.testing import CliRunner

    from kd.cli import app

    return CliRunner().invoke(app, ["embed", *args, "--no-progress"])


def test_embed_never_overwrites_inputs_or_files(trained, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\ufeffthe market fell\nthe dog runs\n", encoding="utf-8")
    res = _embed(str(src), "--student", str(trained), "--out", str(src), "--overwrite")
    assert res.exit_code == 2 and "is the input" in res.output
    assert src.read_text(encoding="utf-8").startswith("\ufeffthe market")
    other = tmp_path / "mine.parquet"
    other.write_text("not yours")
    res = _embed(str(src), "--student", str(trained), "--out", str(other))
    assert res.exit_code == 2 and "already exists" in res.output and other.read_text() == "not yours"
    res = _embed(str(src), "--student", str(trained), "--out", str(tmp_path))
    assert res.exit_code == 2 and "existing folder" in res.output
    res = _embed(str(src), "--student", str(trained), "--out", str(other), "--overwrite")
    assert res.exit_code == 2 and "only replaces a file kd wrote" in res.output and other.read_text() == "not yours"
    mine = tmp_path / "vectors.parquet"
    for flags in ([], ["--overwrite"]):  # written, then replaced by kd's own output
        res = _embed(str(src), "--student", str(trained), "--out", str(mine), *flags)
        assert res.exit_code == 0, res.output
    import pyarrow.parquet as pq

    assert pq.read_table(mine)["text"].to_pylist() == ["the market fell", "the dog runs"]  # BOM dropped


@pytest.mark.parametrize("content,expect", [
    (b"caf\xe9 au lait\n", "not UTF-8"),
    (b'{"text": "fine"}\n{"text": broken\n', "invalid JSON"),
    (b'{"text": 42}\n', "not a string"),
])
def test_embed_bad_inputs_name_the_line(trained, tmp_path, content, expect):
    src = tmp_path / ("in.jsonl" if content.startswith(b"{") else "in.txt")
    src.write_bytes(content)
    res = _embed(str(src), "--student", str(trained), "--out", str(tmp_path / "v.parquet"))
    assert res.exit_code == 2 and expect in res.output and str(src.name) in res.output, res.output
    assert not (tmp_path / "v.parquet").exists()


def test_embed_refuses_a_path_traversing_name(trained, store_path):
    res = _embed(str(store_path), "--student", str(trained), "--name", "../../x")
    assert res.exit_code == 2 and "invalid student table name" in res.output
    assert not (Path(store_path).parent.parent / "x").exists()


def test_eval_says_why_a_cell_is_empty():
    import json

    import numpy as np

    from kd.apps.eval import metrics
    from kd.apps.eval.run import COLUMNS, EvalReport, ModelResult

    rng = np.random.default_rng(0)
    tv = rng.normal(size=(20, 8)).astype(np.float32)
    sv = tv.copy()
    sv[3] = np.nan  # what a student trained on overflowed fp16 targets gives
    teacher, student = ModelResult("teacher", "teacher"), ModelResult("s1", "student")
    teacher.put("cos_to_teacher", metrics.mean_cosine_agreement(tv, tv), tv, tv)
    student.put("cos_to_teacher", metrics.mean_cosine_agreement(sv, tv), sv, tv)
    student.details["speed"] = "not measured: weights file missing"
    cols = [c for c in COLUMNS if c.key in ("cos_to_teacher", "latency_ms")]
    report = EvalReport([teacher, student], cols, {})
    assert report.cell(teacher, cols[0]) == "1.000"
    assert report.cell(student, cols[0]) == "— [1]" and report.cell(student, cols[1]) == "— [2]"
    md = report.markdown()
    assert "[1] s1: 1 of 40 vectors are NaN/Inf" in md and "[2] s1: not measured: weights file missing" in md
    out = json.loads(json.dumps(report.to_json(), allow_nan=False))  # valid JSON: no NaN token
    row = out["models"][1]
    assert row["metrics"]["cos_to_teacher"] is None and "NaN/Inf" in row["empty"]["cos_to_teacher"]


def test_disk_full_while_saving_the_student_is_a_clear_error(store_path, tmp_path, monkeypatch):
    """ENOSPC mid-write: exit 2 naming the disk, no (half-written) model, temp files removed; a rerun finishes."""
    import errno

    out = tmp_path / "out"
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:  # the bytes went to the page cache; the disk refuses them at fsync
        if "model.safetensors.tmp" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    res = train_cli("--shards", str(store_path), "--out", str(out), *_small_args())
    assert res.exit_code == 2 and "disk is full" in res.output, res.output
    assert "training resumes from the last checkpoint" in " ".join(res.output.split()), res.output
    assert not (out / "model.safetensors").exists() and not (out / "config.json").exists()
    assert not list(out.glob("*.tmp*"))
    monkeypatch.setattr(os, "fsync", real_fsync)
    (out / "checkpoint.pt.tmp-0badf00d").write_bytes(b"half")  # what a kill -9 mid-write leaves
    res = train_cli("--shards", str(store_path), "--out", str(out), *_small_args())
    assert res.exit_code == 0, res.output
    assert (out / "config.json").exists() and not list(out.glob("*.tmp*"))


def test_disk_full_before_the_first_checkpoint_says_the_rerun_starts_again(store_path, tmp_path, monkeypatch):
    """ENOSPC at the first checkpoint (the best weights and metrics already written): nothing can be resumed, so
    the message must not promise it, and the same command rerun must train rather than ask for --overwrite."""
    import errno

    out = tmp_path / "out"
    out.mkdir()  # the user's empty folder: not removed as a folder kd created would be
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        if "checkpoint.pt.tmp" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    res = train_cli("--shards", str(store_path), "--out", str(out), *_small_args(), "--checkpoint-every", "2")
    assert res.exit_code == 2 and "disk is full" in res.output, res.output
    assert "starts again" in res.output and "resumes from" not in res.output, res.output
    assert sorted(p.name for p in out.iterdir()) in ([], [".kd-train.lock"]), list(out.iterdir())
    monkeypatch.setattr(os, "fsync", real_fsync)
    res = train_cli("--shards", str(store_path), "--out", str(out), *_small_args(), "--checkpoint-every", "2")
    assert res.exit_code == 0, res.output
    assert (out / "config.json").exists()


def test_a_student_config_without_its_weights_checksum_is_refused(trained, tmp_path):
    import json

    f = _copy(trained, tmp_path)
    cfg = json.loads((f / "config.json").read_text())
    del cfg["weights_sha256"]  # a received folder whose weights could then be anything
    (f / "config.json").write_text(json.dumps(cfg))
    assert "no weights_sha256" in _load_error(f)
    src = tmp_path / "in.txt"
    src.write_text("the market fell\n", encoding="utf-8")
    res = _embed(str(src), "--student", str(f), "--out", str(tmp_path / "v.parquet"))
    assert res.exit_code == 2 and "no weights_sha256" in res.output and not (tmp_path / "v.parquet").exists()


PLANTED = "import pathlib\npathlib.Path({marker!r}).touch()\n\nclass Evil:\n    pass\n"




def _tamper(folder: Path, how: str) -> None:
    import json

    modules = json.loads((folder / "modules.json").read_text())
    (folder / "evil.py").write_text(PLANTED.format(marker=str(MARKER)))
    if how == "planted-class":
        modules[0]["type"] = "evil.Evil"  # what makes trust_remote_code=True import evil.py
    elif how == "class-outside":  # the code beside the folder (on sys.path, or a package installed)
        (folder / "evil.py").rename(folder.parent / "evil.py")
        modules[0]["type"] = "evil.Evil"
    elif how == "look-alike-class":
        (folder / "evil.py").unlink()
        modules[0]["type"] = "kd.student.st_module_evil.KdTokenEncoder"
    elif how == "escaping-path":
        (folder / "evil.py").unlink()
        modules[1]["path"] = "../../elsewhere"
    elif how == "auto-map":
        (folder / "evil.py").unlink()
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg["auto_map"] = {"AutoTokenizer": ["evil.Evil", None]}
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "modules.json").write_text(json.dumps(modules))


@pytest.mark.parametrize("how,expect", [
    ("planted-class", "Python code"),
    ("extra-py-only", "evil.py"),
    ("class-outside", "'evil.Evil'"),
    ("look-alike-class", "st_module_evil"),
    ("escaping-path", "outside the folder"),
    ("auto-map", "auto_map"),
])
def test_a_tampered_export_is_refused_and_its_code_never_runs(exported, tmp_path, monkeypatch, how, expect):
    from kd import student

    MARKER.unlink(missing_ok=True)
    monkeypatch.syspath_prepend(str(tmp_path))  # "evil" is importable from beside the folder
    folder = Path(shutil.copytree(exported, tmp_path / "received"))
    _tamper(folder, how)
    with pytest.raises(Exception) as e:
        student.load_exported(folder)
    assert type(e.value).__name__ == "InputError" and expect in str(e.value), repr(e.value)
    assert "do not load this folder" in e.value.fix
    assert not MARKER.exists()
    planted = next((p for p in (folder / "evil.py", tmp_path / "evil.py") if p.exists()), None)
    if planted is not None:  # the planted file does what it says when something does import it
        import importlib.util

        spec = importlib.util.spec_from_file_location("evil_check", planted)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert MARKER.exists()
        MARKER.unlink()


def test_the_untampered_export_loads_and_kd_load_points_at_the_safe_loader(exported):
    import numpy as np

    from kd import student

    texts = ["the market fell", "the dog runs in the river"]
    got = student.load_exported(exported).encode(texts)
    want = student.load(exported.parent / "bigru").encode(texts)  # the student it was exported from
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    assert "load_exported" in _load_error(exported)
