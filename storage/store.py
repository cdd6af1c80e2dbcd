"""A store on disk: open it, read its shards, and commit new ones.

Layout (see docs/store-format.md):
    manifest.json                      merged commit record
    manifests/<writer>.json            per-writer commit records (merged on read)
    texts/part-00000.parquet           the inputs, one row per text (or pair)
    teachers/<name>/part-00000.parquet one aligned table per teacher
    students/<name>/part-00000.parquet one aligned table per embedded student
    tokenizers/<name>/                 the teacher's tokenizer files (no weights)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from kd.common.errors import StoreError
from kd.storage import fs
from kd.storage.alignment import misaligned, shard_digest, table_digest
from kd.storage.manifest import (
    Manifest,
    ShardRecord,
    TableRecord,
    check_plan_sound,
    merge,
    plan_problems,
    same_settings,
)
from kd.storage.schema import concat_shards, tensors_problem
from kd.storage.soundness import require_sound_content, require_sound_manifest, shard_problems
from kd.storage.tokenizer_files import load_tokenizer

if TYPE_CHECKING:  # imported where used: pyarrow.dataset (and pandas with it) costs ~0.3 s, writers never need it
    import pyarrow.dataset as ds

MANIFEST = "manifest.json"
REPAIR = "run `kd validate STORE --repair` to drop the damaged shards, then re-run the command that wrote them"


def file_repair(root: str) -> str:
    """The fix for a damaged per-teacher file (tokenizer, input embeddings, vocab, init) of the store at `root`."""
    return (f"run `kd validate {root} --repair` (it sets the file aside), then re-run the kd precompute command "
            "that wrote the store: it writes the file again")
FRAGMENTS = "manifests"
LOCKS = "locks"
# What a store holds while its first writers start: locks, fragments (maybe only a temp file yet), tables
BEING_CREATED = {LOCKS, FRAGMENTS, "texts", "teachers", "tokenizers"}
# the folders of a store's content (beside them: LOCKS, each table's folder, each teacher's tokenizer folder)
STORE_FOLDERS = ("texts", "teachers", "students", "derived", FRAGMENTS, "tokenizers", "indexes")


def shard_file(table: str, k: int) -> str:
    return f"{table}/part-{k:05d}.parquet"


def load_manifest(loc: fs.Location, main: bool = True) -> Manifest | None:
    """Merged manifest of a store (`main=False`: of its fragments alone), or None when there is none."""
    found = []
    if main and fs.exists(loc, MANIFEST):
        found.append(_record(loc, MANIFEST))
    for name in fs.list_files(loc, FRAGMENTS):
        if name.endswith(".json"):
            found.append(_record(loc, f"{FRAGMENTS}/{name}"))
    merged = merge(found, loc.root) if found else None
    if merged is not None:
        _refuse_files_at_folders(loc, merged)
    return merged


def _refuse_files_at_folders(loc: fs.Location, m: Manifest) -> None:
    """A file where the store keeps a folder (texts/, a teacher's table, its tokenizer) is named with its fix, by every
    reader and writer: kd distill planned and recorded its steps, then failed training on "cannot read a committed
    file", whose fix (`kd validate --repair`) dropped the table for good (a probe)."""
    rels = [*STORE_FOLDERS, LOCKS, *m.tables, *(f"tokenizers/{t}" for t in m.teachers())]
    for rel, info in zip(rels, loc.fs.get_file_info([loc.path(*r.split("/")) for r in rels]), strict=True):
        if info.type == fs.pafs.FileType.File:
            raise fs.file_at_folder(rel, info.path)


def _record(loc: fs.Location, rel: str) -> Manifest:
    """manifest.json or a fragment, refused when it is a symlink leading out of the store (`fs.member`): readers
    read another store's record through it while every writer refused to write there (issue 48's probe);
    `kd validate --repair` writes manifest.json again from the fragments."""
    try:
        fs.member(loc, rel, loc.path(rel), rel)
    except StoreError as e:
        raise StoreError(e.what, e.where, f"run `kd validate {loc.root} --repair` (it writes the record again from "
                         "the store's other records), or replace the link by the file itself") from None
    return Manifest.from_json(fs.read_bytes(loc, *rel.split("/")), loc.path(rel))


def readable_manifest(loc: fs.Location, overwrite: bool) -> Manifest | None:
    """The store's merged manifest (None: no store). A record that cannot be read is refused, unless
    `overwrite`: then the store is to be replaced anyway, so it counts as none."""
    try:
        return load_manifest(loc) if fs.exists(loc) else None
    except StoreError:
        if not overwrite:
            raise
        return None


@dataclass
class Store:
    """Read access to a store (the merged view of all committed shards)."""

    loc: fs.Location
    manifest: Manifest
    _verified: set[tuple[str, str]] = field(default_factory=set, repr=False)
    _texts_ids: dict[int, str] = field(default_factory=dict, repr=False)  # ids digests computed from texts files

    @classmethod
    def open(cls, uri: str | os.PathLike, sound: bool = True, content: bool = False) -> Store:
        """The store at `uri`; its manifest is refused unless sound (`soundness.manifest_problems`: the row plan,
        the texts table, dims), so no reader runs on what `kd validate` refuses. `content`: its committed content
        too (`soundness.require_sound_content`: values, ids, recorded files; once per store state), for readers
        of its rows. `sound=False`: opened to be reported on (`kd validate`, `kd info`), whatever its state."""
        loc = fs.resolve(uri)
        m = load_manifest(loc)
        if m is None:
            raise StoreError(
                "no kd store here (no manifest.json)", loc.root, "create one with: kd precompute INPUT --out STORE"
            )
        if sound:
            require_sound_manifest(loc, m)
        store = cls(loc, m)
        if content:
            require_sound_content(store)
        return store

    @property
    def root(self) -> str:
        return self.loc.root

    def table(self, name: str) -> TableRecord:
        rec = self.manifest.tables.get(name)
        if rec is None:
            have = ", ".join(sorted(self.manifest.tables)) or "none"
            raise StoreError(f"the store has no table {name!r} (tables: {have})", self.root)
        return rec

    def require_complete(self, name: str) -> TableRecord:
        rec = self.table(name)
        count, first = rec.missing(self.manifest.num_shards, 1)
        if count:
            raise StoreError(
                f"table {name!r} is incomplete: {count} of {self.manifest.num_shards} shards missing "
                f"(first: {first[0]})",
                self.root,
                "re-run the kd precompute command that writes it; it resumes where it stopped",
            )
        return rec

    def shard_record(self, name: str, k: int) -> ShardRecord:
        rec = self.table(name).shards.get(k)
        if rec is None:
            raise StoreError(f"shard {k} of table {name!r} is not committed", self.root)
        return rec

    def path_of(self, rel: str, field: str = "file") -> str:
        """The path of a store-relative path the manifest records (in `field`), refused with a StoreError when
        it leads out of the store ('..', an absolute path, a symlink pointing elsewhere): see `fs.member`."""
        try:
            return fs.member(self.loc, rel, self.loc.path(MANIFEST), field)
        except StoreError as e:  # the store's own fix: --repair drops the record and sets such a link aside
            raise StoreError(e.what, e.where, f"replace the symlink by the file itself, or {file_repair(self.root)}") \
                from None

    def read_verified(self, rec: ShardRecord) -> pa.Buffer:
        """A committed file's bytes; a size or sha256 other than the manifest's is refused.

        Every reader goes through here (or `verify_files`), so a flipped byte, a truncated or swapped file
        is an error naming the file, never a different answer. The file's size is compared before reading, and
        no more than the manifest's size (+1 byte) is read, so a swapped-in huge file never reaches memory.

        The bytes are Arrow's memory, not a Python `bytes`: Parquet decodes them on Arrow's threads, which may
        drop the last reference just after the read returns; a Python-owned buffer then needs the GIL to be
        freed, and a process already exiting aborts there ("terminate called without an active exception",
        SIGABRT, seen once in ~40 `kd validate` runs on a loaded machine).
        """
        path = self.path_of(rec.file)
        try:
            size = self.loc.fs.get_file_info(path).size
            if size is not None and size != rec.bytes:
                raise StoreError(f"file does not match its checksum in the manifest ({size} bytes, manifest says "
                                 f"{rec.bytes}): corrupt or modified", path, REPAIR)
            with self.loc.fs.open_input_stream(path) as f:
                data, longer = f.read_buffer(rec.bytes), len(f.read(1)) > 0
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"cannot read a committed file ({e})", path, REPAIR) from e
        if longer or len(data) != rec.bytes or hashlib.sha256(data).hexdigest() != rec.sha256:
            raise StoreError(
                f"file does not match its checksum in the manifest ({'more than ' if longer else ''}{len(data)} "
                f"bytes, manifest says {rec.bytes}): corrupt or modified", path, REPAIR)
        return data

    def read_checked(self, name: str, k: int) -> pa.Buffer:
        """Shard k of a table, its bytes checked against the manifest (`read_verified`) and its ids against
        texts shard k's (`check_aligned`): what every reader of a table's rows goes through."""
        data = self.read_verified(self.shard_record(name, k))
        self.check_schema(name, k, data)
        self.check_aligned(name, k, shard_digest(data))
        return data

    def check_schema(self, name: str, k: int, data: pa.Buffer | None = None) -> None:
        """Refuse shard k whose bytes are not Parquet, or whose footer disagrees with its record and its table's
        declared columns (`soundness.shard_problems`: row count, a column missing, of another type or undeclared):
        a file swapped in with its checksum forged to match. Readers would fail on it deep inside numpy or
        DuckDB, or read other numbers. `data`: its bytes, already read (None: its footer is read from the file)."""
        rec = self.shard_record(name, k)
        path = self.loc.path(rec.file)
        try:
            with (contextlib.nullcontext(pa.BufferReader(data)) if data is not None
                  else self.loc.fs.open_input_file(self.path_of(rec.file))) as f:
                footer = pq.read_metadata(f)
                schema = footer.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"not a readable Parquet file ({' '.join(str(e).split())[:200]})", path, REPAIR) from e
        problems = shard_problems(schema, footer.num_rows, rec.rows, self.table(name).columns)
        if problems:
            raise StoreError(problems[0], path, REPAIR)

    def check_aligned(self, name: str, k: int, digest: str | None) -> None:
        """Refuse shard k of table `name` whose ids (`digest`: of the ids read) are not those of texts shard k.

        The reference is the digest texts shard k recorded at commit; texts shard k itself is held to it too (a
        texts file swapped in would pair every table with other texts). Without a recorded one (stores written
        before digests were), texts shard k's id column is read once per Store, and a table without a texts
        shard k is held to its own record's digest."""
        rec = self.shard_record(name, k)
        if name != "texts":
            want = self.texts_digest(k) or rec.ids
        else:
            want = rec.ids
            if want is None and digest is not None:
                self._texts_ids[k] = digest  # read anyway: spares the tables a second read of this file
        if want is not None and digest is not None and digest != want:
            raise misaligned(name, k, self.loc.path(rec.file), self.root)

    def texts_digest(self, k: int) -> str | None:
        """The ids digest of texts shard k (None when it is not committed): recorded at commit, else computed
        from its file once per Store."""
        texts = self.manifest.tables.get("texts")
        rec = texts.shards.get(k) if texts is not None else None
        if rec is None or rec.ids is not None:
            return rec.ids if rec is not None else None
        if k not in self._texts_ids:
            self._texts_ids[k] = shard_digest(self.read_verified(rec))
        return self._texts_ids[k]

    def verify_files(self, name: str) -> list[str]:
        """Check every committed shard of a table against the manifest (once per Store); returns their paths.

        For readers that open the files themselves (DuckDB, pyarrow datasets); checked once per opened
        Store, since a dataset is re-created for every lookup.
        """
        rec = self.table(name)
        for k in sorted(rec.shards):
            if (rec.shards[k].file, rec.shards[k].sha256) not in self._verified:
                self.read_checked(name, k)
                self._verified.add((rec.shards[k].file, rec.shards[k].sha256))
        return [self.path_of(rec.shards[k].file) for k in sorted(rec.shards)]

    def mark_verified(self, rec: ShardRecord) -> None:
        """Record a shard whose bytes, footer and ids were just checked (`soundness.require_sound_content`), so that
        `verify_files` does not read it again."""
        self._verified.add((rec.file, rec.sha256))

    def verify_folder(self, *parts: str) -> None:
        """Check the files under a folder (or one file) against the sha256 the manifest records for them.

        - Stores written before checksums were recorded for these files pass unchecked.
        - Each file is checked once per opened Store (as shards are in `verify_files`): set-up and the data
          stream of one training run ask for the same tokenizer folder.
        """
        known = self.manifest.extras.get("files", {})
        prefix = "/".join(parts)
        for rel, sha in sorted(known.items()):
            if (rel == prefix or rel.startswith(prefix + "/")) and (rel, sha) not in self._verified:
                self.read_recorded(rel)

    def read_recorded(self, rel: str) -> bytes:
        """A file of the store outside the tables (tokenizer, input embeddings, vocab and init outputs), read
        once: its bytes, checked against the sha256 `extras.files` records for it (unchecked when none is); a
        safetensors file also for NaN/Inf (`tensors_problem`)."""
        sha = self.manifest.extras.get("files", {}).get(rel)
        try:
            self.path_of(rel, "extras.files")
            data = fs.read_bytes(self.loc, rel)
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"a file the manifest records is missing or unreadable ({e})", self.loc.path(rel),
                             file_repair(self.root)) from e
        if sha is not None and fs.sha256(data) != sha:
            raise StoreError("file does not match its checksum in the manifest (corrupt or modified)",
                             self.loc.path(rel), file_repair(self.root))
        why = tensors_problem(data) if rel.endswith(".safetensors") else None
        if why:
            raise StoreError(why, self.loc.path(rel), file_repair(self.root))
        if sha is not None:
            self._verified.add((rel, sha))
        return data

    def read_shard(self, name: str, k: int, columns: list[str] | None = None, verify: bool = True) -> pa.Table:
        """One shard of a table, its bytes checked against the manifest's sha256 and its ids against texts shard
        k (`read_checked`) unless `verify=False`."""
        rec = self.shard_record(name, k)
        path = self.path_of(rec.file)
        try:
            if verify:
                return pq.read_table(pa.BufferReader(self.read_checked(name, k)), columns=columns)
            fs.require_regular(self.loc, path)
            return pq.read_table(path, columns=columns, filesystem=self.loc.fs)
        except StoreError:
            raise
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"cannot read shard ({e})", path, REPAIR) from e

    def read_table(self, name: str, columns: list[str] | None = None, verify: bool = True) -> pa.Table:
        rec = self.require_complete(name)
        return concat_shards([self.read_shard(name, k, columns, verify) for k in sorted(rec.shards)])

    def dataset(self, name: str, verify: bool = True) -> ds.Dataset:
        """A pyarrow dataset over the committed shards (all verified first unless `verify=False`)."""
        import pyarrow.dataset as ds

        rec = self.require_complete(name)
        files = self.verify_files(name) if verify else [self.path_of(rec.shards[k].file) for k in sorted(rec.shards)]
        return ds.dataset(files, format="parquet", filesystem=self.loc.fs)

    def local_dir(self, *parts: str) -> str:
        return self.loc.local_path(*parts)

    def tokenizer_dir(self, teacher: str) -> str:
        return self.local_dir("tokenizers", teacher)

    def load_tokenizer(self, teacher: str):
        """The teacher's tokenizer, its files checked against the manifest first; a damaged one is a
        StoreError naming the file and the repair."""

        self.verify_folder("tokenizers", teacher)
        return load_tokenizer(self.tokenizer_dir(teacher), file_repair(self.root), StoreError)


