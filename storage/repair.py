"""`kd validate --repair`: forget damaged files so that re-running the command that wrote them
recomputes exactly them.

- a shard whose file is missing, unreadable, outside the store (a symlink leading out: its record is
  dropped, the file it points at is never touched), or unlike its manifest record (size, sha256) is removed
  from `manifest.json` and from every fragment in `manifests/` (the same records, so a later merge
  cannot bring it back), and its file is moved aside to `<file>.damaged` (kept for inspection);
- a per-teacher file the manifest records a sha256 for (`extras.files`: tokenizer, input embeddings,
  `vocab`, `init`) that is missing, unreadable or unlike its checksum is handled the same way, by the
  unit it was written as: a tokenizer folder or an `init-*` folder as a whole (its files belong
  together), any other file alone;
- a faiss index (`extras["index:..."]`) whose index or ids file is damaged loses its record and files;
- a `manifest.json` that is not valid is rebuilt from the fragments (the commit record of each writer);
- nothing else changes: undamaged shards, files, ids and values stay exactly as they were.
Then `kd precompute` (same inputs and options) finds the shards and per-teacher files missing and
writes them again (a missing `texts` shard makes it re-read the inputs, spaCy included, for that
writer); `kd index` rebuilds a dropped index.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pyarrow as pa

from kd.common.errors import StoreError
from kd.storage import fs
from kd.storage.index_files import EXTRA_PREFIX
from kd.storage.manifest import Manifest
from kd.storage.store import FRAGMENTS, MANIFEST, load_manifest

SET_ASIDE = ".damaged"


@dataclass
class RepairReport:
    dropped: list[tuple[str, int, str]] = field(default_factory=list)  # (table, shard, why)
    files: list[tuple[str, str]] = field(default_factory=list)  # (file or folder set aside, why)
    indexes: list[tuple[str, str]] = field(default_factory=list)  # (index name, why)
    manifest_rebuilt: bool = False


@dataclass
class _Drop:
    """What to forget: shard records, `extras.files` entries, and whole extras keys (indexes)."""

    shards: set[tuple[str, int]] = field(default_factory=set)
    files: set[str] = field(default_factory=set)
    extras: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.shards or self.files or self.extras)


def _inside(loc: fs.Location, rel: str) -> bool:
    """Whether a recorded path stays inside the store (a symlink leading out does not): only such files
    are ever read, moved aside or deleted here."""
    try:
        fs.member(loc, rel, loc.path(MANIFEST), "file")
    except StoreError:
        return False
    return True


def _damage(loc: fs.Location, rel: str, size: int | None, sha: str) -> str | None:
    """Why the file at `rel` is not the one recorded (outside the store, missing, unreadable, size or
    sha256), or None. The size is compared before reading, so a huge planted file is never read whole."""
    if not _inside(loc, rel):
        return "leads out of the store (a symlink)"
    info = loc.fs.get_file_info(loc.path(rel))
    if info.type == fs.pafs.FileType.NotFound:
        return "missing"
    if size is not None and info.size is not None and info.size != size:
        return "checksum mismatch"
    try:
        data = fs.read_bytes(loc, rel)
    except (OSError, pa.ArrowException) as e:
        return f"unreadable ({e})"
    if (size is not None and len(data) != size) or (sha and fs.sha256(data) != sha):
        return "checksum mismatch"
    return None


def file_unit(rel: str) -> str:
    """What a per-teacher file was written as: its tokenizer folder, its `init-*` folder, or itself."""
    parts = rel.split("/")
    if parts[0] == "tokenizers" and len(parts) > 2:
        return "/".join(parts[:2])
    if parts[0] == "teachers" and len(parts) > 3 and parts[2].startswith("init-"):
        return "/".join(parts[:3])
    return rel


def repair(store_path: str) -> RepairReport:
    loc = fs.resolve(store_path)
    report = RepairReport()
    try:
        load_manifest(loc)
    except StoreError:
        # manifest.json is damaged or disagrees: the fragments are the commit record, if they hold up alone
        if load_manifest(loc, main=False) is None:
            raise
        loc.fs.delete_file(loc.path(MANIFEST))
        report.manifest_rebuilt = True
    merged = load_manifest(loc)
    if merged is None:
        raise StoreError("no kd store here", loc.root, "point at a folder written by kd precompute")
    drop, aside = _Drop(), set()
    for name, rec in merged.tables.items():
        for k, shard in rec.shards.items():
            why = _damage(loc, shard.file, shard.bytes, shard.sha256)
            if why:
                drop.shards.add((name, k))
                aside.add(shard.file)
                report.dropped.append((name, k, why))
    _damaged_files(loc, merged, drop, aside, report)
    _damaged_indexes(loc, merged, drop, aside, report)
    if drop:
        _drop(loc, drop)
        for rel in sorted(aside):
            _set_aside(loc, rel)
    if drop or report.manifest_rebuilt:
        fs.atomic_write_bytes(loc, load_manifest(loc).to_json().encode(), MANIFEST)
    return report


def _damaged_files(loc: fs.Location, m: Manifest, drop: _Drop, aside: set[str], report: RepairReport) -> None:
    """Per-teacher files unlike their recorded sha256: every recorded file of their unit is dropped."""
    known: dict[str, str] = m.extras.get("files", {})
    bad: dict[str, str] = {}
    for rel, sha in sorted(known.items()):
        why = _damage(loc, rel, None, sha)
        if why and file_unit(rel) not in bad:
            bad[file_unit(rel)] = f"{rel.rsplit('/', 1)[-1]}: {why}" if file_unit(rel) != rel else why
    for unit, why in sorted(bad.items()):
        drop.files |= {rel for rel in known if file_unit(rel) == unit}
        aside.add(unit)
        report.files.append((unit, why))


def _damaged_indexes(loc: fs.Location, m: Manifest, drop: _Drop, aside: set[str], report: RepairReport) -> None:
    """faiss indexes whose index or ids file is missing or unlike its recorded sha256."""
    for key, info in sorted(m.extras.items()):
        if not key.startswith(EXTRA_PREFIX) or not isinstance(info, dict):
            continue
        files = ((info.get("file"), info.get("sha256", "")), (info.get("ids_file"), info.get("ids_sha256", "")))
        why = next((f"{rel}: {w}" for rel, sha in files if rel and (w := _damage(loc, rel, None, sha))), None)
        if why:
            drop.extras.add(key)
            aside |= {rel for rel, _ in files if rel}
            report.indexes.append((key[len(EXTRA_PREFIX):], why))


def _drop(loc: fs.Location, drop: _Drop) -> None:
    """Remove the records from manifest.json and every fragment (atomically, file by file)."""
    paths = [(MANIFEST,)] + [(FRAGMENTS, n) for n in fs.list_files(loc, FRAGMENTS) if n.endswith(".json")]
    for parts in paths:
        if not fs.exists(loc, *parts):
            continue
        m = Manifest.from_json(fs.read_bytes(loc, *parts), loc.path(*parts))
        changed = False
        for name, k in drop.shards:
            if name in m.tables and m.tables[name].shards.pop(k, None) is not None:
                changed = True
        files = m.extras.get("files", {})
        for rel in drop.files & set(files):
            del files[rel]
            changed = True
        for key in drop.extras & set(m.extras):
            del m.extras[key]
            changed = True
        if changed:
            fs.atomic_write_bytes(loc, m.to_json().encode(), *parts)


def _set_aside(loc: fs.Location, rel: str) -> None:
    """Move a damaged file or folder to `<rel>.damaged` (replacing an older one), so the rerun writes it
    afresh and it stays for inspection; where it cannot be moved it is deleted."""
    if not _inside(loc, rel):
        return  # never rename or delete what a record points at outside the store
    src, dst = loc.path(rel), loc.path(rel) + SET_ASIDE
    kind = loc.fs.get_file_info(src).type
    if kind == fs.pafs.FileType.NotFound:
        return
    for delete in (loc.fs.delete_dir, loc.fs.delete_file):
        with contextlib.suppress(OSError):
            delete(dst)
    try:
        loc.fs.move(src, dst)
    except OSError:
        (loc.fs.delete_dir if kind == fs.pafs.FileType.Directory else loc.fs.delete_file)(src)


def describe(report: RepairReport) -> list[str]:
    lines = [f"dropped shard {k} of {name}: {why}" for name, k, why in sorted(report.dropped)]
    lines += [f"set aside {unit} ({why}): re-run the kd precompute command that wrote it to restore it"
              for unit, why in report.files]
    lines += [f"dropped index {name} ({why}): rebuild it with kd index" for name, why in report.indexes]
    if report.manifest_rebuilt:
        lines.append("manifest.json rebuilt from manifests/")
    return lines or ["nothing to repair"]


__all__ = ["RepairReport", "describe", "file_unit", "repair"]
