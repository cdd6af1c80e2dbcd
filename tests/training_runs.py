"""The small training run of the trainer tests, and what the tests around it share: its options (SMALL), the
train-student command, a run killed partway, and module fixtures of a store and a student trained on it.

A test module takes a fixture by assigning it to a name of its own (`store_path = training_runs.store_path`; an
import would be a name each test's argument redefines, ruff's F811), and builds its own (module scope)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import Result
from student_stores import make_store
from typer.testing import CliRunner

from kd.cli import app
from kd.student import data as D
from kd.student import trainer as T

# Tiny and fast: 2 shards, ~13 steps per epoch; dropout and a memory-bank objective so RNG state matters.
SMALL = dict(arch="bilstm", embed_dim=16, hidden_dim=16, batch_size=8, epochs=2, val_percent=10.0,
             shuffle_buffer=24, objectives=["cosine", "contrastive:0.1:negatives=16:dim=8"], dropout=0.1,
             checkpoint_every=5, log_every=1, progress=False, bucket=False)
# (bucket=False: with 24-row buffers, length buckets make two tiny epochs' validation losses a coin flip;
# bucketing has its own tests in test_bucketing.py)


def train_cli(*args: str) -> Result:
    """`kd train-student ARGS` in-process, 1 step at most."""
    return CliRunner().invoke(app, ["train-student", *args, "--max-steps", "1", "--no-progress"])


def killed_run(store_path: Path, out: Path, monkeypatch: pytest.MonkeyPatch, after: int = 7, **options: object
               ) -> None:
    """A run of SMALL | `options` stopped after `after` steps, with a checkpoint (checkpoint_every=5) and no student
    yet."""
    real = D.train_batches

    def crashing(*a, **kw):
        for i, b in enumerate(real(*a, **kw)):
            if i >= after:
                raise KeyboardInterrupt
            yield b

    monkeypatch.setattr(T.D, "train_batches", crashing)
    with pytest.raises(KeyboardInterrupt):
        T.train(T.TrainConfig(str(store_path), str(out), **SMALL | options))
    monkeypatch.setattr(T.D, "train_batches", real)
    assert (out / "checkpoint.pt").exists() and not (out / "config.json").exists()


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 140-row synthetic store in 2 shards."""
    root = tmp_path_factory.mktemp("store")
    return make_store(root / "store", rows=140, shards=2, tmp=root)


@pytest.fixture(scope="module")
def trained(store_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bilstm trained 3 steps of SMALL on `store_path`."""
    out = tmp_path_factory.mktemp("trained") / "student"
    return T.train(T.TrainConfig(str(store_path), str(out), **(SMALL | {"epochs": 1, "max_steps": 3})))


@pytest.fixture(scope="module")
def exported(store_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bigru student as a sentence-transformers folder: no built-in module is a GRU, so kd's KdTokenEncoder comes
    first (a bilstm exports to built-ins alone, tests/student/test_st_builtin_export.py)."""
    pytest.importorskip("sentence_transformers")
    from kd.student.exporters.st_directory import export_sentence_transformers

    root = tmp_path_factory.mktemp("st")
    config = SMALL | {"arch": "bigru", "epochs": 1, "max_steps": 2}
    return export_sentence_transformers(T.train(T.TrainConfig(str(store_path), str(root / "bigru"), **config)),
                                        root / "export")