@dataclass
class StoreWriter:
    """Commits shards for one writer (one rank): parquet first, then its manifest fragment.

    A shard that is on disk but not in a fragment is invisible and is rewritten on resume, so a
    crash between the two steps loses nothing.
    """

    loc: fs.Location
    writer_id: str
    manifest: Manifest
    _lock: object | None = field(default=None, repr=False)
    # the merged manifest found when this writer opened (None: a new store, or one --overwrite wiped)
    existing: Manifest | None = field(default=None, repr=False)

    def declare(self, name: str, kind: str, columns: dict[str, str], meta: dict) -> None:
        rec = self.manifest.tables.get(name)
        if rec is not None and rec.columns == columns and same_settings(rec.meta, meta):
            # Declared so already: a rerun (resumed, or with nothing to do) leaves the record, whose measured keys
            # (fidelity, why --backend auto chose) describe the writes that made the stored values.
            return
        if rec is None:
            self.manifest.tables[name] = TableRecord(kind, dict(columns), dict(meta))
        else:
            rec.columns, rec.meta = dict(columns), dict(meta)
        self._save_fragment()

    def commit(self, name: str, k: int, table: pa.Table) -> ShardRecord:
        data = fs.parquet_bytes(table)
        rel = shard_file(name, k)
        fs.atomic_write_bytes(self.loc, data, rel)
        return self._record(name, k, ShardRecord(rel, table.num_rows, len(data), fs.sha256(data), table_digest(table)))

    def adopt(self, name: str, k: int, tmp: str, rows: int, nbytes: int, sha256: str,
              ids: str | None = None) -> ShardRecord:
        """Commit shard k from a temp file another process wrote with `fs.write_temp` (a Ray worker): renamed
        into place, then recorded in this writer's fragment, as `commit` does. The temp file's size must be
        `nbytes` (a truncated copy is refused); its sha256 and ids digest are the ones the writing process
        computed."""
        rel = shard_file(name, k)
        size = self.loc.fs.get_file_info(tmp).size
        if size != nbytes:
            raise StoreError(f"a worker's shard file has {size} bytes, it reported {nbytes}", tmp,
                             "rerun the same command: the shard is recomputed")
        fs.publish_temp(self.loc, tmp, rel)
        return self._record(name, k, ShardRecord(rel, rows, nbytes, sha256, ids))

    def _record(self, name: str, k: int, rec: ShardRecord) -> ShardRecord:
        self.manifest.tables[name].shards[k] = rec
        self._save_fragment()
        return rec

    def set_extra(self, key: str, value: object) -> None:
        self.manifest.extras[key] = value
        self._save_fragment()

    def _save_fragment(self) -> None:
        fs.write_if_changed(self.loc, self.manifest.to_json().encode(), FRAGMENTS, f"{self.writer_id}.json")

    def publish(self) -> Manifest:
        """Write the merged manifest.json (idempotent; safe while other writers run)."""
        merged = load_manifest(self.loc)
        assert merged is not None
        fs.write_if_changed(self.loc, merged.to_json().encode(), MANIFEST)
        return merged

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # type: ignore[attr-defined]
            self._lock = None


