"""student.trainer: exact resume (in-process crash and SIGKILL), DDP on CPU, never the teacher, CLI, errors."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import training_runs
from safetensors.numpy import load_file as load_np
from safetensors.torch import load_file
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import TEACHER, make_store
from training_runs import SMALL, killed_run, train_cli
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import KdError
from kd.storage.store import Store
from kd.student import checkpoint
from kd.student import data as D
from kd.student import setup as S
from kd.student import trainer as T
from kd.student.models import build_student, pca_embeddings

ROOT = Path(__file__).resolve().parents[2]
store_path = training_runs.store_path  # module fixture (this module's own): SMALL's 140-row store


def _env() -> dict[str, str]:
    # the caller's PYTHONPATH kept: it may name the checkout whose `kd` is under test (a worktree)
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    return os.environ | {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def reference(store_path, tmp_path_factory) -> Path:
    """An uninterrupted run of SMALL."""
    return T.train(T.TrainConfig(str(store_path), str(tmp_path_factory.mktemp("ref") / "out"), **SMALL))


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and any(k.startswith("objectives.") for k in wa)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def _train_losses(path: Path) -> list[tuple[int, float]]:
    recs = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in recs if "loss" in r]


def test_reference_run_learns_and_writes_everything(reference):
    info = json.loads((reference / "config.json").read_text())
    assert info["steps"] == info["total_steps"] > 20
    losses = [x for _, x in _train_losses(reference)]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    vals = [json.loads(x)["val_loss"] for x in (reference / "metrics.jsonl").read_text().splitlines()
            if "val_loss" in x]
    assert len(vals) == 2 and vals[1] < vals[0]
    assert info["best_val_loss"] == pytest.approx(min(vals))
    for f in ("model.safetensors", "config.json", "training_args.json", "loss.png", "tokenizer/tokenizer.json"):
        assert (reference / f).exists(), f
    assert (reference / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((reference / "training_args.json").read_text())["objectives"] == SMALL["objectives"]


def test_checkpoints_every_n_steps_and_at_the_last_never_at_epoch_ends(store_path, tmp_path, monkeypatch):
    """A checkpoint is a resume point, every checkpoint_every steps and at the last step; epoch ends add none (a
    small store's epochs of a few steps made the dry run's calibration save every 2nd step, each save as long as
    the step). The run still resumes to identical weights from any of them (the tests below)."""
    saved, real = [], T.checkpoint.save

    def counting(*a, **kw):
        saved.append(a[3].step)  # the TrainState
        return real(*a, **kw)

    monkeypatch.setattr(T.checkpoint, "save", counting)
    out = T.train(T.TrainConfig(str(store_path), str(tmp_path / "out"), **SMALL | {"checkpoint_every": 7, "epochs": 3}))
    info = json.loads((out / "training_args.json").read_text())["resolved"]
    per_epoch = info["train_rows"] // SMALL["batch_size"]
    assert info["total_steps"] > 2 * per_epoch and per_epoch % 7, info  # epoch ends that are not multiples of 7
    assert saved == [*range(7, info["total_steps"], 7), info["total_steps"]]


def test_crash_then_resume_gives_identical_weights(store_path, reference, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real = D.train_batches
    seen = {"n": 0}

    def crashing(*a, **kw):
        for b in real(*a, **kw):
            seen["n"] += 1
            if seen["n"] > 23:  # epoch 1 (epoch 0 has 16 steps), three steps after the checkpoint at step 20
                raise KeyboardInterrupt
            yield b

    monkeypatch.setattr(T.D, "train_batches", crashing)
    with pytest.raises(KeyboardInterrupt):
        T.train(T.TrainConfig(str(store_path), str(out), **SMALL))
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert (ckpt["step"], ckpt["epoch"], ckpt["batch"]) == (20, 1, 4) and not (out / "config.json").exists()
    monkeypatch.setattr(T.D, "train_batches", real)
    T.train(T.TrainConfig(str(store_path), str(out), **SMALL))
    _assert_same_weights(reference, out)
    assert _train_losses(out) == _train_losses(reference)  # metrics after the checkpoint were replaced


def test_a_resume_between_two_metrics_records_logs_the_record_it_was_in(store_path, tmp_path, monkeypatch):
    """A checkpoint inside a metrics window (kd distill's stages: checkpoint every 5 steps, a record every 20): the
    resumed run's next record averaged only the steps after the checkpoint, so its loss (and loss.png) differed
    from an uninterrupted run's (a probe). The window is in the checkpoint: the records are the same."""
    opts = SMALL | {"log_every": 3}  # records at 3, 6, ..., 21: the checkpoint at step 20 holds steps 19 and 20
    reference = T.train(T.TrainConfig(str(store_path), str(tmp_path / "ref"), **opts))
    out, real, seen = tmp_path / "out", D.train_batches, {"n": 0}

    def crashing(*a, **kw):
        for b in real(*a, **kw):
            seen["n"] += 1
            if seen["n"] > 23:
                raise KeyboardInterrupt
            yield b

    monkeypatch.setattr(T.D, "train_batches", crashing)
    with pytest.raises(KeyboardInterrupt):
        T.train(T.TrainConfig(str(store_path), str(out), **opts))
    assert torch.load(out / "checkpoint.pt", weights_only=True)["window"].shape == (2, 2)  # steps 19, 20; 2 losses
    monkeypatch.setattr(T.D, "train_batches", real)
    T.train(T.TrainConfig(str(store_path), str(out), **opts))
    _assert_same_weights(reference, out)
    records = _train_losses(reference)
    assert any(s == 21 for s, _ in records) and _train_losses(out) == records
    padding = [json.loads(x).get("padding") for x in (reference / "metrics.jsonl").read_text().splitlines()]
    assert [json.loads(x).get("padding") for x in (out / "metrics.jsonl").read_text().splitlines()] == padding


def _small_cli(store_path: Path, out: Path, *extra: str) -> list[str]:
    """SMALL (the reference run) as a `kd train-student` process; `extra` flags last."""
    return [sys.executable, "-m", "kd", "train-student", "--shards", str(store_path), "--out", str(out),
            "--embed-dim", "16", "--hidden-dim", "16", "--batch-size", "8", "--epochs", "2", "--val-percent", "10",
            "--shuffle-buffer", "24", "--objective", "cosine", "--objective", "contrastive:0.1:negatives=16:dim=8",
            "--no-bucket", *extra]


def _kill_when(args: list[str], ready: Callable[[], bool], cwd: Path = ROOT) -> None:
    """Start `args` and kill -9 it once `ready()` holds (asserting it was still running then)."""
    proc = subprocess.Popen(args, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120  # a loaded machine starts slowly
    try:
        while time.time() < deadline and proc.poll() is None and not ready():
            time.sleep(0.02)
        killed = proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed, proc.stdout.read().decode()[-2000:]


def test_sigkill_then_resume_gives_identical_weights(store_path, reference, tmp_path, monkeypatch):
    """...with the store and the output spelt otherwise on the rerun (a relative path, file://, a trailing slash):
    the same files, so the same run (a probe's rerun with --shards store/ was refused as other options, and
    --out file:///abs/out wrote into ./file:/abs/out)."""
    out = tmp_path / "out"
    args = _small_cli(store_path, out, "--checkpoint-every", "1", "--no-progress")
    ckpt = out / "checkpoint.pt"
    _kill_when(args, lambda: ckpt.exists() and torch.load(ckpt, weights_only=True)["step"] >= 3)
    step = torch.load(ckpt, weights_only=True)["step"]
    assert 3 <= step < 26 and not (out / "config.json").exists()
    monkeypatch.chdir(store_path.parent)
    again = [a.replace(str(store_path), f"{store_path.name}/").replace(str(out), f"file://{out}") for a in args[3:-3]]
    res = CliRunner().invoke(app, again + ["--checkpoint-every", "5", "--no-progress"])
    assert res.exit_code == 0, res.output
    _assert_same_weights(reference, out)
    assert not (store_path.parent / "file:").exists()
    res = CliRunner().invoke(app, [*args[3:-3], "--checkpoint-every", "5", "--no-progress"])  # the first spelling
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output


def test_a_run_killed_before_its_first_checkpoint_starts_again_on_the_same_command(store_path, reference, tmp_path):
    """kill -9 during the head fit or the first steps leaves metrics and no checkpoint (kd distill's runs met it): the
    same command trains from step 0, where it asked for --overwrite (so a killed kd distill could not resume). A
    folder holding anything else beside such metrics, or a --no-resume run, is still refused."""
    out = tmp_path / "out"
    args = _small_cli(store_path, out, "--checkpoint-every", "1000", "--log-every", "1", "--no-progress")
    metrics = out / "metrics.jsonl"
    _kill_when(args, lambda: metrics.exists() and '"loss"' in metrics.read_text())
    assert metrics.is_file() and not (out / "checkpoint.pt").exists() and not (out / "config.json").exists()
    (out / "notes.txt").write_text("mine")
    res = CliRunner().invoke(app, args[3:])
    assert res.exit_code == 2 and "metrics of an unfinished run" in res.output, res.output
    (out / "notes.txt").unlink()
    res = CliRunner().invoke(app, [*args[3:], "--no-resume"])
    assert res.exit_code == 2 and "metrics of an unfinished run" in res.output, res.output
    dead = metrics.read_bytes()
    res = CliRunner().invoke(app, [*args[3:], "--lr", "0.003"])  # another command would delete what it did not write
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "started with other options (lr:" in said and "0.003 here" in said, res.output
    res = CliRunner().invoke(app, [*args[3:], "--workers", "2"])  # two readers deal the rows otherwise
    assert res.exit_code == 2 and "num_workers: 0 there, 2 here" in " ".join(res.output.split()), res.output
    record = out / ".kd-started.json"
    kept = record.read_bytes()
    for other in ("", "{}", '{"lr": 0.003}'):  # none of them tells which command started the run
        record.write_text(other)
        res = CliRunner().invoke(app, args[3:])
        assert res.exit_code == 2 and "is not the record kd train-student writes" in res.output, (other, res.output)
    record.unlink()
    record.mkdir()
    res = CliRunner().invoke(app, args[3:])
    assert res.exit_code == 2 and "is not the record" in res.output, res.output
    assert metrics.read_bytes() == dead
    record.rmdir()
    record.write_bytes(kept)
    res = CliRunner().invoke(app, args[3:])
    assert res.exit_code == 0, res.output
    _assert_same_weights(reference, out)
    assert _train_losses(out) == _train_losses(reference)  # the dead run's metrics are gone, not mixed in
    assert not (out / ".kd-started.json").exists()  # a finished student holds only what it always held


def test_a_rerun_from_another_folder_compares_the_files_its_paths_name(store_path, tmp_path, monkeypatch):
    """A run records its paths as the files they name: `--shards store` typed in two folders is two stores (a probe:
    recorded as typed, the rerun from the other folder deleted the dead run's metrics and trained on its store),
    while the same store spelt absolute from a third folder is the same command."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    (here / "store").symlink_to(store_path)
    shutil.copytree(store_path, there / "store")
    out = tmp_path / "out"
    args = _small_cli(Path("store"), Path("../out"), "--checkpoint-every", "1000", "--log-every", "1", "--no-progress")
    metrics = out / "metrics.jsonl"
    _kill_when(args, lambda: metrics.exists() and '"loss"' in metrics.read_text(), cwd=here)
    assert json.loads((out / ".kd-started.json").read_text())["store"] == str(store_path.resolve())
    dead = metrics.read_bytes()
    monkeypatch.chdir(there)
    res = CliRunner().invoke(app, args[3:])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"started with other options (store: '{store_path.resolve()}' there" in said, said
    record = out / ".kd-started.json"
    kept = record.read_text()
    record.write_text(kept.replace(f'"{store_path.resolve()}"', '"store"').replace(f'"{out}"', '"../out"'))
    for folder in (there, here):  # a record of kd before 2026-11-30, its paths as typed: which store is unknown
        monkeypatch.chdir(folder)
        res = CliRunner().invoke(app, args[3:])
        said = " ".join(res.output.split())
        unknown = "(store: 'store (relative to a folder the record does not name)' there"
        assert res.exit_code == 2 and unknown in said, said
    record.write_text(kept)
    assert metrics.read_bytes() == dead
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, _small_cli(store_path, Path("out"), "--checkpoint-every", "1000", "--log-every",
                                             "1", "--no-progress")[3:])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "training_args.json").read_text())["store"] == str(store_path.resolve())
    monkeypatch.chdir(there)  # finished: the other folder's `store` is another store, so another student
    res = CliRunner().invoke(app, args[3:])
    assert res.exit_code == 2 and "finished student trained with other options (store:" in res.output, res.output


def test_a_run_killed_before_its_first_checkpoint_is_not_restarted_on_other_data(store_path, tmp_path):
    """The record of a run killed before its first checkpoint held its options only: a store rebuilt at the same
    path, or other ids in the same --exclude-ids file, restarted it as the same command (a probe: the dead run's
    metrics deleted, the new data trained on, exit 0), where a checkpoint's resume is refused. Both refused now."""
    store = shutil.copytree(store_path, tmp_path / "store")
    first = Store.open(str(store)).table("texts").shards[0].file
    ids = sorted(pq.read_table(store / first, columns=["id"])["id"].to_pylist())
    excluded = tmp_path / "ids.txt"
    excluded.write_text(f"{ids[0]}\n{ids[3]}\n")
    out = tmp_path / "out"
    args = _small_cli(store, out, "--exclude-ids", str(excluded), "--checkpoint-every", "1000", "--log-every", "1",
                      "--no-progress")
    metrics = out / "metrics.jsonl"
    _kill_when(args, lambda: metrics.exists() and '"loss"' in metrics.read_text())
    dead = metrics.read_bytes()
    excluded.write_text(f"{ids[0]}\n{ids[4]}\n")
    res = CliRunner().invoke(app, args[3:])
    assert res.exit_code == 2 and "unfinished run on other data" in res.output, res.output
    excluded.write_text(f"{ids[3]}\n{ids[0]}\n")  # the same rows, written otherwise
    shutil.rmtree(store)
    make_store(store, rows=120, shards=2, tmp=tmp_path / "tmp")  # another store at the same path
    res = CliRunner().invoke(app, args[3:])
    assert res.exit_code == 2 and "unfinished run on other data" in res.output, res.output
    assert metrics.read_bytes() == dead
    shutil.rmtree(store)
    shutil.copytree(store_path, store)
    res = CliRunner().invoke(app, args[3:])
    assert res.exit_code == 0 and metrics.read_bytes() != dead, res.output
    shutil.rmtree(store)  # finished: a store rebuilt at its path said "nothing to do" (a probe)
    make_store(store, rows=120, shards=2, tmp=tmp_path / "tmp2")
    res = CliRunner().invoke(app, args[3:])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "the store at --shards: rebuilt or changed since the student was trained" in said
    shutil.rmtree(store)
    shutil.copytree(store_path, store)
    res = CliRunner().invoke(app, args[3:])
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output


def test_a_killed_runs_lock_does_not_live_on_in_its_data_workers(store_path, tmp_path):
    """kill -9 of a run reading with DataLoader workers: its lock is free at once, not when the orphaned workers
    notice their parent is gone (~5 s, in which a probe's rerun was refused as 'another kd train-student')."""
    from kd.common.locks import try_lock
    from kd.common.outputs import TRAIN_LOCK

    out = tmp_path / "out"
    args = _small_cli(store_path, out, "--workers", "1", "--log-every", "1", "--no-progress")
    metrics = out / "metrics.jsonl"
    _kill_when(args, lambda: metrics.exists() and '"loss"' in metrics.read_text())
    lock = try_lock(out / TRAIN_LOCK)
    assert lock is not None, "a data worker of the killed run still holds its lock"
    lock.close()


def test_sigterm_saves_a_checkpoint_at_the_step_and_resumes_identically(store_path, reference, tmp_path):
    # --checkpoint-every 1000: no periodic save in the run, so the checkpoint is the stop's own
    out = tmp_path / "out"
    args = _small_cli(store_path, out, "--log-every", "1", "--checkpoint-every", "1000", "--no-progress")
    proc = subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 40
    try:
        while time.time() < deadline and proc.poll() is None and _logged_steps(out) < 3:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, output[-2000:]
    step = torch.load(out / "checkpoint.pt", weights_only=True)["step"]
    said = re.search(rf"stopped by SIGTERM after step {step} of (\d+): checkpoint saved", " ".join(output.split()))
    assert said and 3 <= step < int(said[1]), output[-2000:]
    assert f"resume: {shlex.join(['kd', *args[3:]])}" in " ".join(output.split()), output[-2000:]  # issue 49
    assert _logged_steps(out) == step and not (out / "config.json").exists()  # nothing ran past the save
    res = CliRunner().invoke(app, args[3:-1])
    assert res.exit_code == 0, res.output
    _assert_same_weights(reference, out)


def _logged_steps(out: Path) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [json.loads(x)["step"] for x in lines if x.endswith("}") and '"loss"' in x]
    return max(steps, default=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Run by each DDP rank. Before anything of kd is imported, importing transformers' model code (PreTrainedModel
# lives in transformers.modeling_utils, every architecture in transformers.models.<name>.modeling_*) or
# `pipeline` raises, so PreTrainedModel.from_pretrained and every AutoModel* cannot load anything.
NO_TEACHER = r"""
import importlib.abc, os, re, sys

FORBIDDEN = re.compile(
    r"^(pipeline(\.|$)|transformers\.modeling_utils$|transformers\.models\.(?!auto\.)[^.]+\.modeling_)")

class Forbid(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if FORBIDDEN.match(name):
            raise ImportError(f"teacher model code imported: {name}")

sys.meta_path.insert(0, Forbid())
from kd.student.trainer import TrainConfig, train
train(TrainConfig(sys.argv[1], sys.argv[2], embed_dim=8, hidden_dim=8, epochs=2, batch_size=8, val_percent=10,
                  shuffle_buffer=16, log_every=1, progress=False, device="cpu"))
if os.environ.get("RANK", "0") == "0":
    from kd import student
    assert student.load(sys.argv[2]).encode(["the cat runs"]).shape == (1, 32)
    bert = os.path.join(sys.argv[2], "bert-config")  # a config AutoModel resolves to BertModel
    os.makedirs(bert)
    open(os.path.join(bert, "config.json"), "w").write('{"model_type": "bert"}')
    for name in ("PreTrainedModel", "BertModel", "AutoModel"):  # the guard works
        try:
            cls = getattr(__import__("transformers"), name)
            cls.from_pretrained(bert)
            raise SystemExit(f"{name} was usable")
        except ImportError as e:
            assert "teacher model code imported" in str(e), e
print("NO TEACHER OK")
"""


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """A store from the real precompute (its meta points at the teacher), trained by two gloo ranks."""
    from conftest import WORDS, build_tiny_bert

    from kd.pipeline.precompute import precompute

    root = tmp_path_factory.mktemp("ddp")
    teacher = build_tiny_bert(root / "teacher")
    rng = np.random.default_rng(0)
    (root / "in.txt").write_text("\n".join(" ".join(rng.choice(WORDS, 8)) for _ in range(120)))
    precompute([str(root / "in.txt")], str(root / "store"), [f"tiny={teacher}"], shard_rows=60, progress=False)
    shutil.rmtree(teacher)  # whatever the store's meta points at is gone
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", NO_TEACHER, str(root / "store"), str(root / "out")], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=_env() | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
                                            "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    logs = [p.communicate(timeout=90)[0] for p in procs]
    return root, [p.returncode for p in procs], logs


def test_training_never_loads_the_teacher(ddp_run):
    root, codes, logs = ddp_run
    assert codes == [0, 0], "\n".join(x[-3000:] for x in logs)
    assert all("NO TEACHER OK" in x for x in logs)
    info = json.loads((root / "out" / "config.json").read_text())
    assert info["target"] == ["tiny.mean"]  # the store's default_target without sentence-transformers pooling


def test_ddp_world_size_two_on_cpu(ddp_run):
    """Two real processes (gloo): each rank reads half of the shards, both take equal step counts."""
    root, codes, logs = ddp_run
    assert codes == [0, 0], "\n".join(x[-3000:] for x in logs)
    store = Store.open(root / "store")
    assert store.manifest.num_shards == 2
    info = json.loads((root / "out" / "config.json").read_text())
    data = D.DataConfig(str(root / "store"), ["tiny.mean"], "tiny", batch_size=8, val_percent=10, shuffle_buffer=16)
    two, one = D.build_plan(store, data, world=2), D.build_plan(store, data, world=1)
    assert info["world_size"] == 2 and info["steps"] == two.steps(0) + two.steps(1)
    assert two.steps(0) <= 8 < one.steps(0)  # a rank sees one shard of 60 rows (minus held-out), not both
    train = [json.loads(x) for x in (root / "out" / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert [r["step"] for r in train] == list(range(1, info["steps"] + 1))
    assert train[0]["rows"] == 16  # rows count both ranks' batches
    vals = [json.loads(x)["val_loss"] for x in (root / "out" / "metrics.jsonl").read_text().splitlines()
            if "val_loss" in x]
    assert len(vals) == 2 and vals[1] < vals[0]


def test_cli_defaults_on_a_tiny_store(store_path, tmp_path, monkeypatch):
    """Defaults: bilstm, cosine to the default target, embeddings from the teacher; layers never read."""
    read: set[str] = set()
    orig = pq.ParquetFile.iter_batches

    def spy(self, *a, columns=None, **kw):
        read.update(columns or ["<all>"])
        return orig(self, *a, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    out = tmp_path / "cli"
    res = CliRunner().invoke(app, ["train-student", "--shards", str(store_path), "--out", str(out), "--max-steps", "3",
                                   "--batch-size", "8", "--hidden-dim", "16", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "student ready in" in res.output
    assert read == {"id", "text", "sentence"}
    info = json.loads((out / "config.json").read_text())
    assert info["student"]["arch"] == "bilstm" and info["objectives"] == ["cosine:1"]
    assert info["target"] == [f"{TEACHER}.sentence"] and info["student"]["out_dim"] == 16
    assert info["student"]["embed_dim"] == 16 and info["steps"] == 3
    assert info["store_fingerprint"] == Store.open(store_path).manifest.fingerprint
    teacher = load_np(str(store_path / "teachers" / TEACHER / "input_embeddings.safetensors"))["weight"]
    emb = _weights(out)["student.embed.weight"].numpy()
    rows = np.arange(len(teacher)) != 0  # the pad row is zeroed
    assert np.abs(emb[rows] - teacher[rows]).max() < 0.01  # 3 small AdamW steps away from the teacher's table


def test_pca_initialisation_to_a_narrower_student(store_path, tmp_path):
    cfg = T.TrainConfig(str(store_path), str(tmp_path / "x"), embed_dim=6, hidden_dim=8)
    s = T.setup(cfg)
    student = build_student(s.student_cfg)
    matrix = S.input_embeddings(s.store, TEACHER)
    S.init_embeddings(student, matrix, 0)
    expect = pca_embeddings(matrix, 6)
    got = student.embed.weight.detach().numpy()
    np.testing.assert_allclose(got[1:], expect[1:], rtol=1e-5, atol=1e-6)
    assert s.student_cfg.embed_dim == 6 and s.student_cfg.vocab_size == matrix.shape[0]


def test_early_stopping_stops_when_validation_stalls(store_path, tmp_path):
    out = T.train(T.TrainConfig(str(store_path), str(tmp_path / "es"), embed_dim=8, hidden_dim=8, lr=0.0,
                                eval_every=1, patience=2, epochs=5, batch_size=8, val_percent=10, progress=False))
    info = json.loads((out / "config.json").read_text())
    assert info["stopped_early"] and info["steps"] == 3 and info["best_step"] == 1


def test_plateau_schedule_halves_the_rate_when_validation_stalls(store_path, tmp_path):
    out = T.train(T.TrainConfig(str(store_path), str(tmp_path / "pl"), embed_dim=8, hidden_dim=8, lr=1e-6,
                                schedule="plateau", warmup=2, eval_every=1, patience=0, max_steps=8, batch_size=8,
                                val_percent=10, log_every=1, progress=False))
    lrs = [json.loads(x)["lr"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"lr"' in x]
    assert lrs[2] == pytest.approx(1e-6) and lrs[-1] <= 0.25e-6 * 1.001  # halved at least twice


def test_pair_store_trains_both_sides(tmp_path):
    path = make_store(tmp_path / "pairs", rows=60, shards=1, pairs=True, tmp=tmp_path)
    out = T.train(T.TrainConfig(str(path), str(tmp_path / "p"), embed_dim=8, hidden_dim=8, max_steps=4,
                                batch_size=8, objectives=["cosine", "mse:0.5"], progress=False))
    info = json.loads((out / "config.json").read_text())
    assert info["target"] == [f"{TEACHER}.sentence_a", f"{TEACHER}.sentence_b"] and info["steps"] == 4


def test_cli_errors_are_clear(store_path, tmp_path):
    res = train_cli("--shards", str(store_path), "--out", str(tmp_path / "a"), "--target", f"{TEACHER}.logits")
    assert res.exit_code == 2 and "tiny.logits" in res.output and "tiny.sentence" in res.output
    res = train_cli("--shards", str(store_path), "--out", str(tmp_path / "b"), "--objective", "pair")
    assert res.exit_code == 2 and "pair store" in res.output
    res = train_cli("--shards", str(store_path), "--out", str(tmp_path / "c"), "--objective", "nonsense")
    assert res.exit_code == 2 and "unknown objective" in res.output
    res = train_cli("--shards", str(tmp_path / "nowhere"), "--out", str(tmp_path / "d"))
    assert res.exit_code == 2 and "no kd store" in res.output


def test_cli_errors_on_damaged_stores(tmp_path):
    path = make_store(tmp_path / "s", rows=40, shards=2, tmp=tmp_path)
    shard = path / "teachers" / TEACHER / "part-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:100])
    res = train_cli("--shards", str(path), "--out", str(tmp_path / "a"))
    assert res.exit_code == 2 and "part-00001.parquet" in res.output
    for f in [path / "manifest.json", *(path / "manifests").iterdir()]:
        f.write_text(f.read_text().replace('"format_version": 1', '"format_version": 99'))
    res = train_cli("--shards", str(path), "--out", str(tmp_path / "b"))
    assert res.exit_code == 2 and "format version 99" in res.output


def test_resume_refuses_other_options(store_path, tmp_path, monkeypatch):
    killed_run(store_path, tmp_path / "out", monkeypatch)
    res = train_cli("--shards", str(store_path), "--out", str(tmp_path / "out"), "--lr", "0.5")
    assert res.exit_code == 2 and "lr" in res.output and "--overwrite" in res.output


def test_an_exclude_ids_file_edited_since_the_run_is_refused(store_path, tmp_path, monkeypatch):
    """Editing the --exclude-ids file between a kill and the resume trained the rest of the run on another row set
    (the checkpoint compared the file's path, not its ids: exit 0), and a finished student said "nothing to do" to
    other ids. Both are refused now, naming the file's rows; the same ids, however written, resume and finish."""
    store = Store.open(str(store_path))
    ids = sorted(pq.read_table(store.loc.path(store.table("texts").shards[0].file), columns=["id"])["id"].to_pylist())
    f, out = tmp_path / "ids.txt", tmp_path / "out"
    f.write_text(f"{ids[0]}\n{ids[5]}\n")
    killed_run(store_path, out, monkeypatch, exclude_ids=str(f))
    f.write_text(f"{ids[0]}\n{ids[7]}\n")
    checkpoint_before = (out / "checkpoint.pt").read_bytes()
    with pytest.raises(KdError, match="leaving out other rows") as e:
        T.train(T.TrainConfig(str(store_path), str(out), **SMALL, exclude_ids=str(f)))
    assert e.value.where == str(out / "checkpoint.pt") and (out / "checkpoint.pt").read_bytes() == checkpoint_before
    f.write_text(f"# the same rows\n{ids[5]}\n{ids[0]}\n{ids[5]}\n")
    T.train(T.TrainConfig(str(store_path), str(out), **SMALL, exclude_ids=str(f)))
    resolved = json.loads((out / "training_args.json").read_text())["resolved"]
    assert resolved["excluded_rows"] == 2
    assert resolved["reads"]["left_out"] == checkpoint.rows_left_out((ids[0], ids[5]))
    f.write_text(f"{ids[0]}\n")
    with pytest.raises(KdError, match="finished student trained with other options .*exclude_ids: the file names "
                                      "other rows"):
        T.train(T.TrainConfig(str(store_path), str(out), **SMALL, exclude_ids=str(f)))
    f.write_text(f"{ids[0]}\n{ids[5]}\n")
    assert T._finished_by_the_same_command(T.TrainConfig(str(store_path), str(out), **SMALL, exclude_ids=str(f)))


def test_a_finished_student_folder_holds_no_pickle(reference):
    assert not (reference / "checkpoint.pt").exists()
    assert not [p for p in reference.rglob("*") if p.suffix in (".pt", ".pkl", ".bin", ".pickle")]


def test_training_says_what_it_does_before_its_first_step(store_path, tmp_path, capfd):
    """The store's check, the start weights and the head's fit took 5-15 s before the bar's first line, silent
    (issue 49's walk of `kd demo`: 11.5 s): a line says so before them, and when they are done."""
    from kd.student.train_config import TrainConfig

    T.train(TrainConfig(str(store_path), str(tmp_path / "s"), **(SMALL | {"progress": True, "max_steps": 2})))
    err = capfd.readouterr().err
    assert err.index("preparing the training") < err.index("preparing the training (the store, the student's start, "
                                                           "its head): done") < err.index("train:"), err


def test_a_checkpoint_saved_before_an_option_existed_resumes_at_its_default(tmp_path):
    """A kd that adds a training option still resumes a checkpoint an older kd saved without it (that run trained as
    the default does); another value is refused, naming it. Every default is compared as a saved config holds it."""
    from kd.common.options import saved_defaults
    from kd.student.train_config import TrainConfig

    config, defaults = TrainConfig("s", "o").to_json(), saved_defaults(TrainConfig)
    # (enums by value, as to_json saves them; a None default is resolved per arch, so a config lacking such an
    # option is refused as before: None is not what that run trained with)
    assert {k: v for k, v in defaults.items() if v is not None}.items() <= config.items()
    path = tmp_path / "checkpoint.pt"
    torch.save({"config": {k: v for k, v in config.items() if k not in ("seed", "head_init")}, "world": 1,
                "store": "a-store", "model": {}, "rng": []}, path)
    reads = checkpoint.Reads("a-store", checkpoint.rows_left_out((3, 1)))  # (no left_out recorded: not compared)
    assert checkpoint.load(path, config, TrainConfig.RESUMABLE, 1, reads, defaults)["world"] == 1
    with pytest.raises(KdError, match="seed: 0 -> 5"):
        checkpoint.load(path, config | {"seed": 5}, TrainConfig.RESUMABLE, 1, reads, defaults)
    with pytest.raises(KdError, match="seed: None -> 0"):  # (what it said before, for every option added)
        checkpoint.load(path, config, TrainConfig.RESUMABLE, 1, reads)
