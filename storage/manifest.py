"""The manifest: the commit record of a store.

- `manifest.json` holds the store's header (format version, inputs' fingerprint, row plan) and
  every table with its committed shards (file, rows, bytes, sha256) and metadata (a teacher's
  source, weights checksum, dims, pooling, dtype...).
- Writers that run at the same time (ranks of `torchrun`, `--shard-index`) never share a file:
  each commits to its own fragment `manifests/<writer>.json`. The store's state is the merge of
  `manifest.json` and all fragments; merging is a pure, idempotent union, so there is no
  coordinator and any process may write the merged `manifest.json` at any time.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kd.common import bounds as B
from kd.common.errors import StoreError
from kd.common.parsing import parse_json
from kd.storage.fs import check_relative

FORMAT_NAME = "kd-store"
FORMAT_VERSION = 2  # the newest version this kd writes and reads
# Version 2 adds int8 vector columns with `<column>__scale` beside them. A store is written as version 1 unless
# it holds an int8 column, so float stores stay readable by kd versions that know version 1 only, and those
# refuse an int8 store instead of reading its codes as floats.
READ_VERSIONS = (1, 2)
# Readers loop over and allocate per shard (plans, validation): a manifest may not declare more. At the default
# 20,000 rows per shard that is 2e10 rows.
MAX_SHARDS = 1_000_000
# Each table records the ids digest of its shards under this key (`{"0": "<blake2b hex>"}`), checked by every
# reader (storage/alignment.py). The format version is not bumped for it: a store with digests means to a kd that
# does not know them exactly what it meant before (that kd ignores an unknown table key and reads every row as
# before, unchecked), so nothing is misread; bumping would make every new store unreadable by it. A manifest that
# such a kd rewrites loses the digests, and readers then compare id columns with texts' instead.
IDS_KEY = "ids"
TEACHERS = "teachers/"  # a teacher's table is this prefix and its name (`teacher_table`)
DAMAGED_FIX = ("delete this file if other manifests remain (manifest.json is rebuilt from manifests/*.json), "
               "or run `kd validate STORE --repair`")


@dataclass
class ShardRecord:
    file: str  # relative to the store root
    rows: int
    bytes: int
    sha256: str
    ids: str | None = None  # blake2b-128 of the `id` column (storage/alignment.py); None in older stores

    def same_file(self, other: ShardRecord) -> bool:
        """Whether two records describe the same commit: one written before digests were recorded (ids None)
        agrees with one that records it."""
        return (self.file, self.rows, self.bytes, self.sha256) == (other.file, other.rows, other.bytes, other.sha256) \
            and (self.ids is None or other.ids is None or self.ids == other.ids)


@dataclass
class TableRecord:
    """One aligned table: `texts`, `teachers/<name>`, `students/<name>` or `clusters/<name>`."""

    kind: str  # texts | teacher | student | derived
    columns: dict[str, str] = field(default_factory=dict)  # name -> Arrow type string
    meta: dict[str, Any] = field(default_factory=dict)
    shards: dict[int, ShardRecord] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["shards"] = {str(k): {f: x for f, x in asdict(v).items() if f != "ids"}
                       for k, v in sorted(self.shards.items())}
        # The digests sit beside the shard records, not inside them: an older kd builds ShardRecord(**record) and
        # would refuse an unknown key as a damaged manifest, while it ignores an unknown table key (see IDS_KEY).
        ids = {str(k): v.ids for k, v in sorted(self.shards.items()) if v.ids is not None}
        if ids:
            d[IDS_KEY] = ids
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TableRecord:
        shards = {int(k): ShardRecord(**v) for k, v in d.get("shards", {}).items()}
        for k, digest in (d.get(IDS_KEY) or {}).items():
            if int(k) in shards:
                shards[int(k)].ids = digest
        return cls(kind=d["kind"], columns=d.get("columns", {}), meta=d.get("meta", {}), shards=shards)

    def missing(self, num_shards: int, first: int = 5) -> tuple[int, list[int]]:
        """(how many of shards 0..num_shards-1 are not committed, the first `first` of them), without a set
        of all shard numbers: a count and a walk that stops after `first` gaps."""
        have = sum(1 for k in self.shards if 0 <= k < num_shards)
        gaps: list[int] = []
        k = 0
        while len(gaps) < min(first, num_shards - have) and k < num_shards:
            if k not in self.shards:
                gaps.append(k)
            k += 1
        return num_shards - have, gaps


@dataclass
class Manifest:
    inputs: dict[str, Any]  # fingerprint, files, options, pairs, num_rows, rows_per_shard, num_shards, counts
    tables: dict[str, TableRecord] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)  # indexes and other pointers
    format_version: int = FORMAT_VERSION

    @property
    def fingerprint(self) -> str:
        return self.inputs["fingerprint"]

    @property
    def num_shards(self) -> int:
        return int(self.inputs["num_shards"])

    @property
    def pairs(self) -> bool:
        return bool(self.inputs.get("pairs", False))

    def is_complete(self, table: str) -> bool:
        rec = self.tables.get(table)
        return rec is not None and rec.missing(self.num_shards, 0)[0] == 0

    def teachers(self, column: str | None = None) -> list[str]:
        """The store's teachers by name (the one place that reads them off the tables); `column`: only those whose
        table has that column."""
        return [t.removeprefix(TEACHERS) for t, r in self.tables.items()
                if r.kind == "teacher" and (column is None or column in r.columns)]

    def required_version(self) -> int:
        """The lowest format version that can hold these tables: 2 when any column is int8, else 1."""
        int8 = any(t.startswith("int8") for rec in self.tables.values() for t in rec.columns.values())
        return 2 if int8 else 1

    def to_json(self) -> str:
        d = {
            "format": FORMAT_NAME,
            "format_version": self.required_version(),
            "inputs": self.inputs,
            "tables": {k: v.to_json() for k, v in sorted(self.tables.items())},
            "versions": self.versions,
            "extras": self.extras,
        }
        return json.dumps(d, indent=1, sort_keys=False)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        """Parse and check a manifest or fragment: format, version, the row plan's bounds (`check_plan`) and
        every shard record (`check_shards`), before any reader loops over or opens what it names."""
        fix = DAMAGED_FIX
        d = parse_json(text, where, fix, StoreError, what="manifest")
        if not isinstance(d, dict) or not isinstance(d.get("inputs"), dict) \
                or not isinstance(d.get("tables", {}), dict) or not isinstance(d.get("extras", {}), dict):
            raise StoreError("this is not a kd store manifest (not a JSON object with inputs and tables)", where, fix)
        if d.get("format") != FORMAT_NAME:
            raise StoreError("this is not a kd store manifest", where, "point at a folder written by kd precompute")
        version = d.get("format_version")
        if version not in READ_VERSIONS:
            raise StoreError(
                f"store format version {version} is not supported (this kd reads versions "
                f"{', '.join(map(str, READ_VERSIONS))})",
                where,
                "re-run kd precompute with this kd version, or use the kd version that wrote the store",
            )
        try:
            tables = {k: TableRecord.from_json(v) for k, v in d.get("tables", {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise StoreError(f"the manifest's table records are damaged ({e!r})", where, fix) from e
        for key in ("fingerprint", "num_shards"):
            if key not in d["inputs"]:
                raise StoreError(f"the manifest's inputs lack {key!r}", where, fix)
        check_plan(d["inputs"], where)
        for name, rec in tables.items():
            check_relative(name, where, "tables")  # a table name is a folder (teachers/<name>/) readers open
            check_shards(name, rec, d["inputs"], where)
        for rel in (d.get("extras") or {}).get("files") or {}:
            check_relative(rel, where, "extras.files")
        return cls(d["inputs"], tables, d.get("versions", {}), d.get("extras", {}), version)


def teacher_table(name: str) -> str:
    """The table of teacher `name`."""
    return TEACHERS + name


def _count(value: object, low: int, high: float, field: str, where: str) -> int:
    """An int in [low, high] (bools are not counts), else a StoreError naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise StoreError(f"{field} is {value!r}, not a whole number in [{low}, {high:,.0f}]", where, DAMAGED_FIX)
    return value


