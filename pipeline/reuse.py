"""`kd precompute --reuse OLD`: rows another store already holds are copied from it, not encoded again,
so a corpus that grows costs the teacher only its new rows.

- which rows: ids are content hashes (common/ids.py: the same text has the same id in every store), so a row
  of this store is in OLD when OLD's `teachers/<name>` table holds its id;
- which teachers: those OLD holds with the same settings (`same_settings`: the weights' sha256, precision,
  backend, max length, pooling, stored dtype...) and at least the outputs asked for. OLD holding one with
  other settings is refused (its vectors are not what this run computes); a teacher OLD lacks is encoded in
  full;
- how: OLD's id columns are read once into a sorted index (id -> shard, row). A shard to write takes its
  known rows from OLD's shards (each file's checksum verified when read; the last few kept in memory, since
  a grown corpus mostly keeps its order), encodes only the others, and restores the shard's row order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from kd.common.errors import InputError, StoreError
from kd.common.finite import OUT_OF_RANGE, unusable_rows
from kd.storage.alignment import ids_digest
from kd.storage.int8 import is_scale_column
from kd.storage.manifest import comparable
from kd.storage.schema import concat_shards, table_vectors, vector_shape
from kd.storage.soundness import require_sound_content
from kd.storage.store import Store

CACHED_SHARDS = 8  # OLD shards kept decoded: a grown corpus in its old order reads each one about once


@dataclass
class ReuseSource:
    """Teacher `teacher`'s rows in store `store`: where each id is, and the shards last read."""

    store: Store
    teacher: str
    ids: np.ndarray  # sorted
    shard: np.ndarray  # the OLD shard of ids[i]
    row: np.ndarray  # its row in that shard
    cache: OrderedDict[int, pa.Table] = field(default_factory=OrderedDict)

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Index into `self.ids` of each of `ids`, -1 where OLD lacks it."""
        if not len(self.ids):
            return np.full(len(ids), -1)
        pos = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return np.where(self.ids[pos] == ids, pos, -1)

    def new_rows(self, shard: pa.Table) -> np.ndarray:
        """Positions of the rows of texts `shard` that OLD lacks (the rows to encode), in order."""
        return np.nonzero(self.find(shard["id"].to_numpy()) < 0)[0]

    def take(self, pos: np.ndarray, columns: list[str]) -> pa.Table:
        """OLD's rows `pos` (indices into `self.ids`), in that order, with `columns`."""
        parts, order, shards = [], [], self.shard[pos]
        for k in np.unique(shards):
            sel = np.nonzero(shards == k)[0]
            parts.append(self._shard(int(k)).select(columns).take(pa.array(self.row[pos[sel]])))
            order.append(sel)
        table = concat_shards(parts)
        return table.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))

    def _shard(self, k: int) -> pa.Table:
        if k in self.cache:
            self.cache.move_to_end(k)
        else:
            self.cache[k] = self.store.read_shard(f"teachers/{self.teacher}", k)  # checksum verified
            while len(self.cache) > CACHED_SHARDS:
                self.cache.popitem(last=False)
        return self.cache[k]


def open_sources(uri: str, metas: dict[str, dict]) -> dict[str, ReuseSource]:
    """{teacher name: its rows in store `uri`} for each teacher of `metas` (name -> this run's table meta)
    that the store holds with the same settings; an InputError for one it holds with other settings."""
    store = Store.open(uri)
    try:  # rows copied from it become this store's: refused where kd validate refuses it
        require_sound_content(store)
    except StoreError as e:
        raise StoreError(f"--reuse: {e.what}", e.where, f"{e.fix}; or drop --reuse") from None
    sources = {}
    for name, meta in metas.items():
        rec = store.manifest.tables.get(f"teachers/{name}")
        if rec is None:
            continue
        old = rec.meta or {}
        missing = [o for o in meta["outputs"] if o not in old.get("outputs", [])]
        differ = _differences(old, meta)
        if missing or differ:
            why = f"it lacks output(s) {', '.join(missing)}" if missing else differ
            raise InputError(f"--reuse: the store holds teacher {name!r} with other settings ({why}), so its "
                             "vectors are not what this run computes", uri,
                             "run with the settings that store was made with (kd info shows them), or drop --reuse")
        sources[name] = _table_index(store, name)
    return sources


