"""Feeding a GPU (issue 39 item 4), with CUDA mocked: this machine has none. On a GPU the loader reads and tokenizes
ahead of the step in worker processes and hands over page-locked batches; on a CPU nothing changes."""

from __future__ import annotations

import numpy as np
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import TEACHER, make_store

from kd.storage.store import Store
from kd.student import data as D
from kd.student import train_config as TC
from kd.student.train_config import TrainConfig


def _cfg(**kw) -> TrainConfig:
    return TrainConfig("store", "out", objectives=["cosine"], **kw)


def test_workers_default_to_prefetching_on_a_gpu_only(monkeypatch):
    assert _cfg().num_workers == 0  # this machine: a CPU, whose cores the step needs
    monkeypatch.setattr(TC, "device_kind", lambda device: "cuda")
    assert _cfg().num_workers == TC.GPU_WORKERS > 0
    assert _cfg(num_workers=0).num_workers == 0 and _cfg(num_workers=2).num_workers == 2  # given: kept
    assert _cfg().to_json()["num_workers"] == TC.GPU_WORKERS  # the record shows the count used


def test_pinned_batches_are_the_same_batches(tmp_path, monkeypatch):
    """`pin` reaches the DataLoader (pinning itself needs CUDA, so the recorder drops it) and changes no row."""
    path = make_store(tmp_path / "store", rows=120, shards=2, tmp=tmp_path)
    store = Store.open(path)
    plan = D.build_plan(store, D.DataConfig(str(path), columns=[f"{TEACHER}.sentence"], tokenizer=TEACHER,
                                            batch_size=16, shuffle_buffer=40, val_percent=10.0, num_workers=2))
    asked: list[bool] = []
    real = D.DataLoader

    def recorder(*args, pin_memory=False, **kw):
        asked.append(pin_memory)
        return real(*args, **kw)

    monkeypatch.setattr(D, "DataLoader", recorder)
    plain = [b["id"].numpy() for b in D.train_batches(store, plan, 0, 0)]
    pinned = [b["id"].numpy() for b in D.train_batches(store, plan, 0, 0, pin=True)]
    assert asked == [False, True] and len(plain) == plan.steps(0) > 1
    for a, b in zip(plain, pinned, strict=True):
        np.testing.assert_array_equal(a, b)