def check_plan(inputs: dict[str, Any], where: str) -> None:
    """The row plan's numbers are whole numbers in range before anything loops over or allocates per shard:
    num_shards in 0..MAX_SHARDS, num_rows >= 0, rows_per_shard >= 1. (Whether they agree with each other and
    with the fragments is `merge`'s check.)"""
    _count(inputs["num_shards"], 0, MAX_SHARDS, "inputs.num_shards", where)
    for key, low in (("num_rows", 0), ("rows_per_shard", 1)):
        if key in inputs:
            _count(inputs[key], low, math.inf, f"inputs.{key}", where)


def check_shards(name: str, rec: TableRecord, inputs: dict[str, Any], where: str) -> None:
    """Every shard record of a table: number in [0, num_shards), file inside the store, rows within the plan's
    shard size, bytes and sha256 of the right types."""
    n, per = int(inputs["num_shards"]), inputs.get("rows_per_shard")
    for k, shard in rec.shards.items():
        field = f"tables.{name}.shards.{k}"
        if not 0 <= k < n:
            raise StoreError(f"{field}: shard number {k} is outside the plan's {n} shard(s)", where, DAMAGED_FIX)
        check_relative(shard.file, where, f"{field}.file")
        _count(shard.rows, 0, per if isinstance(per, int) else math.inf, f"{field}.rows", where)
        _count(shard.bytes, 0, math.inf, f"{field}.bytes", where)
        if not isinstance(shard.sha256, str):
            raise StoreError(f"{field}.sha256 is {shard.sha256!r}, not a checksum", where, DAMAGED_FIX)
        if shard.ids is not None and not isinstance(shard.ids, str):
            raise StoreError(f"tables.{name}.{IDS_KEY}.{k} is {shard.ids!r}, not a digest", where, DAMAGED_FIX)


