"""Build small stores directly through the store contract, with vectors chosen so answers are checkable."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from kd.common.ids import row_ids
from kd.storage.manifest import Manifest
from kd.storage.schema import VectorDType, texts_schema, vectors_to_arrow
from kd.storage.store import Store, open_writer


@dataclass
class TableSpec:
    kind: str  # teacher | student | derived
    columns: dict[str, np.ndarray]  # column -> (rows, *shape) array or 1-D scalar array
    meta: dict = field(default_factory=dict)


def _column(x: np.ndarray) -> pa.Array:
    if x.ndim == 1:
        return pa.array(x)
    return vectors_to_arrow(x, VectorDType.int8 if x.dtype == np.int8 else VectorDType.float32)


def build_store(
    path: Path,
    texts: list[str] | list[tuple[str, str]],
    tables: dict[str, TableSpec],
    *,
    rows_per_shard: int = 50,
    doc_ids: list[str] | None = None,
    positions: list[int] | None = None,
    labels: list | None = None,
    ids: np.ndarray | None = None,
    writer_id: str = "test",
) -> Store:
    """Write texts + aligned tables, sharded like kd precompute does (shard k = rows [k*R, (k+1)*R)), with the
    content-hash ids kd precompute gives them (`ids`: others, for a test of a store validate refuses)."""
    n = len(texts)
    pairs = isinstance(texts[0], tuple)
    ids = row_ids(texts) if ids is None else np.asarray(ids, dtype=np.int64)
    num_shards = (n + rows_per_shard - 1) // rows_per_shard
    inputs = {
        "fingerprint": f"test-{n}-{rows_per_shard}-{pairs}", "num_rows": n, "rows_per_shard": rows_per_shard,
        "num_shards": num_shards, "pairs": pairs,
    }
    label_type = None if labels is None else pa.array(labels).type
    schema = texts_schema(pairs, label_type)
    cols: dict[str, object] = {"id": ids}
    if pairs:
        cols["text_a"] = [a for a, _ in texts]
        cols["text_b"] = [b for _, b in texts]
    else:
        cols["text"] = list(texts)
    cols["doc_id"] = doc_ids or [f"doc{i}" for i in range(n)]
    cols["position"] = np.zeros(n, dtype=np.int32) if positions is None else np.asarray(positions, dtype=np.int32)
    cols["source"] = ["test.txt"] * n
    if labels is not None:
        cols["label"] = labels
    full_texts = pa.table({k: pa.array(v, type=schema.field(k).type) for k, v in cols.items()}, schema=schema)
    w = open_writer(path, Manifest(inputs), writer_id)
    try:
        w.declare("texts", "texts", {f.name: str(f.type) for f in schema}, {})
        full = {}
        for name, spec in tables.items():
            arrays = {"id": pa.array(ids), **{c: _column(x) for c, x in spec.columns.items()}}
            full[name] = pa.table(arrays)
            w.declare(name, spec.kind, {c: str(a.type) for c, a in arrays.items()}, spec.meta)
        for k in range(num_shards):
            lo, hi = k * rows_per_shard, min(n, (k + 1) * rows_per_shard)
            w.commit("texts", k, full_texts.slice(lo, hi - lo))
            for name, t in full.items():
                w.commit(name, k, t.slice(lo, hi - lo))
        w.publish()
    finally:
        w.close()
    return Store.open(path)


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def grouped_vectors(
    groups: int, per_group: int, dim: int, spread: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors in `groups` tight clusters around random centres; returns (vectors, gold labels)."""
    rng = np.random.default_rng(seed)
    centres = unit(rng.normal(size=(groups, dim)))
    gold = np.repeat(np.arange(groups), per_group)
    x = centres[gold] + spread * rng.normal(size=(len(gold), dim)).astype(np.float32)
    return unit(x), gold
