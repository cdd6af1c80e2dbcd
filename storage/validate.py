"""Re-check a store: every committed shard exists, matches its checksum, has the declared schema,
and holds the same ids in the same order as the `texts` shard it is aligned with; what every reader checks on
open (`soundness`: row plan, tables, dims, footers) and the content checks that read every value (ids are unique
content hashes of their texts, vectors finite and in range, vocab outputs of the teacher's width).

Returns a list of problems (empty when the store is sound); each names the file it is about.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from kd.common.errors import StoreError
from kd.storage import fs
from kd.storage.alignment import ids_digest
from kd.storage.index_files import is_stale, list_indexes, load_index, rebuild_fix
from kd.storage.manifest import teacher_table
from kd.storage.names import links_out
from kd.storage.repair import describe, repair
from kd.storage.soundness import (
    id_problems,
    manifest_problems,
    recorded_file_problem,
    sampled,
    shard_problems,
    values_problems,
)
from kd.storage.store import LOCKS, Store
from kd.storage.validate_config import ValidateConfig


@dataclass(frozen=True)
class Problem:
    file: str
    what: str
    repairable: bool = True  # whether `kd validate --repair` (and a rerun of precompute) fixes it

    def __str__(self) -> str:
        return f"{self.file}: {self.what}"


def validate(store: Store, links: list[tuple[str, str]] | None = None) -> list[Problem]:
    """Every problem of the store (empty: sound). A stale index is not one (`stale_indexes`). `links`: the store's
    links out (`store_links`), where the caller walked the store for them already."""
    m = store.manifest
    missing = []
    for name in _tables(store):
        count, first = m.tables[name].missing(m.num_shards)
        if count:
            missing.append(Problem(store.loc.path(name), f"{count} shard(s) missing: {first}"))
    plan = [Problem(store.loc.path("manifest.json"), what) for what in manifest_problems(m)]
    found = plan + missing + content_problems(store) + _check_teacher_files(store) + _check_indexes(store)
    named = {p.file for p in found}  # a linked shard is already reported as one
    return found + [p for p in _check_links(store, links) if p.file not in named]


def content_problems(store: Store) -> list[Problem]:
    """What validate finds in the store's committed content (what every reader refuses,
    `soundness.require_sound_content`): each shard's bytes, footer, values and ids, the texts' ids, the files the
    manifest records. Not what a reader can do without: a missing shard, a stale index."""
    problems: list[Problem] = []
    text_ids: dict[int, pa.Array] = {}
    texts: dict[int, pa.Table] = {}  # the texts shards read whole, for the content-hash check
    for name in _tables(store):
        rec = store.manifest.tables[name]
        for k, shard in sorted(rec.shards.items()):
            problems += _check_shard(store, name, k, shard, rec.columns, text_ids, texts)
    return problems + _check_ids(store, texts) + _check_files(store)


def _tables(store: Store) -> list[str]:
    """The store's tables, texts first (every other table's ids are compared with its)."""
    names = store.manifest.tables
    return [n for n in ("texts",) if n in names] + sorted(n for n in names if n != "texts")


def _check_ids(store: Store, texts: dict[int, pa.Table]) -> list[Problem]:
    """Every texts id once, and the content hash of its text (that when every texts shard could be read)."""
    m = store.manifest
    if "texts" not in m.tables:
        return []
    every = sorted(texts) == list(range(m.num_shards))
    return [Problem(store.loc.path(m.tables["texts"].shards[k].file), what, repairable=False)
            for k, what in id_problems(texts, m.pairs, sampled(m), hashes=every)]


def _check_files(store: Store) -> list[Problem]:
    """Tokenizer and embedding files whose sha256 the manifest records; a vocab output of the wrong shape."""
    out = []
    for rel in sorted(store.manifest.extras.get("files", {})):
        try:
            why = recorded_file_problem(store, rel, store.read_recorded(rel))  # read once: checksum, NaN, shape
        except StoreError as e:
            out.append(Problem(e.where or rel, e.what))
            continue
        out += [Problem(store.loc.path(rel), why)] if why else []
    return out


def _check_teacher_files(store: Store) -> list[Problem]:
    """The tokenizer folder and input-embedding file each teacher's table names (its meta) are present:
    `--repair` sets a damaged one aside, and training needs them back before it can start."""
    out = []
    for name in map(teacher_table, sorted(store.manifest.teachers())):
        rec = store.manifest.tables[name]
        for what in ("tokenizer", "input_embeddings"):
            rel = rec.meta.get(what)
            if rel and not fs.exists(store.loc, *rel.split("/")):
                out.append(Problem(store.loc.path(rel), f"the {what.replace('_', ' ')} of {name} is missing: re-run "
                                                        "the kd precompute command that wrote it (it restores it)"))
    return out


def store_links(store: Store) -> list[tuple[str, str]]:
    """(path in the store, target) of every symlink leading out of a local store: one walk (`names.links_out`)."""
    return list(links_out(store.root)) if store.loc.is_local else []


def _check_links(store: Store, links: list[tuple[str, str]] | None = None) -> list[Problem]:
    """Symlinks leading out of the store (a local one), wherever they are, but in `locks/` (`lock_links`): readers
    refuse such a record or shard, writers never write through one, --repair sets the link aside."""
    return [Problem(store.loc.path(rel), f"a symlink leading out of the store (to {target})")
            for rel, target in (store_links(store) if links is None else links) if not _in_locks(rel)]


def lock_links(store: Store, links: list[tuple[str, str]] | None = None) -> list[Problem]:
    """`locks/` (or a lock in it) linked out of the store, e.g. to /dev/null: no reader takes a lock, so every reader
    accepts the store, and validate notes it without failing; every writer refuses it in its own words, and
    --repair removes the link (the fourth probe's writers failed on it in Python's words; the fifth saw validate
    refuse what the readers accepted)."""
    return [Problem(store.loc.path(rel), f"a symlink leading out of the store (to {target}): writers refuse it; "
                    f"`kd validate {store.root} --repair` removes it")
            for rel, target in (store_links(store) if links is None else links) if _in_locks(rel)]


def _in_locks(rel: str) -> bool:
    return rel == LOCKS or rel.startswith(LOCKS + "/")


def _check_indexes(store: Store) -> list[Problem]:
    """Every faiss index the manifest lists and its table still holds: files present, checksums, row counts."""
    out = []
    for info in list_indexes(store):
        if is_stale(store, info):
            continue
        try:
            load_index(store, info)
        except StoreError as e:
            out.append(Problem(e.where or store.loc.path(info.file), e.what))
    return out


def _check_shard(store: Store, name: str, k: int, shard, columns: dict[str, str], text_ids,
                 texts: dict[int, pa.Table]) -> list[Problem]:
    path = store.loc.path(shard.file)
    try:
        store.path_of(shard.file, f"tables.{name}.shards.{k}.file")  # a symlink out of the store: never read
    except StoreError as e:
        return [Problem(path, e.what)]
    if not fs.exists(store.loc, shard.file):
        return [Problem(path, "file is missing")]
    try:
        data = store.read_verified(shard)
    except StoreError as e:
        return [Problem(path, e.what)]
    try:
        footer = pq.read_metadata(pa.BufferReader(data))
        schema = footer.schema.to_arrow_schema()
        out = [Problem(path, what) for what in shard_problems(schema, footer.num_rows, shard.rows, columns)]
        if len(set(schema.names)) < len(schema.names):
            return out  # a column named twice: no reader can pick one of them by name
        table = pq.ParquetFile(pa.BufferReader(data)).read()  # (pq.read_table imports pyarrow.dataset: 1.5 s)
    except (pa.ArrowException, OSError) as e:
        return [Problem(path, f"unreadable parquet: {e}")]
    if name == "texts" and not out:
        texts[k] = table
    out += [Problem(path, what) for what in values_problems(name, table)]
    if "id" in table.column_names:
        why = _ids_problem(store, name, k, shard, table["id"].combine_chunks(), text_ids)
        out += [Problem(path, why)] if why else []
    if not out:
        store.mark_verified(shard)  # a reader's own checksum pass (`Store.verify_files`) would repeat this one
    return out


def _ids_problem(store: Store, name: str, k: int, shard, ids: pa.Array, text_ids: dict[int, pa.Array]) -> str | None:
    """Why shard k's ids are not the ones it must hold, or None: texts shard k's ids (its file's, or the digest
    its record holds when that file is unreadable), and the digest its own record holds (alignment.py)."""
    digest = ids_digest(ids)
    if name == "texts":
        text_ids[k] = ids
        if shard.ids not in (None, digest):
            return "ids are not those the store's tables were written for (a texts file from another store?)"
        return None
    texts = store.manifest.tables.get("texts")
    want = texts.shards[k].ids if texts is not None and k in texts.shards else None
    if (k in text_ids and not ids.equals(text_ids[k])) or (k not in text_ids and want not in (None, digest)):
        return f"ids are not aligned with texts shard {k}"
    if shard.ids not in (None, digest):
        return "ids do not match the digest the manifest records for them"
    return None


def stale_indexes(store: Store) -> list[Problem]:
    """Indexes built before their table was rewritten or grown: the store's data is sound and only `kd search`
    needs the index, which it refuses with this fix; validate notes them without failing (every reader of the
    data accepts such a store, so validate does too)."""
    return [Problem(store.loc.path(info.file), f"index {info.name} is stale (table {info.table!r} changed after it "
                    f"was built): {rebuild_fix(store, info)}") for info in list_indexes(store) if is_stale(store, info)]


@dataclass(frozen=True)
class Validation:
    """What `kd validate` found: the store's problems (none: sound), what --repair did first, and notes on what
    is sound but out of date or refused by writers only (stale indexes, a lock folder linked out)."""

    store: Store
    problems: list[Problem]
    repaired: list[str]  # storage.repair.describe's lines; empty without --repair
    notes: list[Problem]


def validate_store(cfg: ValidateConfig) -> Validation:
    """`kd validate`: repair first when asked (storage.repair), then re-check every shard (`check`)."""
    repaired = []
    if cfg.repair:
        repaired = describe(repair(cfg.store))
    store = _open(cfg.store)
    links = store_links(store)  # one walk of the store for both: links out are problems, a linked locks/ a note
    return Validation(store, validate(store, links), repaired, stale_indexes(store) + lock_links(store, links))


def _open(store_path: str) -> Store:
    return Store.open(store_path, sound=False)  # validate reports a damaged manifest, problem by problem


def check(store_path: str) -> tuple[Store, list[Problem]]:
    store = _open(store_path)
    return store, validate(store)