def plan_problems(m: Manifest) -> list[str]:
    """Where the manifest's row plan (num_rows, rows_per_shard, num_shards) disagrees with itself or with the
    rows its shard records hold: kd precompute cuts num_rows into shards of rows_per_shard (the last one
    shorter), so any other count is a damaged or forged manifest, not a fact to print or loop over."""
    rows, per = m.inputs.get("num_rows"), m.inputs.get("rows_per_shard")
    if not isinstance(rows, int) or not isinstance(per, int):
        return []  # (their presence and types are Manifest.from_json's check)
    if per > B.ROWS.hi:
        return [f"inputs.rows_per_shard is {per:,}, above the largest --shard-rows kd writes ({B.ROWS.hi:,.0f})"]
    expected = max(1, -(-rows // per))
    if m.num_shards != expected:
        return [f"inputs.num_rows {rows:,} in shards of {per:,} make {expected:,} shard(s), the manifest says "
                f"{m.num_shards:,}"]
    out = []
    wrong = disagreeing_records(m)
    for name in sorted({t for t, _, _, _ in wrong}):
        mine = [(k, n, want) for t, k, n, want in wrong if t == name]
        k, n, want = mine[0]
        out.append(f"{name}: {len(mine)} shard record(s) disagree with inputs.num_rows {rows:,} in shards of "
                   f"{per:,}; shard {k} records {n:,} rows, the plan {want:,}")
    return out


def disagreeing_records(m: Manifest) -> list[tuple[str, int, int, int]]:
    """(table, shard, rows recorded, rows planned) of each shard record whose row count is not the plan's, where
    the plan itself (num_rows, rows_per_shard, num_shards) holds together; [] otherwise."""
    rows, per = m.inputs.get("num_rows"), m.inputs.get("rows_per_shard")
    if not isinstance(rows, int) or not isinstance(per, int) or per < 1 or m.num_shards != max(1, -(-rows // per)):
        return []
    return [(name, k, s.rows, min(rows, (k + 1) * per) - k * per) for name, rec in sorted(m.tables.items())
            for k, s in sorted(rec.shards.items()) if s.rows != min(rows, (k + 1) * per) - k * per]


def check_plan_sound(m: Manifest, where: str) -> None:
    """Refuse to extend a store whose row plan disagrees with itself or its shard records (plan_problems):
    a writer would record its own plan beside it, and the store would then be refused for the disagreement
    rather than for the damage. `kd validate --repair` cannot rebuild such a plan either (every record says the
    same), so the fix is a new store."""
    problems = plan_problems(m)
    if problems:
        raise StoreError(f"the store's manifest holds a damaged row plan: {problems[0]}", where,
                         f"`kd validate {where} --repair` drops a few shard records that disagree with the plan, "
                         "then re-run this command; a plan that disagrees with itself cannot be restored: write the "
                         "store again, into a new --out or with --overwrite (run `kd validate STORE` for every "
                         "problem)")


PLAN_KEYS = ("num_rows", "rows_per_shard", "num_shards", "pairs", "counts")
# Table meta keys that are measurements, not settings: writers on other CPUs (or a resumed run) measure slightly
# other numbers, so they are not compared; merged, the lowest of each number is kept. `backend_choice` (what
# --backend auto chose, and why) is a record of the backend setting, which is compared on its own.
MEASURED_META = ("fidelity", "backend_choice")
# Table meta keys that say where a teacher was loaded from, not what it computes: its weights' sha256, config and
# tokenizer (compared) say which teacher it is, and one folder named from another working folder, or moved, or a copy
# of a packaged teacher, is the same teacher (a probe: `--teacher tiny=/abs/tb` was refused on a store of `tiny=tb`).
RECORD_META = ("source",)
# Meta keys added after stores were written, with the value their absence meant.
META_DEFAULTS = {"backend": "torch", "quantize": "none"}
# Meta keys added after stores were written whose absence means "not recorded", not a value: compared only where
# both metas hold one (a store of an older kd resumes). config_sha256: the teacher's config.json.
LATER_META = ("config_sha256",)


def settings(meta: dict) -> dict:
    """A table meta's settings: measured and record keys aside, defaults filled in."""
    return {**META_DEFAULTS, **{k: v for k, v in meta.items() if k not in MEASURED_META + RECORD_META}}


def comparable(a: dict, b: dict) -> tuple[dict, dict]:
    """Two table metas' settings, as they compare: a LATER_META key only where both record it."""
    sa, sb = settings(a), settings(b)
    for k in LATER_META:
        if k not in sa or k not in sb:
            sa.pop(k, None)
            sb.pop(k, None)
    return sa, sb


def same_settings(a: dict, b: dict) -> bool:
    """Whether two table metas describe the same settings."""
    sa, sb = comparable(a, b)
    return sa == sb


def _lowest_fidelity(a: dict | None, b: dict | None) -> dict | None:
    """{column: {min_cosine, mean_cosine, ...}} with the lower number of the two records each (order-free)."""
    if not a or not b:
        return a or b
    return {c: {k: min(v, b[c][k]) if isinstance(v, float) and isinstance(b.get(c, {}).get(k), float) else v
                for k, v in a[c].items()} for c in a}


def merge(manifests: list[Manifest], where: str) -> Manifest:
    """Union of manifests that describe the same inputs (a pure function; order does not matter)."""
    if not manifests:
        raise StoreError("no manifest found", where, "run kd precompute to create the store")
    base = manifests[0]
    out = Manifest(dict(base.inputs), {}, dict(base.versions), dict(base.extras))
    for m in manifests:
        if m.fingerprint != base.fingerprint or m.num_shards != base.num_shards:
            raise StoreError(
                "manifest fragments describe different inputs",
                where,
                "a writer was started with other inputs or --shard-rows; remove the store and re-run",
            )
        # Same fingerprint, other row counts or plan: a hand-edited manifest.json (or fragment). File paths
        # may differ (the same content moved), so only the row plan is compared.
        diff = [k for k in PLAN_KEYS if m.inputs.get(k) != base.inputs.get(k)]
        if diff:
            raise StoreError(f"manifest.json and the fragments in manifests/ disagree on {diff}", where,
                             "delete manifest.json (it is rebuilt from manifests/), or run "
                             "`kd validate STORE --repair`")
        # `files` (sha256 of tokenizer and embedding files) is a union over writers, not a replacement
        out.extras.update({k: v for k, v in m.extras.items() if k != "files"})
        if m.extras.get("files"):
            out.extras.setdefault("files", {}).update(m.extras["files"])
        for name, rec in m.tables.items():
            have = out.tables.setdefault(name, TableRecord(rec.kind, dict(rec.columns), dict(rec.meta)))
            if rec.meta and have.meta and not same_settings(rec.meta, have.meta):
                raise StoreError(
                    f"table {name!r} was written with different settings by two writers",
                    where,
                    "re-run the writers with the same options, or --overwrite",
                )
            have.meta = have.meta or dict(rec.meta)
            if have.meta.get("fidelity") and rec.meta.get("fidelity"):
                have.meta["fidelity"] = _lowest_fidelity(have.meta["fidelity"], rec.meta["fidelity"])
            have.columns = have.columns or dict(rec.columns)
            for k, shard in rec.shards.items():
                if k in have.shards and not have.shards[k].same_file(shard):
                    raise StoreError(f"shard {k} of {name!r} has two different records (file, rows, bytes or "
                                     "checksum) in manifest.json and the fragments", where,
                                     "delete manifest.json (it is rebuilt from manifests/), or run `kd validate "
                                     "STORE --repair`")
                if k not in have.shards or have.shards[k].ids is None:  # the record with the digest wins
                    have.shards[k] = shard
    return out
