"""NaN/Inf never reach weights, files or vectors (issue 24, "Numbers").

Every trainer refuses a non-finite label or target before training, naming where it is (file and row,
or table, shard and row id), stops at a non-finite loss, and saves no non-finite weights; `kd embed`
writes no NaN vector; a student whose weights are NaN is refused on load.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import training_runs
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store
from task_pairs import write_pairs
from training_runs import SMALL
from typer.testing import CliRunner

from kd.cli import app
from kd.pipeline.teacher import finetune as FT
from kd.storage import fs
from kd.storage.store import Store
from kd.student import finetune as F
from kd.student import trainer as T

PAIRS = ["--pair-columns", "a,b", "--label-column", "quality"]


# module fixtures (this module's own): a 140-row synthetic store, and a bilstm trained 3 steps on it
store_path, student_dir = training_runs.store_path, training_runs.trained


def _scores(folder: Path, bad: str | None = None, line: int = 7) -> Path:
    """24 scored pairs (word shuffles score ~4, unrelated words ~0); with `bad`, line `line` gets that label."""
    path = write_pairs(folder / "train.tsv", 24, 0, score=True)
    if bad is not None:
        lines = path.read_text().splitlines()
        lines[line - 1] = bad + lines[line - 1][lines[line - 1].index("\t"):]
        path.write_text("\n".join(lines) + "\n")
    return path


def _finetune_teacher(tiny_teacher: Path, train: Path, out: Path):
    return CliRunner().invoke(app, ["finetune-teacher", "--base", str(tiny_teacher), "--task", "pair-regression",
                                    "--train", str(train), "--out", str(out), "--max-steps", "4", "--lr", "1e-3",
                                    "--batch-size", "8", "--device", "cpu", "--no-progress", *PAIRS])


def _finetune(student: Path, train: Path, out: Path):
    return CliRunner().invoke(app, ["finetune", "--student", str(student), "--task", "pair-regression", "--train",
                                    str(train), "--out", str(out), "--max-steps", "4", "--batch-size", "8",
                                    "--hidden", "16", "--device", "cpu", "--no-progress", *PAIRS])


# --- labels ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["nan", "inf", "-Infinity"])
def test_finetune_teacher_refuses_a_non_finite_label_naming_file_and_row(tiny_teacher, tmp_path, bad):
    train = _scores(tmp_path, bad, line=7)
    res = _finetune_teacher(tiny_teacher, train, tmp_path / "teacher")
    assert res.exit_code == 2, res.output
    assert "not finite" in res.output and "train.tsv:7" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "teacher").exists()


def test_finetune_refuses_a_non_finite_label_naming_file_and_row(student_dir, tmp_path):
    train = _scores(tmp_path, "nan", line=12)
    res = _finetune(student_dir, train, tmp_path / "ft")
    assert res.exit_code == 2, res.output
    assert "not finite" in res.output and "train.tsv:12" in res.output
    assert not (tmp_path / "ft").exists()


def test_a_nan_class_label_is_refused_too(tmp_path):
    """A classification label "nan" is a missing number (a float column with a hole), not a class."""
    from kd.common.errors import InputError
    from kd.common.tasks import Task, read_task, task_columns

    path = write_pairs(tmp_path / "cls.tsv", 12, 0)
    lines = path.read_text().splitlines()
    lines[4] = "nan" + lines[4][lines[4].index("\t"):]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="not finite") as e:
        read_task(str(path), Task.pair_classification, task_columns(Task.pair_classification, None, "a,b", "quality"))
    assert e.value.where.startswith("cls.tsv:5")


# --- targets from a store ----------------------------------------------------------------------------------


def test_train_student_refuses_a_nan_target_naming_table_shard_and_row(tmp_path):
    store = make_store(tmp_path / "store", rows=140, shards=2, tmp=tmp_path, nan_at=(1, 9))
    bad_id = Store.open(store).read_shard("texts", 1, ["id"]).column("id")[9].as_py()
    out = tmp_path / "student"
    res = CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(out), "--target",
                                   "tiny.mean", "--max-steps", "40", "--batch-size", "8", "--no-progress"])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "'teachers/tiny'" in text and "shard 1" in text and str(bad_id) in text and "'mean'" in text, text
    assert not out.exists()  # refused before the output folder is made, let alone a checkpoint


def test_finetune_refuses_nan_teacher_logits_in_the_kd_store(student_dir, tmp_path):
    from store_builder import TableSpec, build_store

    from kd.common.ids import row_ids
    from kd.common.tasks import Task, read_task, task_columns

    train = _scores(tmp_path)
    rows = read_task(str(train), Task.pair_regression, task_columns(Task.pair_regression, None, "a,b", "quality"))
    logits = rows.scores().astype(np.float32)[:, None]
    logits[5] = np.inf
    ids = row_ids(rows.texts)
    build_store(tmp_path / "kd", rows.texts, {"teachers/ce": TableSpec("teacher", {"logits": logits})}, ids=ids)
    res = CliRunner().invoke(app, ["finetune", "--student", str(student_dir), "--task", "pair-regression", "--train",
                                   str(train), "--out", str(tmp_path / "ft"), "--kd-store", str(tmp_path / "kd"),
                                   "--max-steps", "2", "--device", "cpu", "--no-progress", *PAIRS])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "NaN/Inf logits" in text and str(int(ids[5])) in text and "train.tsv:7" in text
    assert not (tmp_path / "ft").exists()


# --- a loss that goes non-finite during training -----------------------------------------------------------


def _nan_after(real, calls: int):
    """`real`, whose result becomes NaN from call `calls` on (a run that diverges mid-way)."""
    seen = [0]

    def wrapped(*a, **kw):
        seen[0] += 1
        out = real(*a, **kw)
        return out * float("nan") if seen[0] >= calls else out

    return wrapped


def test_finetune_teacher_stops_at_a_nan_loss_and_writes_nothing(tiny_teacher, tmp_path, monkeypatch):
    monkeypatch.setattr(FT, "task_loss", _nan_after(FT.task_loss, 3))
    res = _finetune_teacher(tiny_teacher, _scores(tmp_path), tmp_path / "teacher")
    assert res.exit_code == 2, res.output
    assert "loss is not finite" in res.output and "step 3" in res.output
    assert not (tmp_path / "teacher").exists()  # no weights at all, so none that are NaN


def test_finetune_stops_at_a_nan_loss_and_writes_nothing(student_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(F, "_mixed_loss", _nan_after(F._mixed_loss, 2))
    res = _finetune(student_dir, _scores(tmp_path), tmp_path / "ft")
    assert res.exit_code == 2, res.output
    assert "loss is not finite" in res.output and "step 2" in res.output
    assert not (tmp_path / "ft").exists()


def test_train_student_never_saves_non_finite_weights_and_keeps_the_last_good_checkpoint(store_path, tmp_path,
                                                                                          monkeypatch):
    """Weights that turn NaN with a finite loss (an overflowing update) are caught at the next save: the
    checkpoint of step 5 stays, nothing of step 10 is written."""
    real = T._train_step

    def overflowing(run, st, batch):
        parts = real(run, st, batch)
        if st.step + 1 == 10:
            with torch.no_grad():
                next(run.tr.model.student.parameters()).fill_(float("inf"))
        return parts

    monkeypatch.setattr(T, "_train_step", overflowing)
    out = tmp_path / "out"
    with pytest.raises(Exception, match="NaN/Inf") as e:
        T.train(T.TrainConfig(str(store_path), str(out), **(SMALL | {"val_percent": 0.0})))
    assert type(e.value).__name__ == "KdError"
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["step"] == 5
    assert all(bool(v.isfinite().all()) for v in state["model"].values() if v.is_floating_point())
    assert not (out / "model.safetensors").exists() and not (out / T.BEST).exists()


# --- kd embed and loading ----------------------------------------------------------------------------------


def _embed(*args: str):
    return CliRunner().invoke(app, ["embed", *args, "--no-progress"])


def test_embed_refuses_non_finite_vectors_naming_the_row(student_dir, store_path, tmp_path, monkeypatch):
    from kd.student.saved import LoadedStudent

    real = LoadedStudent.encode

    def overflowing(self, texts, *a, **kw):
        out = real(self, texts, *a, **kw)
        out[min(3, len(out) - 1)] = np.inf
        return out

    monkeypatch.setattr(LoadedStudent, "encode", overflowing)
    src = tmp_path / "in.txt"
    src.write_text("the market fell\nthe dog runs\na cat sat\nthe river rose\n", encoding="utf-8")
    res = _embed(str(src), "--student", str(student_dir), "--out", str(tmp_path / "v.parquet"))
    assert res.exit_code == 2 and "NaN/Inf vectors" in res.output and "row 3" in res.output, res.output
    assert not (tmp_path / "v.parquet").exists()
    store = Path(shutil.copytree(store_path, tmp_path / "store"))
    bad_id = Store.open(store).read_shard("texts", 0, ["id"]).column("id")[3].as_py()
    res = _embed(str(store), "--student", str(student_dir), "--name", "s")
    assert res.exit_code == 2 and f"row id {bad_id}" in " ".join(res.output.split()), res.output
    table = Store.open(store).manifest.tables.get("students/s")
    assert table is None or not table.shards  # declared at most: no shard of NaN vectors committed


def _with_weights(student: Path, folder: Path, change) -> Path:
    """A copy of `student` whose weights were changed by `change(state)` and re-checksummed (as a sender would)."""
    from safetensors.torch import load_file, save_file

    f = Path(shutil.copytree(student, folder))
    state = load_file(str(f / "model.safetensors"))
    change(state)
    save_file(state, str(f / "model.safetensors"), metadata={"format": "kd-student"})
    cfg = json.loads((f / "config.json").read_text())
    cfg["weights_sha256"] = fs.file_sha256(f / "model.safetensors")
    (f / "config.json").write_text(json.dumps(cfg))
    return f


def test_a_student_with_nan_weights_is_refused_by_load_and_embed(student_dir, tmp_path):
    from kd import student

    f = _with_weights(student_dir, tmp_path / "nan-student",
                      lambda s: s[next(k for k in s if k.startswith("student."))].fill_(float("nan")))
    with pytest.raises(Exception, match="NaN/Inf") as e:
        student.load(f)
    assert type(e.value).__name__ == "InputError"
    src = tmp_path / "in.txt"
    src.write_text("the market fell\n", encoding="utf-8")
    res = _embed(str(src), "--student", str(f), "--out", str(tmp_path / "v.parquet"))
    assert res.exit_code == 2 and "NaN/Inf" in res.output and not (tmp_path / "v.parquet").exists()


def test_embed_of_a_sound_student_writes_finite_vectors(student_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("the market fell\nthe dog runs\n", encoding="utf-8")
    res = _embed(str(src), "--student", str(student_dir), "--out", str(tmp_path / "v.parquet"))
    assert res.exit_code == 0, res.output
    vecs = np.array(pq.read_table(tmp_path / "v.parquet")["embedding"].to_pylist())
    assert vecs.shape[0] == 2 and np.isfinite(vecs).all()


@pytest.mark.parametrize("every_step", [True, False], ids=["cpu-each-step", "gpu-deferred"])
def test_train_student_names_the_first_nan_step_whether_checked_each_step_or_deferred(store_path, tmp_path,
                                                                                     monkeypatch, every_step):
    """On a GPU the loss is read at records and checkpoints only (a per-step read is a sync that idles it): a
    forward that turns NaN at step 7 is still reported as step 7, and the checkpoint of step 5 is the last one."""
    real, calls = T.Distiller.forward, [0]

    def diverging(self, batch, progress):
        calls[0] += 1
        loss, parts = real(self, batch, progress)
        return (loss * float("nan"), parts * float("nan")) if calls[0] >= 7 else (loss, parts)

    monkeypatch.setattr(T, "_checks_every_step", lambda run: every_step)
    monkeypatch.setattr(T.Distiller, "forward", diverging)
    out = tmp_path / "out"
    cfg = SMALL | {"val_percent": 0.0, "checkpoint_every": 5, "log_every": 20}
    with pytest.raises(Exception, match="not finite at step 7") as e:
        T.train(T.TrainConfig(str(store_path), str(out), **cfg))
    assert type(e.value).__name__ == "KdError"
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 5
    assert not (out / "model.safetensors").exists()
