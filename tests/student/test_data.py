"""student.data: column projection, id alignment, held-out split, shuffling, resume positions, DDP shares."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import TEACHER, make_store

from kd.common.errors import InputError, StoreError
from kd.storage.schema import arrow_to_vectors
from kd.storage.store import Store
from kd.student import data as D


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return make_store(root / "store", rows=300, shards=3, tmp=root)


def cfg(path, **kw) -> D.DataConfig:
    base = dict(columns=[f"{TEACHER}.sentence"], tokenizer=TEACHER, batch_size=16, shuffle_buffer=40,
                val_percent=10.0, chunk_rows=32)
    return D.DataConfig(str(path), **(base | kw))


def epoch_ids(store, plan, epoch=0, start=0, rank=0) -> list[np.ndarray]:
    return [b["id"].numpy() for b in D.train_batches(store, plan, epoch, start, rank)]


def all_ids(store) -> np.ndarray:
    return store.read_table("texts", ["id"]).column("id").to_numpy()


def test_cosine_run_reads_only_its_columns(store_path, monkeypatch):
    """A cosine run never reads `layers` (nor cls/mean): every Parquet read names its columns."""
    reads: list[tuple[str, tuple]] = []
    orig_iter, orig_read = pq.ParquetFile.iter_batches, pq.ParquetFile.read

    def iter_batches(self, *a, columns=None, **kw):
        reads.append((self.schema_arrow.names[-1], tuple(columns) if columns is not None else None))
        return orig_iter(self, *a, columns=columns, **kw)

    def read(self, *a, columns=None, **kw):
        reads.append((self.schema_arrow.names[-1], tuple(columns) if columns is not None else None))
        return orig_read(self, *a, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    monkeypatch.setattr(pq.ParquetFile, "read", read)
    store = Store.open(store_path)
    plan = D.build_plan(store, cfg(store_path))
    batches = list(D.train_batches(store, plan, 0, 0)) + D.validation_batches(store, plan)
    assert batches and all(set(b) == {"id", "input_ids", "attention_mask", f"{TEACHER}.sentence"} for b in batches)
    read_cols = {c for _, cols in reads for c in cols}
    assert None not in {cols for _, cols in reads}
    assert read_cols == {"id", "text", "sentence"}
    # positive control: the contrastive objective's column is read when asked for
    reads.clear()
    plan = D.build_plan(store, cfg(store_path, columns=[f"{TEACHER}.layers"]))
    next(iter(D.train_batches(store, plan, 0, 0)))
    read_cols = {c for _, cols in reads for c in cols}
    assert "layers" in read_cols and "sentence" not in read_cols


def test_batches_carry_targets_of_the_right_rows(store_path):
    store = Store.open(store_path)
    plan = D.build_plan(store, cfg(store_path, columns=[f"{TEACHER}.sentence", f"{TEACHER}.layers"]))
    b = next(iter(D.train_batches(store, plan, 0, 0)))
    table = store.read_table(f"teachers/{TEACHER}", ["id", "sentence"])
    row_of = {int(i): r for r, i in enumerate(table.column("id").to_numpy())}
    vectors = arrow_to_vectors(table.column("sentence"))
    expect = vectors[[row_of[i] for i in b["id"].tolist()]]
    np.testing.assert_array_equal(b[f"{TEACHER}.sentence"].numpy(), expect)
    assert b[f"{TEACHER}.layers"].shape == (16, 3, 16) and b[f"{TEACHER}.layers"].dtype == torch.float32
    assert b["input_ids"].shape == b["attention_mask"].shape and b["input_ids"].dtype == torch.int64


def test_held_out_split_is_deterministic_disjoint_and_sized():
    ids = np.random.default_rng(1).integers(-(2**62), 2**62, size=200_000, dtype=np.int64)
    m = D.is_validation(ids, 2.0)
    assert 0.018 < m.mean() < 0.022
    np.testing.assert_array_equal(m, D.is_validation(ids.copy(), 2.0))
    assert D.is_validation(ids, 0.0).sum() == 0 and D.is_validation(ids, 100.0).all()
    seq = np.arange(100_000, dtype=np.int64)  # clustered ids spread evenly too
    assert 0.018 < D.is_validation(seq, 2.0).mean() < 0.022


def test_train_and_validation_rows_partition_the_store(store_path):
    store = Store.open(store_path)
    ids = all_ids(store)
    for workers in (0, 2):
        plan = D.build_plan(store, cfg(store_path, num_workers=workers, max_val_rows=10_000))
        train = np.concatenate(epoch_ids(store, plan))
        val = np.concatenate([b["id"].numpy() for b in D.validation_batches(store, plan)])
        assert len(train) == len(set(train)) == plan.train_rows()  # each training row exactly once per epoch
        assert not set(train) & set(val)
        assert set(train) | set(val) == set(ids)
        np.testing.assert_array_equal(np.sort(val), np.sort(ids[D.is_validation(ids, 10.0)]))
        assert 15 < len(val) < 45


def test_order_is_deterministic_shuffled_per_epoch_and_bounded(store_path):
    store = Store.open(store_path)
    plan = D.build_plan(store, cfg(store_path))
    e0, e0b, e1 = (np.concatenate(epoch_ids(store, plan, e)) for e in (0, 0, 1))
    np.testing.assert_array_equal(e0, e0b)
    assert set(e0) == set(e1) and not np.array_equal(e0, e1)
    # the shuffle buffer bounds mixing: the first batch comes from the first buffer + chunk rows read
    units = plan.units(0, 0, 0)
    k = units[0][0]
    first_ids = store.read_shard("texts", k, ["id"]).column("id").to_numpy()[: 40 + 32]
    assert set(e0[:16]) <= set(first_ids)
    # and it does mix: rows are not in file order
    stored = np.concatenate([store.read_shard("texts", u, ["id"]).column("id").to_numpy() for u, _ in units])
    stored = stored[~D.is_validation(stored, 10.0)]
    assert not np.array_equal(e0, stored)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_position_continues_the_same_sequence(store_path, workers):
    store = Store.open(store_path)
    plan = D.build_plan(store, cfg(store_path, num_workers=workers))
    full = epoch_ids(store, plan, 1)
    for start in (0, 3, 7, len(full)):
        tail = epoch_ids(store, plan, 1, start)
        assert len(tail) == len(full) - start
        for a, b in zip(full[start:], tail):
            np.testing.assert_array_equal(a, b)
    assert len(full) == plan.steps(1) == sum(plan.reader_batches(1, 0))


def test_canonical_order_is_round_robin():
    assert D.canonical_order([3, 1, 2]) == [0, 1, 2, 0, 2, 0]
    assert D.canonical_order([0, 2]) == [1, 1]


def test_ddp_ranks_read_disjoint_rows_with_equal_steps(store_path):
    store = Store.open(store_path)
    plan = D.build_plan(store, cfg(store_path), world=2)
    for epoch in (0, 1):
        r0, r1 = (np.concatenate(epoch_ids(store, plan, epoch, 0, r)) for r in (0, 1))
        steps = plan.steps(epoch)
        assert len(epoch_ids(store, plan, epoch, 0, 0)) == len(epoch_ids(store, plan, epoch, 0, 1)) == steps
        assert not set(r0) & set(r1)
    # 3 shards over 2 ranks: more readers than shards gives stripes so that everyone has work
    plan4 = D.build_plan(store, cfg(store_path, num_workers=2), world=2)
    assert plan4.stripes == 2
    shares = [np.concatenate(epoch_ids(store, plan4, 0, 0, r)) for r in (0, 1)]
    assert len(shares[0]) > 30 and len(shares[1]) > 30 and not set(shares[0]) & set(shares[1])


def test_id_mismatch_names_the_shard(tmp_path):
    path = make_store(tmp_path / "s", rows=60, shards=2, tmp=tmp_path)
    store = Store.open(path)
    bad = store.read_shard(f"teachers/{TEACHER}", 1)
    ids = bad.column("id").to_numpy().copy()
    ids[[3, 4]] = ids[[4, 3]]
    f = path / "teachers" / TEACHER / "part-00001.parquet"
    pq.write_table(bad.set_column(0, "id", pa.array(ids)), f)
    # rewritten behind the manifest's back: the checksum check names the file, before training (the plan
    # reads the target columns once to refuse NaN/Inf, verified)
    with pytest.raises(StoreError, match="does not match its checksum") as e:
        D.build_plan(store, cfg(path, val_percent=0.0))
    assert "teachers/tiny/part-00001.parquet" in str(e.value)
    # committed with a matching checksum (a buggy writer): only the id check can notice
    import hashlib

    from kd.storage.manifest import ShardRecord

    data = f.read_bytes()
    rec = store.manifest.tables[f"teachers/{TEACHER}"].shards[1]
    store.manifest.tables[f"teachers/{TEACHER}"].shards[1] = ShardRecord(rec.file, rec.rows, len(data),
                                                                         hashlib.sha256(data).hexdigest())
    plan = D.build_plan(store, cfg(path, val_percent=0.0))
    with pytest.raises(StoreError) as e:
        list(D.train_batches(store, plan, 0, 0))
    assert "shard 1" in str(e.value) and "other ids" in str(e.value)
    assert "teachers/tiny/part-00001.parquet" in str(e.value)


def test_truncated_shard_is_named_not_skipped(tmp_path):
    path = make_store(tmp_path / "s", rows=60, shards=2, tmp=tmp_path)
    f = path / "teachers" / TEACHER / "part-00001.parquet"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    store = Store.open(path)
    with pytest.raises(StoreError) as e:
        D.build_plan(store, cfg(path))
    assert "part-00001.parquet" in str(e.value) and "shard 1" in str(e.value)


def test_unknown_column_lists_the_available_ones(store_path):
    store = Store.open(store_path)
    with pytest.raises(InputError) as e:
        D.build_plan(store, cfg(store_path, columns=[f"{TEACHER}.logits"]))
    assert "tiny.sentence" in str(e.value) and "tiny.layers" in str(e.value)
    with pytest.raises(InputError, match="label"):
        D.build_plan(store, cfg(store_path, columns=["label"]))


def test_pair_store_batches(tmp_path):
    path = make_store(tmp_path / "p", rows=60, shards=1, pairs=True, labels=True, tmp=tmp_path)
    store = Store.open(path)
    plan = D.build_plan(store, cfg(path, columns=[f"{TEACHER}.sentence_a", f"{TEACHER}.sentence_b", "label"]))
    b = next(iter(D.train_batches(store, plan, 0, 0)))
    assert {"a.input_ids", "a.attention_mask", "b.input_ids", "b.attention_mask", "label"} <= set(b)
    assert b["label"].dtype == torch.int64 and b[f"{TEACHER}.sentence_b"].shape == (16, 16)
    assert Counter(len(x) for x in epoch_ids(store, plan))[16] >= 2