def drop_table(loc: fs.Location, name: str) -> bool:
    """Forget a table in manifest.json and in every fragment, so it can be rewritten under its name.

    The merge refuses a table whose settings or shard checksums change (that protects against two
    writers disagreeing); replacing a derived table on purpose goes through here instead. The
    table's old files stay until the new shards overwrite them; readers never see them uncommitted.
    """
    dropped = False
    paths = [(MANIFEST,)] + [(FRAGMENTS, n) for n in fs.list_files(loc, FRAGMENTS) if n.endswith(".json")]
    for parts in paths:
        if not fs.exists(loc, *parts):
            continue
        m = Manifest.from_json(fs.read_bytes(loc, *parts), loc.path(*parts))
        if m.tables.pop(name, None) is not None:
            fs.atomic_write_bytes(loc, m.to_json().encode(), *parts)
            dropped = True
    return dropped


def _acquire_lock(loc: fs.Location, writer_id: str):
    """An exclusive flock per writer id: two processes writing the same shards would clobber each other.

    flock is released by the kernel when the holder dies (even by SIGKILL), so a killed run never
    leaves a stale lock behind. Remote filesystems have no flock; there we trust the user.
    """
    if not loc.is_local:
        return None
    if os.path.islink(loc.path(LOCKS)):  # (the lock was taken through it, a file made outside the store: a probe)
        raise StoreError(f"the store's {LOCKS} is a symbolic link (to {os.path.realpath(loc.path(LOCKS))}), where kd "
                         "keeps a folder of its own", loc.path(LOCKS), "remove the link: kd makes the folder again")
    f = fs.exclusive_lock(loc.path(LOCKS, f"{writer_id}.lock"))
    if f is None:
        raise StoreError(
            f"another kd process is writing this store (lock {writer_id} is held)",
            loc.path(LOCKS, f"{writer_id}.lock"),
            "wait for it to finish, or use a different --out",
        )
    return f


