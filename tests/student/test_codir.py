"""CoDIR as the paper describes it: a memory bank with one slot per row (keyed by row position, not by
the 64-bit content-hash id), kept equal on every DDP rank, label-aware negatives, no pair partner as
a negative."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from objective_batches import B, hash_ids, make_batch, manifest, run, student_cfg
from safetensors.torch import load_file, save_file
from single_thread import one_thread  # noqa: F401  (autouse: this module runs on one thread)
from student_stores import TEACHER, make_store

from kd.storage.store import Store
from kd.student import data as D
from kd.student.distributed import Dist, wrap
from kd.student.models import build_student
from kd.student.objectives import Contrastive, build_objectives, info_nce
from kd.student.trainer import Distiller


def test_64_hash_ids_in_a_64_slot_bank_occupy_64_slots() -> None:
    m = manifest(label=None)  # 64 rows
    (obj,) = build_objectives(["contrastive:1:negatives=8"], student_cfg(), m)
    assert isinstance(obj, Contrastive) and obj.bank.vectors.shape[0] == 64 and "pos" in obj.columns()
    model = build_student(student_cfg())
    ids = hash_ids(64)
    assert len(set((ids % 64).tolist())) < 60  # keyed by id, these rows would share slots
    for k in range(0, 64, B):
        batch = make_batch(m, seed=k, pos=torch.arange(k, k + B))
        batch["id"] = ids[k : k + B]
        obj(run(model, batch), batch, 0.0)
    assert int(obj.bank.filled.sum()) == 64  # every row owns its slot


def test_bank_defaults_to_every_row_and_bank_size_bounds_it() -> None:
    (full,) = build_objectives(["contrastive"], student_cfg(), manifest())
    (bounded,) = build_objectives(["contrastive:1:bank_size=16"], student_cfg(), manifest())
    (pairs,) = build_objectives(["contrastive"], student_cfg(), manifest(pairs=True))
    assert full.bank.vectors.shape[0] == 64 and bounded.bank.vectors.shape[0] == 16
    assert pairs.bank.vectors.shape[0] == 128  # one slot per row and side


def test_batches_carry_each_rows_position_in_the_store(tmp_path: Path) -> None:
    path = make_store(tmp_path / "s", rows=140, shards=2, tmp=tmp_path)
    store = Store.open(path)
    ids = np.concatenate([pq.read_table(store.loc.path(store.table("texts").shards[k].file), columns=["id"])
                          .column("id").to_numpy() for k in range(2)])
    cfg = D.DataConfig(str(path), [f"{TEACHER}.sentence", D.POS], TEACHER, batch_size=16, val_percent=10,
                       shuffle_buffer=32)
    plan = D.build_plan(store, cfg)
    train = list(D.train_batches(store, plan, 0, 0)) + list(D.train_batches(store, plan, 1, 0))
    val = D.validation_batches(store, plan)
    for b in train + val:
        assert torch.equal(b["id"], torch.from_numpy(ids[b["pos"].numpy()]))
    seen = torch.cat([b["pos"] for b in train[: len(train) // 2] + val]).tolist()
    assert sorted(seen) == list(range(140))  # one epoch plus the held-out rows: every position once


# --------------------------------------------------------------------------------------------------
# Negatives


def test_same_label_rows_are_not_negatives() -> None:
    m = manifest(label="int64")
    (obj,) = build_objectives(["contrastive:1:negatives=8"], student_cfg(), m)
    assert obj.use_labels and obj.columns()[-1] == "label"
    model = build_student(student_cfg())
    batch = make_batch(m)
    batch["label"][:] = 1  # one class: no row of the batch is a negative of another, the bank is empty
    obj.eval()
    assert obj(run(model, batch), batch, 0.0).item() < 1e-6
    (blind,) = build_objectives(["contrastive:1:negatives=8:labels=false"], student_cfg(), m)
    assert blind(run(model, batch), batch, 0.0).item() > 0.1


def test_bank_negatives_have_another_label() -> None:
    m = manifest(label="int64")
    (obj,) = build_objectives(["contrastive:1:negatives=64"], student_cfg(), m)
    model = build_student(student_cfg())
    first = make_batch(m)
    first["label"] = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    obj(run(model, first), first, 0.0)  # bank: rows 0-3 label 0, rows 4-7 label 1
    assert obj.bank.labels[:8].tolist() == first["label"].tolist()
    second = make_batch(m, seed=1, pos=torch.arange(8, 16))
    second["label"] = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    bank, drop = obj._negatives(obj.bank.slots(second["pos"]), second["label"], 8, 1)
    assert bank.shape[0] == 8  # 4 entries of label 1 for the label-0 group, 4 of label 0 for the other
    usable = ~drop[:, 8:]
    for i, lab in enumerate(second["label"].tolist()):
        assert int(usable[i].sum()) == 4
        rows = torch.nonzero(usable[i]).squeeze(1)
        banked = [int(torch.nonzero((obj.bank.vectors == bank[r]).all(1))[0]) for r in rows]
        assert all(obj.bank.labels[s].item() != lab for s in banked)


def test_a_pairs_own_partner_is_not_a_negative() -> None:
    m = manifest(pairs=True, label=None)
    (obj,) = build_objectives(["contrastive:1:negatives=8"], student_cfg(), m)
    model = build_student(student_cfg())
    batch = {k: v[:1] for k, v in make_batch(m).items()}  # one pair: a's only other candidate is b
    obj.eval()
    assert obj(run(model, batch), batch, 0.0).item() < 1e-6
    s = torch.randn(2, 4)
    assert info_nce(s, s, s[:0], 0.1).item() > 0  # without the mask the partner would count


# --------------------------------------------------------------------------------------------------
# DDP: both ranks' banks are equal and hold both ranks' rows


def _bank_worker(rank: int, world: int, rdv: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        m = manifest(label=None)
        cfg = student_cfg()
        model = Distiller(build_student(cfg), build_objectives(["cosine", "contrastive:1:negatives=4"], cfg, m),
                          False)
        ddp = wrap(model, Dist(rank, world))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            n = B if rank == 0 or step < 2 else B // 2  # unequal batches, as a last partial batch can be
            batch = make_batch(m, seed=10 * step + rank, pos=torch.arange(n) + B * (2 * step + rank))
            batch = {k: v[:n] for k, v in batch.items()}
            loss, _ = ddp(batch, 0.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
        bank = model.objectives[1].bank
        save_file({"vectors": bank.vectors, "filled": bank.filled.to(torch.uint8),
                   "broadcast": torch.tensor([int(ddp.broadcast_buffers)])}, f"{out}/bank{rank}.safetensors")
    finally:
        dist.destroy_process_group()


def test_ddp_banks_are_equal_and_hold_both_ranks_rows(tmp_path: Path) -> None:
    mp.spawn(_bank_worker, args=(2, str(tmp_path / "rdv"), str(tmp_path)), nprocs=2, join=True)
    b0, b1 = (load_file(str(tmp_path / f"bank{r}.safetensors")) for r in range(2))
    assert torch.equal(b0["vectors"], b1["vectors"]) and torch.equal(b0["filled"], b1["filled"])
    filled = set(torch.nonzero(b0["filled"]).squeeze(1).tolist())
    rank0 = {p for step in range(3) for p in range(B * 2 * step, B * 2 * step + B)}
    rank1 = {p for step in range(3) for p in range(B * (2 * step + 1), B * (2 * step + 1) + (B if step < 2 else 4))}
    assert filled == rank0 | rank1
    assert b0["broadcast"].item() == 0  # DDP does not overwrite the banks with rank 0's
