"""Fault injection: damage each kind of file of a real store in turn; every reader either refuses,
naming the damaged file, or answers exactly as on the undamaged store. Never a different answer.

The store: real news sentences, a tiny random BERT teacher, 3 shards, a faiss index. Damage modes:
flip 8 bytes in the middle, truncate to half, delete. Readers: Store.read_table (texts + teacher),
the training stream (student.data), DuckDB through dataset.query.connect, faiss search through
dataset.index, and kd validate (which must report every damage).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import precompute_news

from kd.common.errors import KdError
from kd.dataset.index import build_index
from kd.dataset.query import connect
from kd.storage.index_files import list_indexes, load_index
from kd.storage.store import Store
from kd.storage.validate import check
from kd.student import data as D

TARGETS = {
    "texts shard": "texts/part-00001.parquet",
    "teacher shard": "teachers/tiny/part-00002.parquet",
    "student shard": "students/st/part-00001.parquet",
    "manifest.json": "manifest.json",
    "fragment": "manifests/{writer}",
    "tokenizer file": "tokenizers/tiny/tokenizer.json",
    "input embeddings": "teachers/tiny/input_embeddings.safetensors",
    "index file": "indexes/{index}",
    "index ids": "indexes/{ids}",
}
MODES = ("flip", "truncate", "delete")


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_teacher, sentences) -> Path:
    root = tmp_path_factory.mktemp("faults")
    store = precompute_news(root, tiny_teacher, sentences, 150, 50)
    build_index(store, "teachers/tiny", "mean")
    from kd.student.embed import embed
    from kd.student.trainer import TrainConfig, train

    folder = train(TrainConfig(str(store), str(root / "st"), arch="bilstm", target="tiny.mean", embed_dim=8,
                               hidden_dim=8, max_steps=2, batch_size=16, progress=False))
    embed(folder, str(store), name="st", progress=False)
    return store


def _answers(store_path: Path) -> dict:
    """What every reader returns; a KdError is caught by the caller."""
    store = Store.open(store_path)
    out = {
        "texts": store.read_table("texts").to_pydict(),
        "teacher": store.read_table("teachers/tiny", ["id", "mean"]).to_pydict(),
        "student": store.read_table("students/st").to_pydict(),
    }
    cfg = D.DataConfig(str(store_path), ["tiny.mean"], "tiny", batch_size=16, max_length=32, val_percent=0.0)
    plan = D.build_plan(store, cfg)
    out["stream"] = [(b["id"].tolist(), b["tiny.mean"].numpy().tolist())
                     for b in D.train_batches(store, plan, 0, 0)]
    con = connect(store_path)
    out["sql"] = con.sql("SELECT count(*), sum(list_sum(tiny_mean::FLOAT[])) FROM outputs").fetchall()
    index, ids = load_index(store, list_indexes(store)[0])
    q = np.asarray(out["teacher"]["mean"][:3], dtype=np.float32)
    out["search"] = (index.search(q / np.linalg.norm(q, axis=1, keepdims=True), 5)[0].round(5).tolist(),
                     ids.tolist())
    return out


def _resolve(clean: Path, target: str) -> str:
    writer = next(p.name for p in (clean / "manifests").iterdir() if p.suffix == ".json")
    index = next(p.name for p in (clean / "indexes").iterdir() if p.suffix == ".faiss")
    ids = next(p.name for p in (clean / "indexes").iterdir() if p.name.endswith(".npy"))
    return target.format(writer=writer, index=index, ids=ids)


def _damage(f: Path, mode: str) -> None:
    if mode == "delete":
        f.unlink()
        return
    data = bytearray(f.read_bytes())
    if mode == "truncate":
        f.write_bytes(bytes(data[: len(data) // 2]))
        return
    mid = len(data) // 2
    data[mid : mid + 8] = bytes(b ^ 0xFF for b in data[mid : mid + 8])
    f.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def expected(clean) -> dict:
    return _answers(clean)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(TARGETS))
def test_damage_is_refused_or_harmless(clean, expected, tmp_path, kind, mode):
    store = Path(shutil.copytree(clean, tmp_path / "store"))
    rel = _resolve(clean, TARGETS[kind])
    _damage(store / rel, mode)
    try:
        got = _answers(store)
    except KdError as e:
        assert Path(rel).name in str(e) or rel.split("/")[0] in str(e), f"{kind}/{mode}: not named: {e}"
    else:
        # Only a redundant file may be damaged without an error: manifest.json or a fragment that the
        # other one fully covers. The answers must then be identical.
        assert got == expected, f"{kind}/{mode}: different answers with no error"
    try:
        _, problems = check(str(store))
    except KdError as e:
        problems = [str(e)]
    redundant = kind in ("manifest.json", "fragment") and mode == "delete"
    assert problems or redundant, f"{kind}/{mode}: kd validate found nothing"
