"""Row alignment: shard k of every table holds the ids of `texts` shard k, in the same order.

A checksum proves that a file is the one the manifest records, not that its rows are this store's: a shard copied
in from another store with its `sha256`/`bytes` fixed by hand passes it, and readers would pair texts with other
rows' vectors. So each shard's `id` column is digested at commit (`ids_digest`, recorded as `ShardRecord.ids`), and
every reader compares the ids it actually read with the digest of texts shard k (`Store.read_checked`).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kd.common.errors import StoreError

ID = "id"


def ids_digest(ids: pa.Array | pa.ChunkedArray | np.ndarray) -> str:
    """blake2b-128 of the ids as little-endian int64 bytes: equal exactly when the ids and their order are."""
    if isinstance(ids, pa.ChunkedArray | pa.Array):  # a null (kd writes none: validate says so) hashes as 0
        arr = ids.fill_null(0).to_numpy() if ids.null_count else ids.to_numpy()
    else:
        arr = ids
    return hashlib.blake2b(np.ascontiguousarray(arr, dtype="<i8").tobytes(), digest_size=16).hexdigest()


def table_digest(table: pa.Table) -> str | None:
    """The ids digest of a table about to be committed; None for a table without an `id` column."""
    return ids_digest(table.column(ID)) if ID in table.column_names else None


def shard_digest(data: pa.Buffer | bytes) -> str | None:
    """The ids digest of a shard's Parquet bytes, reading only its `id` column (never its vectors)."""
    pf = pq.ParquetFile(pa.BufferReader(data))
    if ID not in pf.schema_arrow.names:
        return None
    return ids_digest(pf.read(columns=[ID]).column(ID))


def misaligned(name: str, k: int, path: str, root: str) -> StoreError:
    """The error every reader raises for a shard whose ids are not those of texts shard k."""
    what = (f"shard {k} of table {name!r} is not aligned with texts: its ids are not those of texts shard {k} "
            "(a file from another store or run whose checksums were changed in the manifest?)")
    if name == "texts":
        what = (f"texts shard {k} holds other ids than the ones this store's tables were written for (a file from "
                "another store or run whose checksums were changed in the manifest?)")
    return StoreError(what, path, f"run `kd validate {root} --repair` (it drops the shard), then re-run the kd "
                                  "command that wrote the table (kd precompute for texts and teachers): it "
                                  "rewrites that shard")
