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
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kd.common.errors import StoreError
from kd.common.finite import OUT_OF_RANGE, unusable_rows
from kd.storage import fs
from kd.storage.alignment import ids_digest, shard_digest
from kd.storage.faiss_layout import LayoutError, max_file_bytes, stored_vectors, vectors_by_position
from kd.storage.schema import canonical_type, table_vectors
from kd.storage.soundness import remember, verdict_mark
from kd.storage.store import Store, iter_shards

if TYPE_CHECKING:
    import faiss

EXTRA_PREFIX = "index:"
MAX_NPY_HEADER = 64 << 10  # numpy writes a few hundred bytes of header; its reader stops at 10,000 by default
UNIT_TOLERANCE = 1e-3  # float32 normalisation leaves ~1e-7


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
    """The faiss index and its position -> id array, once both files are what the record says (validate and
    search both come here, so they refuse the same files):
    - the record fits its table (not stale, its row count and vector dim) and the files their checksums;
    - the index file is laid out as a `kind` index of `rows` x `dim` (storage.faiss_layout), walked before faiss
      reads it, so a forged length never sizes an allocation and an index of another kind or dim is not used;
    - its vectors are the finite unit vectors `kd index` stores;
    - the ids are `rows` int64s, the table's ids in shard order (their recorded digests): a reordered ids file
      names every hit by another row's id;
    - the vector at position p is row p of the column, normalised: two rows swapped in the index file (checksum
      re-forged) returned each other's neighbours (the sixth probe). Read once per index state (a verdict in the
      kd cache keyed by the index's and its table's checksums, both verified on every read).
    A checksum re-forged in the manifest passes the checksum but none of these."""
    import faiss

    _check_record(store, info)
    data, id_bytes = verified_index_files(store, info)
    _check_vectors(store, info, data)
    ids = _read_ids(store, info, id_bytes)
    _check_row_order(store, info, ids)
    _check_rows_are_the_table(store, info, data)
    try:
        index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    except RuntimeError as e:  # not expected once the layout is checked: still the store's error, not a traceback
        raise _refused(store, info, info.file, f"faiss cannot read it ({' '.join(str(e).split())[-200:]})") from e
    return index, ids


def rebuild_fix(store: Store, info: IndexInfo) -> str:
    return f"rebuild it: kd index {store.root} --table {info.table} --column {info.column} --kind {info.kind}"


def _refused(store: Store, info: IndexInfo, rel: str, why: str) -> StoreError:
    return StoreError(f"index {info.name}: {why}", store.loc.path(rel), rebuild_fix(store, info))


def _check_record(store: Store, info: IndexInfo) -> None:
    """The record against its table: the shards it was built from (source hash), their row count, and the
    column's dim; these bound every size checked after."""
    if is_stale(store, info):
        raise StoreError(f"index {info.name} is stale: table {info.table!r} was rewritten after it was built",
                         store.root, rebuild_fix(store, info))
    rec = store.table(info.table)
    rows = sum(s.rows for s in rec.shards.values())
    m = re.fullmatch(r"\w+\[(\d+)\]", canonical_type(str(rec.columns.get(info.column, ""))))
    if info.rows != rows or m is None or info.dim != int(m.group(1)):
        raise _refused(store, info, "manifest.json", f"its record says {info.rows} rows of dim {info.dim}; table "
                       f"{info.table!r} holds {rows} rows, column {info.column!r} is "
                       f"{rec.columns.get(info.column, 'missing')}")


def is_stale(store: Store, info: IndexInfo) -> bool:
    """Whether the index was built from other rows than its table holds now (the table rewritten or grown since,
    e.g. by `kd precompute --add-to` or `kd embed` again): `kd search` refuses it until `kd index` rebuilds it."""
    return info.table not in store.manifest.tables or source_hash(store, info.table) != info.source


