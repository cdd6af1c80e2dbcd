"""Non-finite everywhere (issue 41, item 4): every path that copies, loads, indexes or clusters vectors or weights
refuses NaN/Inf, naming the row id or the tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError, StoreError
from kd.storage import fs
from kd.storage.schema import VectorDType, vectors_to_arrow


def poison(store: Path, table: str, k: int, column: str, row: int) -> int:
    """Row `row` of shard k's `column` made NaN, committed as a writer would (checksums agree): only a
    finiteness check can notice. Returns that row's id."""
    f = store / table / f"part-{k:05d}.parquet"
    t = pq.read_table(f)
    v = np.stack(t[column].to_numpy(zero_copy_only=False)).astype(np.float32)
    v[row, 0] = np.nan
    t = t.set_column(t.schema.get_field_index(column), column, vectors_to_arrow(v, VectorDType.float32))
    data = fs.parquet_bytes(t)
    f.write_bytes(data)
    for m in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        if table in d["tables"] and str(k) in d["tables"][table]["shards"]:
            d["tables"][table]["shards"][str(k)].update(bytes=len(data), sha256=fs.sha256(data))
            m.write_text(json.dumps(d))
    return int(t["id"][row].as_py())


@pytest.fixture(scope="module")
def nan_store(tmp_path_factory) -> tuple[Path, int]:
    """A synthetic store whose teachers/tiny `mean` holds one NaN row (shard 1, row 4), and that row's id."""
    root = tmp_path_factory.mktemp("nan")
    path = make_store(root / "store", rows=40, shards=2, tmp=root, nan_at=(1, 4))
    rows = pq.read_table(path / "teachers" / "tiny" / "part-00001.parquet", columns=["id"])
    return path, int(rows["id"][4].as_py())


def test_reuse_refuses_to_copy_a_non_finite_vector(tiny_teacher, tmp_path, sentences):
    from kd.pipeline.precompute import precompute

    src = tmp_path / "in.txt"
    src.write_text("\n".join(sentences[:30]) + "\n", encoding="utf-8")
    opts = dict(outputs=["mean"], shard_rows=15, backend="torch", progress=False)
    precompute([str(src)], str(tmp_path / "old"), [f"tiny={tiny_teacher}"], **opts)
    bad = poison(tmp_path / "old", "teachers/tiny", 1, "mean", 3)
    with pytest.raises(StoreError) as e:
        precompute([str(src)], str(tmp_path / "new"), [f"tiny={tiny_teacher}"], reuse=str(tmp_path / "old"), **opts)
    assert "non-finite" in e.value.what and str(bad) in e.value.what and "--reuse" in e.value.what
    assert "old" in e.value.where and "drop --reuse" in e.value.fix
    new = tmp_path / "new" / "teachers" / "tiny"
    assert not (new / "part-00001.parquet").exists()  # nothing of that shard committed


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    pytest.importorskip("sentence_transformers")
    from kd.student import trainer as T
    from kd.student.exporters.st_directory import export_sentence_transformers

    root = tmp_path_factory.mktemp("export")
    store = make_store(root / "store", rows=40, shards=2, tmp=root)
    trained = T.train(T.TrainConfig(str(store), str(root / "student"), arch="ffn", embed_dim=8, hidden_dim=8,
                                    batch_size=8, max_steps=1, val_percent=0, progress=False))
    return export_sentence_transformers(trained, root / "st")


def test_load_exported_refuses_non_finite_weights(exported, tmp_path):
    from safetensors.torch import load_file, save_file

    from kd import student

    folder = Path(shutil.copytree(exported, tmp_path / "received"))
    weights = sorted(folder.rglob("*.safetensors"))[0]
    state = load_file(str(weights))
    name = sorted(k for k, v in state.items() if v.is_floating_point())[0]
    state[name][0] = float("nan")
    save_file(state, str(weights))
    with pytest.raises(InputError) as e:
        student.load_exported(folder)
    assert "NaN/Inf" in e.value.what and name in e.value.what and str(weights.parent) == e.value.where
    student.load_exported(exported)  # (the untouched export loads)


def test_kd_index_refuses_a_non_finite_vector(nan_store, tmp_path):
    store = Path(shutil.copytree(nan_store[0], tmp_path / "store"))
    res = CliRunner().invoke(app, ["index", str(store), "--table", "tiny", "--column", "mean"])
    assert res.exit_code == 2 and "NaN/Inf" in res.output and str(nan_store[1]) in res.output, res.output
    assert "shard 1" in res.output and not list(store.glob("indexes/*.faiss"))
    res = CliRunner().invoke(app, ["index", str(store), "--table", "tiny", "--column", "sentence"])
    # a finite column of the same table too: the store is one validate refuses, and its fix (--repair) comes first
    assert res.exit_code == 2 and "column 'mean'" in res.output and "--repair" in res.output, res.output


def test_kd_cluster_refuses_a_non_finite_vector(nan_store, tmp_path):
    store = Path(shutil.copytree(nan_store[0], tmp_path / "store"))
    res = CliRunner().invoke(app, ["cluster", str(store), "--table", "tiny", "--column", "mean",
                                   "--threshold", "0.5"])
    assert res.exit_code == 2, res.output  # (a traceback exits 1)
    assert "NaN/Inf" in res.output and str(nan_store[1]) in res.output, res.output
    assert "derived/clusters-tiny-mean" not in json.loads((store / "manifest.json").read_text())["tables"]


def test_poison_keeps_the_store_consistent_for_the_checksums(nan_store, tmp_path):
    """(the helper's premise: a poisoned shard passes the checksum, only the finiteness check reports it)"""
    from kd.storage.validate import check

    store = Path(shutil.copytree(nan_store[0], tmp_path / "store"))
    poison(store, "teachers/tiny", 0, "sentence", 2)
    problems = [str(p) for p in check(str(store))[1]]
    assert problems and all("non-finite" in p for p in problems), problems


def test_eval_reading_teacher_vectors_from_the_store_refuses_a_non_finite_one(nan_store):
    """The probe's A17e: `kd eval --store` with one NaN teacher vector printed "—" cells and exited 0, while every
    other reader of the store refused it. The store-side teacher of eval now refuses it, naming the row id; as every
    reader of rows it refuses the store whichever column it reads (the sixth probe: a damaged vocab output passed)."""
    from kd.apps.eval.store_teacher import StoreTeacher

    for column in ("mean", "sentence"):
        with pytest.raises(StoreError) as e:
            StoreTeacher.open(str(nan_store[0]), "tiny", column).sample(1000)
        assert str(nan_store[1]) in str(e.value) and "NaN/Inf" in str(e.value) and "--repair" in str(e.value)