def _is_empty_dir(loc: fs.Location) -> bool:
    info = loc.fs.get_file_info(loc.root)
    if info.type == fs.pafs.FileType.NotFound:
        return True
    return not loc.fs.get_file_info(fs.pafs.FileSelector(loc.root))


def _wipe(loc: fs.Location) -> None:
    """Delete the store's folders, and a file in a folder's place (it stayed: --overwrite ended in a traceback)."""
    for info in loc.fs.get_file_info([loc.path(sub) for sub in STORE_FOLDERS]):
        with contextlib.suppress(FileNotFoundError, OSError):
            (loc.fs.delete_file if info.type == fs.pafs.FileType.File else loc.fs.delete_dir)(info.path)
    with contextlib.suppress(FileNotFoundError, OSError):
        loc.fs.delete_file(loc.path(MANIFEST))


def refuse_foreign_folder(loc: fs.Location, overwrite: bool, existing: Manifest | None) -> None:
    """Refuse a folder of other files (no kd store) unless `overwrite`. Checked before the lock is made and again
    under it: the first check leaves the user's folder untouched (no `locks/` in it), the second closes the race
    with another writer of the same run creating the store."""
    if existing is None and not _is_empty_dir(loc) and not overwrite:
        names = [i.base_name for i in loc.fs.get_file_info(fs.pafs.FileSelector(loc.root))]
        # Only a store's own folders (another writer of the same run is creating it and has not renamed
        # its first fragment in yet): not someone else's files, so no refusal and no race.
        if set(names) - {LOCKS} and (set(names) - BEING_CREATED or FRAGMENTS not in names):
            raise StoreError(
                "the output folder is not empty and holds no kd store",
                loc.root,
                "choose an empty or new --out (kd writes a store only into an empty folder or its own store)",
            )


