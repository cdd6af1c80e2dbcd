"""`kd validate --repair`: forget damaged shards so that re-running the command that wrote them
recomputes exactly them.

- a shard whose file is missing, unreadable, or unlike its manifest record (size, sha256) is removed
  from `manifest.json` and from every fragment in `manifests/` (the same records, so a later merge
  cannot bring it back), and its file is moved aside to `<file>.damaged` (kept for inspection);
- a `manifest.json` that is not valid is rebuilt from the fragments (the commit record of each writer);
- nothing else changes: undamaged shards, ids and values stay exactly as they were.
Then `kd precompute` (same inputs and options) finds the shards missing and writes them again; a
missing `texts` shard makes it re-read the inputs (spaCy included) for that writer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kd.storage import fs
from kd.storage.errors import StoreError
from kd.storage.manifest import Manifest
from kd.storage.store import FRAGMENTS, MANIFEST, load_manifest


@dataclass
class RepairReport:
    dropped: list[tuple[str, int, str]] = field(default_factory=list)  # (table, shard, why)
    manifest_rebuilt: bool = False


def _inside(loc: fs.Location, rec) -> str | None:
    """The shard's path, or None when it leads out of the store (a symlink): never read, never renamed."""
    try:
        return fs.member(loc, rec.file, loc.path(MANIFEST), "file")
    except StoreError:
        return None


def _damage(loc: fs.Location, rec) -> str | None:
    if _inside(loc, rec) is None:
        return "leads out of the store (a symlink)"
    info = loc.fs.get_file_info(loc.path(rec.file))
    if info.type == fs.pafs.FileType.NotFound:
        return "missing"
    if info.size is not None and info.size != rec.bytes:  # known without reading a possibly huge file
        return "checksum mismatch"
    try:
        data = fs.read_bytes(loc, rec.file)
    except OSError as e:
        return f"unreadable ({e})"
    if len(data) != rec.bytes or fs.sha256(data) != rec.sha256:
        return "checksum mismatch"
    return None


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
    bad = {}
    for name, rec in merged.tables.items():
        for k, shard in rec.shards.items():
            why = _damage(loc, shard)
            if why:
                bad[(name, k)] = why
                report.dropped.append((name, k, why))
    if bad:
        _drop(loc, set(bad))
        for name, k in bad:
            f = _inside(loc, merged.tables[name].shards[k])
            if f is not None and loc.is_local and os.path.lexists(f):
                os.replace(f, f + ".damaged")
    if bad or report.manifest_rebuilt:
        fs.atomic_write_bytes(loc, load_manifest(loc).to_json().encode(), MANIFEST)
    return report


def _drop(loc: fs.Location, shards: set[tuple[str, int]]) -> None:
    """Remove the shard records from manifest.json and every fragment (atomically, file by file)."""
    paths = [(MANIFEST,)] + [(FRAGMENTS, n) for n in fs.list_files(loc, FRAGMENTS) if n.endswith(".json")]
    for parts in paths:
        if not fs.exists(loc, *parts):
            continue
        m = Manifest.from_json(fs.read_bytes(loc, *parts), loc.path(*parts))
        changed = False
        for name, k in shards:
            if name in m.tables and m.tables[name].shards.pop(k, None) is not None:
                changed = True
        if changed:
            fs.atomic_write_bytes(loc, m.to_json().encode(), *parts)


def describe(report: RepairReport) -> list[str]:
    lines = [f"dropped shard {k} of {name}: {why}" for name, k, why in sorted(report.dropped)]
    if report.manifest_rebuilt:
        lines.append("manifest.json rebuilt from manifests/")
    return lines or ["nothing to repair"]


__all__ = ["RepairReport", "describe", "repair"]
