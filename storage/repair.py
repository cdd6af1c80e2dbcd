"""`kd validate --repair`: forget damaged files so that re-running the command that wrote them
recomputes exactly them.

- a shard whose file is missing, unreadable, outside the store (a symlink leading out: its record is
  dropped, the file it points at is never touched), unlike its manifest record (size, sha256) or unlike its
  table's declared columns, or holding NaN/Inf vectors, is removed
  from `manifest.json` and from every fragment in `manifests/` (the same records, so a later merge
  cannot bring it back), and its file is moved aside to `<file>.damaged` (kept for inspection);
- so is a shard whose ids are not those of texts shard k (storage/alignment.py: a file from another store whose
  checksums were changed in the manifest), and a texts shard unlike the ids digest its record holds;
- a per-teacher file the manifest records a sha256 for (`extras.files`: tokenizer, input embeddings,
  `vocab`, `init`) that is missing, unreadable, unlike its checksum, holding NaN/Inf or (vocab, input
  embeddings) unlike the teacher's shape is handled the same way, by the
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
import os
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from kd.common.errors import StoreError
from kd.storage import fs
from kd.storage.alignment import ID, ids_digest
from kd.storage.index_files import EXTRA_PREFIX
from kd.storage.manifest import Manifest, ShardRecord, disagreeing_records, merge, plan_problems
from kd.storage.names import links_out, real_inside
from kd.storage.schema import tensors_problem
from kd.storage.soundness import file_content_problem, shard_problems, values_problems
from kd.storage.store import FRAGMENTS, MANIFEST, load_manifest

SET_ASIDE = ".damaged"


@dataclass
class RepairReport:
    dropped: list[tuple[str, int, str]] = field(default_factory=list)  # (table, shard, why)
    # (file or folder set aside, why, what brings it back): what precompute wrote comes back by its rerun; a fragment
    # whose records manifest.json holds, or a link out of the store (locks/), needs nothing
    files: list[tuple[str, str, str]] = field(default_factory=list)
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
    except fs.FileAtFolder:  # (its fix named the store's record: "move the store aside and re-run": a probe)
        raise
    except StoreError as e:
        _rebuild_record(loc, e, report)
    merged = load_manifest(loc)
    if merged is None:
        raise StoreError("no kd store here", loc.root, "point at a folder written by kd precompute")
    drop, aside = _Drop(), set()
    _disagreeing_records(loc, merged, drop, aside, report)
    problems = plan_problems(merged) if not drop else []
    if problems:  # every record says the same: there is no trusted side to rebuild the plan from
        raise StoreError(f"--repair cannot restore the store's row plan: {problems[0]}", loc.root,
                         "manifest.json and every fragment record the same damaged plan: move the store aside and "
                         "re-run the kd precompute command that wrote it")
    for name, rec in merged.tables.items():
        for k, shard in rec.shards.items():
            if (name, k) in drop.shards:
                continue
            why = _damage(loc, shard.file, shard.bytes, shard.sha256) or _unlike_declared(loc, name, shard, rec.columns)
            if why:
                drop.shards.add((name, k))
                aside.add(shard.file)
                report.dropped.append((name, k, why))
    for name, k, file, why in _misaligned(loc, merged, drop):
        drop.shards.add((name, k))
        aside.add(file)
        report.dropped.append((name, k, why))
    _damaged_files(loc, merged, drop, aside, report)
    _damaged_indexes(loc, merged, drop, aside, report)
    _links_aside(loc, report)
    if drop:
        _drop(loc, drop)
        for rel in sorted(aside):
            _set_aside(loc, rel)
    if drop or report.manifest_rebuilt:
        fs.atomic_write_bytes(loc, load_manifest(loc).to_json().encode(), MANIFEST)
    return report


def _disagreeing_records(loc: fs.Location, m: Manifest, drop: _Drop, aside: set[str], report: RepairReport) -> None:
    """Shard records whose row count is not the plan's, when they are fewer than half of all records: the plan holds
    with the others, so those records (and their files) are the damaged side and are dropped; the rerun of
    precompute writes those shards again. More of them than that: no side can be trusted (`plan_problems`)."""
    wrong = disagreeing_records(m)
    if not wrong or 2 * len(wrong) >= sum(len(rec.shards) for rec in m.tables.values()):
        return
    for name, k, n, want in wrong:
        drop.shards.add((name, k))
        aside.add(m.tables[name].shards[k].file)
        report.dropped.append((name, k, f"its record says {n:,} rows, the row plan {want:,}"))


def _rebuild_record(loc: fs.Location, damaged: StoreError, report: RepairReport) -> None:
    """manifest.json or a fragment is damaged, or they disagree: keep the side that holds up alone.

    The fragments (each writer's commit record) win over manifest.json. Where a fragment is itself damaged and
    manifest.json (the union of every writer's records) holds up with the others, the damaged fragment is set
    aside instead: its writer starts a new one on its next run. Where neither holds up, --repair says so
    rather than failing as `kd validate` did (whose message sent the user here)."""
    with contextlib.suppress(StoreError):
        if load_manifest(loc, main=False) is not None:
            if loc.fs.get_file_info(loc.path(MANIFEST)).type == fs.pafs.FileType.Directory:
                _set_aside(loc, MANIFEST)  # a folder in its place: kept for inspection, as damaged shards are
            else:
                loc.fs.delete_file(loc.path(MANIFEST))
            report.manifest_rebuilt = True
            return
    names = [n for n in fs.list_files(loc, FRAGMENTS) if n.endswith(".json")]
    parsed = {n: _parsed(loc, FRAGMENTS, n) for n in names}
    bad = [n for n, m in parsed.items() if m is None]
    main = _parsed(loc, MANIFEST) if fs.exists(loc, MANIFEST) else None
    if bad and main is not None:
        with contextlib.suppress(StoreError):
            merge([main, *(m for m in parsed.values() if m is not None)], loc.root)
            for n in bad:
                _set_aside(loc, f"{FRAGMENTS}/{n}")
                report.files.append((f"{FRAGMENTS}/{n}", "damaged; manifest.json holds its records",
                                     "nothing to re-run: its writer starts a new one on its next run"))
            return
    raise StoreError(f"--repair cannot rebuild this store's record: {damaged.what}", damaged.where,
                     "neither manifest.json nor the fragments in manifests/ hold a record that can be trusted: "
                     "move the store aside and re-run the kd precompute command that wrote it") from damaged


def _parsed(loc: fs.Location, *parts: str) -> Manifest | None:
    """The manifest or fragment at `parts`, or None where it is damaged or, as every reader sees it, a symlink
    leading out of the store (whatever it leads to: read through the link, a fragment linked out once left --repair
    finding nothing wrong with it and so no record to trust, while manifest.json was whole)."""
    rel = "/".join(parts)
    try:
        fs.member(loc, rel, loc.path(rel), rel)
        return Manifest.from_json(fs.read_bytes(loc, *parts), loc.path(*parts))
    except StoreError:
        return None


def _misaligned(loc: fs.Location, m: Manifest, drop: _Drop) -> list[tuple[str, int, str, str]]:
    """(table, shard, file, why) of the sound shards whose ids are not texts shard k's (a file from another store
    whose checksums were changed in the manifest): texts shard k is held to the digest its record holds, every
    other table to texts shard k's ids (its file's, or its recorded digest when its file is damaged)."""
    out, ref = [], {}
    for k, shard in sorted(m.tables["texts"].shards.items() if "texts" in m.tables else []):
        got = None if ("texts", k) in drop.shards else _ids_of(loc, shard.file)
        if got is not None and shard.ids not in (None, got):
            out.append(("texts", k, shard.file, "ids are not those the store's tables were written for"))
        ref[k] = shard.ids or got
    for name, rec in sorted(m.tables.items()):
        for k, shard in sorted(rec.shards.items()):
            if name == "texts" or (name, k) in drop.shards:
                continue
            want = ref.get(k) or shard.ids
            if want is not None and _ids_of(loc, shard.file) not in (None, want):
                out.append((name, k, shard.file, f"ids are not aligned with texts shard {k}"))
    return out


def _unlike_declared(loc: fs.Location, name: str, shard: ShardRecord, columns: dict[str, str]) -> str | None:
    """Why a shard whose checksum held is not what its record and table declare (not Parquet, another row count, a
    column missing, of another type, undeclared or named twice: its record forged to match other bytes; values that
    kd precompute never writes, `soundness.values_problems`), or None: validate and every reader refuse such a
    shard, so --repair drops it too, and the rerun of precompute writes it again."""
    try:
        with loc.fs.open_input_file(loc.path(shard.file)) as f:
            table = pq.ParquetFile(f).read()
    except (OSError, pa.ArrowException) as e:
        return f"unreadable parquet ({' '.join(str(e).split())[:160]})"
    # what validate and the readers refuse
    wrong = shard_problems(table.schema, table.num_rows, shard.rows, columns) or values_problems(name, table)
    return wrong[0] if wrong else None


def _ids_of(loc: fs.Location, rel: str) -> str | None:
    """The ids digest of a shard whose bytes were just checked, reading its `id` column only; None when it has
    none or cannot be parsed (its checksum held: validate reports what is wrong with it)."""
    try:
        with loc.fs.open_input_file(loc.path(rel)) as f:
            pf = pq.ParquetFile(f)
            return ids_digest(pf.read(columns=[ID]).column(ID)) if ID in pf.schema_arrow.names else None
    except (OSError, pa.ArrowException):
        return None


def _damaged_files(loc: fs.Location, m: Manifest, drop: _Drop, aside: set[str], report: RepairReport) -> None:
    """Per-teacher files unlike their recorded sha256 or with content every reader refuses: every recorded file of
    their unit is dropped."""
    known: dict[str, str] = m.extras.get("files", {})
    bad: dict[str, str] = {}
    for rel, sha in sorted(known.items()):
        why = _damage(loc, rel, None, sha) or _content_problem(loc, m, rel)
        if why and file_unit(rel) not in bad:
            bad[file_unit(rel)] = f"{rel.rsplit('/', 1)[-1]}: {why}" if file_unit(rel) != rel else why
    for unit, why in sorted(bad.items()):
        drop.files |= {rel for rel in known if file_unit(rel) == unit}
        aside.add(unit)
        report.files.append((unit, why, RERUN))


def _content_problem(loc: fs.Location, m: Manifest, rel: str) -> str | None:
    """What every reader refuses in a recorded file (storage.soundness): NaN/Inf in a safetensors file, a vocab
    output / input embeddings unlike the teacher, a tokenizer JSON file kd's parser refuses or with an auto_map."""
    data = fs.read_bytes(loc, rel)
    if rel.endswith(".safetensors") and (why := tensors_problem(data)):
        return why
    return file_content_problem(m, lambda r: fs.read_bytes(loc, r), rel, data)


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
        _link_aside(loc, rel)  # never rename or delete what a record points at outside the store
        return
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