def remove_if_nothing_committed(loc: fs.Location) -> bool:
    """Remove a store folder this run created when it holds no committed shard and no other writer holds a lock in
    it (a run refused after it made the folder: a bad --reuse source, a Ray address): rerunning must not meet a
    half-made store. Returns whether it was removed."""
    if not loc.is_local or not os.path.isdir(loc.root):
        return False
    with contextlib.suppress(StoreError):
        m = load_manifest(loc)
        if m is not None and any(rec.shards for rec in m.tables.values()):
            return False
    held = []
    try:
        for name in fs.list_files(loc, LOCKS):
            lock = fs.exclusive_lock(loc.path(LOCKS, name))
            if lock is None:  # another writer of this store is at work
                return False
            held.append(lock)
        shutil.rmtree(loc.root, ignore_errors=True)
        return True
    finally:
        for lock in held:
            lock.close()


def _existing_store(loc: fs.Location, header: Manifest, overwrite: bool, existing: Manifest | None) -> Manifest | None:
    """The store at `loc` a writer of `header` may extend (None: none, or wiped by `overwrite`); refuses a
    folder of other files, or a store of other inputs or settings, unless `overwrite`."""
    refuse_foreign_folder(loc, overwrite, existing)
    if existing is not None and plan_problems(existing):
        if not overwrite:
            check_plan_sound(existing, loc.root)
        _wipe(loc)
        return None
    if existing is not None and (
        existing.fingerprint != header.fingerprint or existing.num_shards != header.num_shards
    ):
        if not overwrite:
            raise StoreError(
                "the output folder holds a store made from other inputs or settings",
                loc.root,
                "use a new --out, or add outputs or teachers to that store with kd precompute --add-to STORE "
                "(its own inputs; --overwrite would delete it)",
            )
        _wipe(loc)
        return None
    return existing