def verified_index_files(store: Store, info: IndexInfo) -> tuple[bytes, bytes]:
    """The index and ids files' bytes, refused when missing, larger than the record allows (checked before they
    are read) or unlike their recorded sha256."""
    out = []
    for rel, sha, field, limit in ((info.file, info.sha256, "file", max_file_bytes(info.rows, info.dim)),
                                   (info.ids_file, info.ids_sha256, "ids_file", MAX_NPY_HEADER + 8 * info.rows)):
        try:
            store.path_of(rel, f"extras.{EXTRA_PREFIX}{info.name}.{field}")  # never outside the store, nor a pipe
        except StoreError as e:  # kd index writes both files anew (a rename over the link or pipe)
            raise StoreError(e.what, e.where, rebuild_fix(store, info)) from None
        try:
            size = store.loc.fs.get_file_info(store.loc.path(rel)).size
            if size is not None and size > limit:
                raise _refused(store, info, rel, f"the file is {size:,} bytes, more than an index of {info.rows} "
                               f"rows of dim {info.dim} takes ({limit:,})")
            data = fs.read_bytes(store.loc, rel)
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"index file is missing or unreadable ({e})", store.loc.path(rel),
                             rebuild_fix(store, info)) from e
        if sha and fs.sha256(data) != sha:
            raise StoreError("index file does not match its manifest checksum (corrupt or modified)",
                             store.loc.path(rel), rebuild_fix(store, info))
        out.append(data)
    return out[0], out[1]


def _check_vectors(store: Store, info: IndexInfo, data: bytes) -> None:
    try:
        parts = stored_vectors(data, info.kind, info.rows, info.dim)
    except LayoutError as e:
        raise _refused(store, info, info.file, f"the file is not the {info.kind} index of {info.rows} vectors of "
                       f"dim {info.dim} its record describes: {e}") from None
    for part in parts:
        if len(unusable_rows(part)):
            raise _refused(store, info, info.file, f"it stores vectors with {OUT_OF_RANGE}")
        norms = np.linalg.norm(part, axis=1)
        if np.any((np.abs(norms - 1) > UNIT_TOLERANCE) & (norms != 0)):  # kd indexes unit rows (zero stays zero)
            raise _refused(store, info, info.file, "it stores vectors that are not of unit length (kd index "
                           "normalises every row: these were not written by it)")


def normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm as contiguous float32 (zero rows stay zero): what an index stores."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _check_rows_are_the_table(store: Store, info: IndexInfo, data: bytes) -> None:
    mark = verdict_mark("index", info.sha256, info.ids_sha256, info.source)
    if mark.is_file():
        return
    stored, start = vectors_by_position(data, info.kind, info.rows, info.dim), 0
    for k, table in iter_shards(store, info.table):
        want = normalize(table_vectors(table, info.column, store.loc.path(info.table)))
        off = np.nonzero(np.abs(stored[start : start + len(want)] - want).max(axis=1, initial=0) > 1e-5)[0]
        if len(off):
            raise _refused(store, info, info.file, f"its vector at position {start + off[0]} is not row "
                           f"{start + off[0]} of {info.table!r} (column {info.column!r}, shard {k}): search would "
                           "answer with other rows' neighbours")
        start += len(want)
    remember(mark)


def _read_ids(store: Store, info: IndexInfo, data: bytes) -> np.ndarray:
    """The ids file as `rows` int64s: its .npy header is read first, so a forged shape allocates nothing and an
    object array (pickle) is never loaded."""
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise ValueError(f".npy format version {version}")
        shape, _, dtype = read_header[version](f)
    except ValueError as e:
        raise _refused(store, info, info.ids_file, f"the ids file is not a .npy array ({e})") from None
    if shape != (info.rows,) or dtype != np.dtype("<i8") or len(data) - f.tell() != 8 * info.rows:
        raise _refused(store, info, info.ids_file, f"the ids file holds {dtype} of shape {shape}, not {info.rows} "
                       "int64 ids")
    return np.frombuffer(data, dtype="<i8", offset=f.tell())


def _check_row_order(store: Store, info: IndexInfo, ids: np.ndarray) -> None:
    """Position i of the index names row i of the table in shard order: each slice of the ids digests to what
    the manifest records for its shard (read from the shard where an older store recorded none)."""
    rec, start = store.table(info.table), 0
    for k in sorted(rec.shards):
        shard = rec.shards[k]
        want = shard.ids or shard_digest(store.read_verified(shard))
        if ids_digest(ids[start : start + shard.rows]) != want:
            raise _refused(store, info, info.ids_file, f"its ids are not the rows of {info.table!r} shard {k} in "
                           "order: search would name each hit by another row")
        start += shard.rows
