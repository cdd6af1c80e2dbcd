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
from kd.common.finite import OUT_OF_RANGE
from kd.storage import fs
from kd.storage.alignment import ids_digest
from kd.storage.index_files import list_indexes, load_index
from kd.storage.manifest import teacher_table
from kd.storage.schema import is_int8, non_finite_columns, table_vectors
from kd.storage.soundness import id_problems, manifest_problems, shard_problems, vocab_problem
from kd.storage.store import Store


@dataclass(frozen=True)
class Problem:
    file: str
    what: str

    def __str__(self) -> str:
        return f"{self.file}: {self.what}"


def validate(store: Store) -> list[Problem]:
    problems: list[Problem] = []
    m = store.manifest
    text_ids: dict[int, pa.Array] = {}
    texts: dict[int, pa.Table] = {}  # the texts shards read whole, for the content-hash check
    for name in [n for n in ("texts",) if n in m.tables] + sorted(n for n in m.tables if n != "texts"):
        rec = m.tables[name]
        count, first = rec.missing(m.num_shards)
        if count:
            problems.append(Problem(store.loc.path(name), f"{count} shard(s) missing: {first}"))
        for k, shard in sorted(rec.shards.items()):
            problems += _check_shard(store, name, k, shard, rec.columns, text_ids, texts)
    plan = [Problem(store.loc.path("manifest.json"), what) for what in manifest_problems(m)]
    return (plan + problems + _check_ids(store, texts) + _check_files(store) + _check_teacher_files(store)
            + _check_indexes(store))


def _check_ids(store: Store, texts: dict[int, pa.Table]) -> list[Problem]:
    """Every texts id once, and the content hash of its text (checked when every texts shard could be read)."""
    m = store.manifest
    if sorted(texts) != list(range(m.num_shards)):
        return []
    sampled = bool((m.inputs.get("options") or {}).get("sample")) or bool((m.inputs.get("counts") or {})
                                                                           .get("sampled_out"))
    return [Problem(store.loc.path(m.tables["texts"].shards[k].file), what)
            for k, what in id_problems([texts[k] for k in sorted(texts)], m.pairs, sampled)]


def _check_files(store: Store) -> list[Problem]:
    """Tokenizer and embedding files whose sha256 the manifest records; a vocab output of the wrong shape."""
    out = []
    for rel in sorted(store.manifest.extras.get("files", {})):
        try:
            store.verify_folder(*rel.split("/"))
            why = vocab_shape_problem(store, rel)
        except StoreError as e:
            out.append(Problem(e.where or rel, e.what))
            continue
        out += [Problem(store.loc.path(rel), why)] if why else []
    return out


def vocab_shape_problem(store: Store, rel: str) -> str | None:
    """What is wrong with the shape of the vocab output at `rel` (None: sound, or not a vocab output)."""
    parts = rel.split("/")
    if len(parts) != 3 or parts[0] != "teachers" or parts[2] != "vocab.safetensors":
        return None
    from safetensors.numpy import load

    rec = store.manifest.tables.get(teacher_table(parts[1]))
    return vocab_problem(load(store.read_recorded(rel)), rec.meta.get("dim") if rec is not None else None)


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


def _check_indexes(store: Store) -> list[Problem]:
    """Every faiss index the manifest lists: files present, checksums, row counts, not stale."""
    out = []
    for info in list_indexes(store):
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
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as e:
        return [Problem(path, f"unreadable parquet: {e}")]
    out = [Problem(path, what) for what in shard_problems(table.schema, table.num_rows, shard.rows, columns)]
    if name == "texts" and not out:
        texts[k] = table
    out += _non_finite(table, path) + _bad_scales(table, path)
    if "id" in table.column_names:
        why = _ids_problem(store, name, k, shard, table["id"].combine_chunks(), text_ids)
        out += [Problem(path, why)] if why else []
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


def _bad_scales(table: pa.Table, path: str) -> list[Problem]:
    """int8 columns whose scale column is missing, non-finite or negative (what the readers refuse)."""
    out = []
    for f in table.schema:
        if is_int8(f.type):
            try:
                table_vectors(table, f.name, path)
            except StoreError as e:
                out.append(Problem(path, e.what))
    return out


def _non_finite(table: pa.Table, path: str) -> list[Problem]:
    return [Problem(path, f"column {c!r} has {OUT_OF_RANGE} in {n} row(s), first ids {ids}")
            for c, n, ids in non_finite_columns(table)]


def check(store_path: str) -> tuple[Store, list[Problem]]:
    try:
        store = Store.open(store_path, sound=False)  # validate reports a damaged manifest, problem by problem
    except StoreError:
        raise
    return store, validate(store)
