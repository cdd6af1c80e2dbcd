"""The index files of a store: what the manifest records for a faiss index, and reading them back checked.

The store contract's side of `kd index` (kd.dataset.index builds and searches): validate and repair check
these files as they check shards, so their record and their checks live with the store.
- Files: `indexes/<view>-<column>-<kind>.faiss` plus `<...>.ids.npy` (faiss position -> store id); the
  manifest extras key `index:<view>-<column>-<kind>` holds an `IndexInfo` with both files' sha256 and the
  hash of the source table's shard checksums (`source_hash`), so a rewritten table makes the index stale.
- faiss is imported by `load_index` only: validate and repair import this module without it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kd.common.errors import StoreError
from kd.storage import fs
from kd.storage.store import Store

if TYPE_CHECKING:
    import faiss

EXTRA_PREFIX = "index:"


@dataclass
class IndexInfo:
    """What the manifest extras record for one index."""

    name: str
    table: str
    column: str
    kind: str
    file: str
    ids_file: str
    rows: int
    dim: int
    sha256: str
    source: str  # hash of the source table's shard checksums (staleness check)
    metric: str = "cosine"
    device: str = "cpu"
    ids_sha256: str = ""  # empty in stores indexed before it was recorded

    @classmethod
    def from_extra(cls, d: dict) -> IndexInfo:
        return cls(**d)


def source_hash(store: Store, table: str) -> str:
    """The hash of a table's shard checksums: it changes when any shard of the table is rewritten."""
    rec = store.table(table)
    return fs.sha256("".join(rec.shards[k].sha256 for k in sorted(rec.shards)).encode())


def list_indexes(store: Store) -> list[IndexInfo]:
    return [IndexInfo.from_extra(v) for k, v in sorted(store.manifest.extras.items()) if k.startswith(EXTRA_PREFIX)]


def load_index(store: Store, info: IndexInfo) -> tuple[faiss.Index, np.ndarray]:
    """The faiss index and its position -> id array, refusing stale or modified files."""
    import faiss

    if info.table not in store.manifest.tables or source_hash(store, info.table) != info.source:
        raise StoreError(
            f"index {info.name} is stale: table {info.table!r} was rewritten after it was built",
            store.root,
            f"rebuild it: kd index {store.root} --table {info.table} --column {info.column} --kind {info.kind}",
        )
    data, id_bytes = verified_index_files(store, info)
    index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    ids = np.load(io.BytesIO(id_bytes), allow_pickle=False)
    if len(ids) != info.rows or index.ntotal != info.rows:
        raise StoreError(f"index {info.name} holds {index.ntotal} vectors and {len(ids)} ids, the manifest says "
                         f"{info.rows}", store.loc.path(info.ids_file), "rebuild it with kd index")
    return index, ids


def verified_index_files(store: Store, info: IndexInfo) -> tuple[bytes, bytes]:
    """The index and ids files' bytes, refused when missing or unlike their recorded sha256."""
    out = []
    for rel, sha, field in ((info.file, info.sha256, "file"), (info.ids_file, info.ids_sha256, "ids_file")):
        store.path_of(rel, f"extras.{EXTRA_PREFIX}{info.name}.{field}")  # never a file outside the store
        try:
            data = fs.read_bytes(store.loc, rel)
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"index file is missing or unreadable ({e})", store.loc.path(rel),
                             "rebuild it with kd index") from e
        if sha and fs.sha256(data) != sha:
            raise StoreError("index file does not match its manifest checksum (corrupt or modified)",
                             store.loc.path(rel), "rebuild it with kd index")
        out.append(data)
    return out[0], out[1]