def _links_aside(loc: fs.Location, report: RepairReport) -> None:
    """Every other symlink leading out of the store (`locks/` to /dev/null, a link no record names): the link itself
    is removed (never its target; the report names the target); what kd writes there, it makes again."""
    if not loc.is_local:
        return
    for rel, target in list(links_out(loc.root)):
        link = os.path.join(loc.root, rel)
        if os.path.islink(link):  # (removed with a record above)
            os.unlink(link)
            report.files.append((rel, f"a symlink leading out of the store, to {target}",
                                 "nothing to re-run: kd makes what it keeps there again when it needs it"))


def _link_aside(loc: fs.Location, rel: str) -> None:
    """A symlink in the store leading out of it, at `rel` or at a folder above it: the link itself (never its target)
    is removed, so the rerun of precompute writes a real file at `rel` (it refuses to write through a link leading
    out). A link is not renamed to `<link>.damaged`: it would still lead out of the store, which validate reports."""
    if not loc.is_local:
        return
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):  # the first link on the way (the file, or a folder above it: `teachers`)
        link = os.path.join(loc.root, *parts[:i])
        if os.path.islink(link):
            if not real_inside(loc.root, *parts[:i])[1] and real_inside(loc.root, *parts[:i - 1])[1]:
                os.unlink(link)
            return


RERUN = "re-run the kd precompute command that wrote it to restore it"


def describe(report: RepairReport) -> list[str]:
    lines = [f"dropped shard {k} of {name}: {why}" for name, k, why in sorted(report.dropped)]
    lines += [f"set aside {unit} ({why}): {after}" for unit, why, after in report.files]
    lines += [f"dropped index {name} ({why}): rebuild it with kd index" for name, why in report.indexes]
    if report.manifest_rebuilt:
        lines.append("manifest.json rebuilt from manifests/")
    return lines or ["nothing to repair"]


__all__ = ["RepairReport", "describe", "file_unit", "repair"]