def open_writer(uri: str | os.PathLike | fs.Location, header: Manifest, writer_id: str, overwrite: bool = False,
                existing: Manifest | None = None) -> StoreWriter:
    """Open (or create) a store for writing shards described by `header` (inputs + versions).

    - A new or empty location becomes a store.
    - A store made from the same inputs and row plan is resumed/extended.
    - Anything else is refused unless `overwrite`, so no data is lost by a typo in --out.
    - `existing`: the merged manifest the caller already loaded from `uri` (None: loaded here), used only for the
      check before the lock. Under the lock the manifest is read again, and the writer keeps that one as
      `.existing` (None once --overwrite wiped it): what it plans from. Another writer of the same id may have
      committed between the caller's read and the lock (a second `kd precompute` started as the first finishes),
      and a plan from the earlier read re-encodes its shards and reports a wrong count.
    """
    loc = fs.resolve(uri)
    refuse_foreign_folder(loc, overwrite, existing if existing is not None else readable_manifest(loc, overwrite))
    fs.makedirs(loc)
    if overwrite and loc.is_local and os.path.islink(loc.path(LOCKS)):
        os.unlink(loc.path(LOCKS))  # the link itself, never what it names
    if overwrite and loc.fs.get_file_info(loc.path(LOCKS)).type == fs.pafs.FileType.File:
        loc.fs.delete_file(loc.path(LOCKS))  # (a file where the locks go: "cannot take the lock": a probe)
    lock = _acquire_lock(loc, writer_id)
    try:
        existing = readable_manifest(loc, overwrite)
        if existing is None and overwrite and (fs.exists(loc, MANIFEST) or fs.exists(loc, FRAGMENTS)):
            _wipe(loc)  # a store whose records cannot be read: --overwrite replaces it (under the lock)
        existing = _existing_store(loc, header, overwrite, existing)
        own = None
        if fs.exists(loc, FRAGMENTS, f"{writer_id}.json"):
            own = Manifest.from_json(fs.read_bytes(loc, FRAGMENTS, f"{writer_id}.json"), writer_id)
        manifest = own or Manifest(dict(header.inputs), {}, dict(header.versions))
        # the same files (the fingerprint hashes their contents) named otherwise, a symlink or another folder: the
        # paths first recorded stay, so a run that computes nothing writes nothing (each spelling rewrote the store)
        same = existing is not None and existing.fingerprint == header.fingerprint
        manifest.inputs = dict(existing.inputs if same else header.inputs)
        manifest.versions = dict(header.versions)
        w = StoreWriter(loc, writer_id, manifest, lock, existing)
        w._save_fragment()
        return w
    except BaseException:
        if lock is not None:
            lock.close()
        raise


def iter_shards(store: Store, name: str) -> Iterator[tuple[int, pa.Table]]:
    for k in sorted(store.require_complete(name).shards):
        yield k, store.read_shard(name, k)


def dump_json(obj: object) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)
