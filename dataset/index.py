"""Vector indexes over a store's columns (faiss), for nearest-neighbour search and clustering.

- Cosine similarity = inner product of L2-normalised vectors, so every index uses
  METRIC_INNER_PRODUCT on normalised rows and scores are cosines (for flat, exact ones).
- Kinds: `flat` (exact), `ivf` (IVF-Flat, nlist ~ 4 sqrt(n), trained on a sample),
  `hnsw` (HNSW-Flat, M=32). faiss GPU builds flat/ivf when `faiss.get_num_gpus() > 0`;
  the saved index is always the CPU form.
- Files: `indexes/<view>-<column>-<kind>.faiss` plus `<...>.ids.npy` (faiss position -> store id),
  both written atomically; the manifest extras key `index:<view>-<column>-<kind>` points at them
  with the shard checksums of the source table, so a search on a rewritten table is refused
  instead of returning wrong rows (the record and its checks: kd.storage.index_files). (The id mapping
  is a side file, not inline JSON, because every reader parses the manifest and a 1M-row list would
  slow them all.)
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import faiss
import numpy as np
import pyarrow.compute as pc

from kd.common.errors import InputError, StoreError
from kd.common.finite import OUT_OF_RANGE, unusable_rows
from kd.dataset.index_config import IndexConfig
from kd.dataset.query import resolve_table, view_names
from kd.storage import fs
from kd.storage.index_files import EXTRA_PREFIX, IndexInfo, list_indexes, load_index, normalize, source_hash
from kd.storage.int8 import DAMAGED, is_scale_column
from kd.storage.schema import table_vectors, vector_shape
from kd.storage.store import Store, iter_shards, open_writer

WRITER_ID = "index"


class IndexKind(str, Enum):
    flat = "flat"
    ivf = "ivf"
    hnsw = "hnsw"


@dataclass
class SearchResult:
    """Top-k per query: ids/scores are (queries, k), best first.

    Store ids are content hashes and may be negative, so an empty slot (an approximate index found
    fewer than k rows) is marked by score -inf (its id is 0 and its text "").
    """

    ids: np.ndarray
    scores: np.ndarray
    texts: list[list[str]]
    index: IndexInfo


def use_gpu() -> bool:
    return hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0


def vector_column(store: Store, table: str, column: str) -> int:
    """Check that `column` of `table` is a 1-D vector column; return its dimension."""
    schema = store.dataset(table).schema
    if column not in schema.names:
        vecs = [f.name for f in schema if vector_shape(f.type) and not is_scale_column(f.name)]
        raise InputError(f"table {table!r} has no column {column!r}", store.root, f"vector columns: {', '.join(vecs)}")
    shape = vector_shape(schema.field(column).type)
    if len(shape) != 1:
        raise InputError(
            f"column {column!r} of {table!r} has shape {shape or 'scalar'}, not a vector",
            store.root,
            "index a 1-D vector column (cls, mean, sentence, logits or a student embedding)",
        )
    return shape[0]


def read_vectors(store: Store, table: str, column: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """All rows of a vector column in shard order: (ids, vectors, rows per shard); NaN/Inf (and components past
    MAX_ABS) refused, since such a vector has no cosine (an index would rank it anywhere, clustering fails), and an
    id twice, since a hit is named by its id (the ids are in hand: one sort)."""
    ids, vecs, sizes = [], [], []
    for k, t in iter_shards(store, table):
        ids.append(t.column("id").to_numpy())
        vecs.append(table_vectors(t, column, store.loc.path(table)))
        sizes.append(t.num_rows)
        _refuse_non_finite(vecs[-1], ids[-1], f"{store.loc.path(table)} (shard {k}, column {column!r})")
    every = np.concatenate(ids)
    values, counts = np.unique(every, return_counts=True)
    if len(values) != len(every):
        raise StoreError(f"id {int(values[counts > 1][0])} appears twice in table {table!r} (a hit is named by its id)",
                         store.loc.path(table), "kd precompute never writes an id twice: the store was changed after "
                         "it was written; write it again (kd precompute into a new --out), and run kd validate on it")
    return every, np.concatenate(vecs), sizes


def _refuse_non_finite(vectors: np.ndarray, ids: np.ndarray, where: str) -> None:
    bad = unusable_rows(vectors)
    if len(bad):
        raise StoreError(f"{len(bad)} vector(s) hold {OUT_OF_RANGE}, first at row id {int(ids[bad[0]])}", where,
                         f"{DAMAGED}; or pick another column")


def make_index(x: np.ndarray, kind: IndexKind, *, gpu: bool | None = None, seed: int = 0) -> faiss.Index:
    """Build a faiss inner-product index of normalised rows `x` (returned on the CPU).

    - ivf: nlist = clip(4 sqrt(n), 1, n/39) (faiss wants >= 39 training points per list),
      trained on up to 256 points per list; nprobe = max(8, nlist/8) is saved with it.
    - hnsw: M=32, efConstruction=80, efSearch=64 (CPU only: faiss GPU has no HNSW).
    """
    n, d = x.shape
    gpu = use_gpu() if gpu is None else gpu
    kind = IndexKind(kind)
    if kind is IndexKind.hnsw:
        index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        index.hnsw.efSearch = 64
        index.add(x)
        return index
    nlist = int(max(1, min(4 * np.sqrt(n), n // 39)))
    if kind is IndexKind.flat:
        index = faiss.IndexFlatIP(d)
    else:
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    if gpu:
        res = faiss.StandardGpuResources()
        index = faiss.index_cpu_to_gpu(res, 0, index)
    if not index.is_trained:
        rng = np.random.default_rng(seed)
        sample = x if n <= 256 * nlist else x[rng.choice(n, 256 * nlist, replace=False)]
        index.train(sample)
    index.add(x)
    if gpu:
        index = faiss.index_gpu_to_cpu(index)
    if kind is IndexKind.ivf:
        index.nprobe = max(8, nlist // 8)
    return index


def index_name(store: Store, table: str, column: str, kind: IndexKind) -> str:
    return f"{view_names(store.manifest)[table]}-{column}-{IndexKind(kind).value}"


def index_store(cfg: IndexConfig, chosen: Callable[[str], None] = lambda line: None) -> IndexInfo:
    """`kd index`: `build_index` of the configured column; a table or column not given is `default_vector`'s,
    said to `chosen` before the work."""
    table, column = cfg.table, cfg.column
    if table is None or column is None:
        table, column = default_vector(cfg.store, table, column)
        chosen(f"indexing {table}.{column} (pass --table/--column to choose another)")
    return build_index(cfg.store, table, column, cfg.kind)


def build_index(store_path: str | os.PathLike, table: str, column: str,
                kind: IndexKind | str = IndexConfig.kind) -> IndexInfo:  # (kd index's default kind)
    """Index a vector column of a store and record it in the manifest (the `kd index` command).

    - Reads the column in shard order, L2-normalises it, builds the faiss index (GPU if any).
    - Writes index and ids atomically, then the extras entry through a StoreWriter ("index"),
      and publishes the merged manifest.
    """
    try:
        kind = IndexKind(kind)
    except ValueError:
        raise InputError(f"unknown index kind {kind!r}", "--kind",
                         f"use one of {', '.join(k.value for k in IndexKind)}") from None
    store = Store.open(store_path, content=True)  # hits are named by ids and shown with texts: both checked
    table = resolve_table(store, table)
    dim = vector_column(store, table, column)
    ids, x, _ = read_vectors(store, table, column)
    gpu = use_gpu() and IndexKind(kind) is not IndexKind.hnsw
    index = make_index(normalize(x), kind, gpu=gpu)
    name = index_name(store, table, column, kind)
    data = faiss.serialize_index(index).tobytes()
    buf = io.BytesIO()
    np.save(buf, ids.astype(np.int64))
    info = IndexInfo(
        name=name, table=table, column=column, kind=IndexKind(kind).value, file=f"indexes/{name}.faiss",
        ids_file=f"indexes/{name}.ids.npy", rows=len(ids), dim=dim, sha256=fs.sha256(data),
        source=source_hash(store, table), device="gpu" if gpu else "cpu", ids_sha256=fs.sha256(buf.getvalue()),
    )
    fs.atomic_write_bytes(store.loc, data, info.file)
    fs.atomic_write_bytes(store.loc, buf.getvalue(), info.ids_file)
    w = open_writer(store_path, store.manifest, WRITER_ID)
    try:
        w.set_extra(EXTRA_PREFIX + name, info.__dict__)
        w.publish()
    finally:
        w.close()
    return info


def default_vector(store_path: str | os.PathLike, table: str | None, column: str | None) -> tuple[str, str]:
    """What `kd index STORE` indexes when not told: the first teacher (by name) and its default vector
    column (`sentence`, else `mean`, else its first 1-D vector column)."""
    store = Store.open(store_path)
    if table is None:
        teachers = sorted(store.manifest.teachers())
        if not teachers:
            raise InputError("the store has no teacher table to index", store.root, "pass --table and --column")
        table = f"teachers/{teachers[0]}"
    table = resolve_table(store, table)
    if column is None:
        schema = store.dataset(table, verify=False).schema
        vectors = [f.name for f in schema if len(vector_shape(f.type)) == 1 and not is_scale_column(f.name)]
        column = next((c for c in ("sentence", "mean") if c in vectors), vectors[0] if vectors else None)
        if column is None:
            raise InputError(f"table {table!r} has no 1-D vector column", store.root, "pass --column")
    return table, column


def find_index(store: Store, table: str | None = None, column: str | None = None, kind: str | None = None,
               dim: int | None = None) -> IndexInfo:
    """The one index matching the filters (table as path or view name; dim of the query vectors)."""
    table = resolve_table(store, table) if table else None
    found = [
        i for i in list_indexes(store)
        if (table is None or i.table == table) and (column is None or i.column == column)
        and (kind is None or i.kind == IndexKind(kind).value) and (dim is None or i.dim == dim)
    ]
    if len(found) == 1:
        return found[0]
    have = ", ".join(i.name for i in list_indexes(store)) or "none"
    if not found:
        want = "/".join(str(v) for v in (table, column, kind) if v) or "any"
        dims = f" with dim {dim}" if dim else ""
        raise StoreError(
            f"no index for {want}{dims} in this store (indexes: {have})",
            store.root,
            f"build one: kd index {store.root} --table {table or 'TABLE'} --column {column or 'COLUMN'}",
        )
    raise InputError(f"{len(found)} indexes match ({', '.join(i.name for i in found)})", store.root,
                     "choose one with --table, --column and --kind")


def text_of(store: Store, ids: np.ndarray, column: str | None = None) -> dict[int, str]:
    """id -> text for the given ids (pair stores: the side a `_a`/`_b` column embeds, else 'a ||| b')."""
    wanted = np.unique(ids)
    dataset = store.dataset("texts")
    names = dataset.schema.names
    if "text" in names:
        cols = ["text"]
    elif column and column.endswith(("_a", "_b")):
        cols = ["text_" + column[-1]]
    else:
        cols = ["text_a", "text_b"]
    t = dataset.to_table(columns=["id", *cols], filter=pc.field("id").isin(wanted))
    parts = [t.column(c).to_pylist() for c in cols]
    return {i: " ||| ".join(p) for i, *p in zip(t.column("id").to_pylist(), *parts)}


def search(store_path: str | os.PathLike | Store, query_vectors: np.ndarray, k: int = 10, *,
           table: str | None = None, column: str | None = None, kind: str | None = None) -> SearchResult:
    """Top-k rows by cosine similarity to each query vector, with their texts.

    - Picks the index by table/column/kind (and the queries' dim) among those in the manifest.
    - Normalises the queries, searches, maps positions to store ids, looks up the texts.
    """
    store = store_path if isinstance(store_path, Store) else Store.open(store_path)
    q = np.atleast_2d(np.asarray(query_vectors, dtype=np.float32))
    info = find_index(store, table, column, kind, dim=q.shape[1])
    index, ids = load_index(store, info)
    scores, pos = index.search(normalize(q), min(k, info.rows))
    ok = pos >= 0
    found = np.where(ok, ids[np.clip(pos, 0, None)], 0)
    scores = np.where(ok, scores, -np.inf).astype(np.float32)
    texts = text_of(store, found[ok], info.column)
    rows = [[texts[int(i)] if good else "" for i, good in zip(r, g)] for r, g in zip(found, ok)]
    return SearchResult(found, scores, rows, info)