def _differences(old: dict, new: dict) -> str:
    """The settings (outputs aside: OLD may hold more) in which two table metas differ, as one line."""
    a, b = comparable(old, new)
    keys = sorted(k for k in set(a) | set(b) if k != "outputs" and a.get(k) != b.get(k))
    return "; ".join(f"{k}: {a.get(k)!r} there, {b.get(k)!r} here" for k in keys[:3])


def _table_index(store: Store, name: str) -> ReuseSource:
    """The sorted id index of `store`'s table `teachers/<name>` (only its complete shards); its settings are not
    checked here (open_sources checks them)."""
    ids, shard, row = [], [], []
    for k in sorted(store.table(f"teachers/{name}").shards):
        store.check_schema(f"teachers/{name}", k)  # a shard of other types: refused before anything is written
        col = store.read_shard(f"teachers/{name}", k, ["id"], verify=False)["id"].to_numpy()
        store.check_aligned(f"teachers/{name}", k, ids_digest(col))  # a foreign shard: refused before any encoding
        ids.append(col)
        shard.append(np.full(len(col), k, dtype=np.int32))
        row.append(np.arange(len(col), dtype=np.int64))
    if not ids:
        return ReuseSource(store, name, np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64))
    ids_all = np.concatenate(ids)
    order = np.argsort(ids_all, kind="stable")
    return ReuseSource(store, name, ids_all[order], np.concatenate(shard)[order], np.concatenate(row)[order])


def encode_reusing(source: ReuseSource, shard: pa.Table, columns: list[str],
                   encode: Callable[[pa.Table], tuple[pa.Table, int]]) -> tuple[pa.Table, int, int]:
    """Teacher table of texts `shard`: OLD's rows where it has them, `encode(rows)` for the others, in the
    shard's order; (table, rows truncated, rows reused)."""
    pos = source.find(shard["id"].to_numpy())
    known = pos >= 0
    parts, where, truncated = [], [], 0
    if not known.all():
        new_rows = np.nonzero(~known)[0]
        table, truncated = encode(shard.take(pa.array(new_rows)))
        parts.append(table.select(columns))
        where.append(new_rows)
    if known.any():
        old = source.take(pos[known], columns)
        refuse_non_finite_rows(source, old)
        truncated += int(np.asarray(old["truncated"]).sum())
        parts.append(old.cast(parts[0].schema) if parts else old)  # (Parquet's field names -> the fresh table's)
        where.append(np.nonzero(known)[0])
    table = pa.concat_tables(parts)
    return table.take(pa.array(np.argsort(np.concatenate(where), kind="stable"))), truncated, int(known.sum())


def refuse_non_finite_rows(source: ReuseSource, rows: pa.Table) -> None:
    """Refuse to copy NaN/Inf vectors from the --reuse store (an older kd, another writer): precompute never
    commits them when it encodes, and a copied row must meet the same bar."""
    for c in rows.column_names:
        if not vector_shape(rows.schema.field(c).type) or is_scale_column(c):
            continue  # (a scale column is checked with its vectors by table_vectors)
        where = f"{source.store.root} (teachers/{source.teacher}, column {c!r})"
        bad = unusable_rows(table_vectors(rows, c, where))
        if len(bad):
            raise StoreError(f"--reuse: the store holds {len(bad)} {c!r} vector(s) holding {OUT_OF_RANGE} of teacher "
                             f"{source.teacher!r}, first at row id {rows['id'][int(bad[0])].as_py()}; nothing of "
                             "this shard was committed", where,
                             f"run kd validate {source.store.root} --repair (it drops the bad shards), or drop "
                             "--reuse; the rows committed here are kept and a rerun resumes")
