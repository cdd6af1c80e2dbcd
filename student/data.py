"""Streaming training data from a store: column-projected shard reads, shuffling, tokenization.

- What is read: only the columns the objectives name ("<teacher>.<column>" or "label") plus `id`
  and the text column(s); a cosine run never touches `layers`. Shard k of `texts` and of every
  teacher table are read side by side in chunks and zipped; ids must be equal row for row.
- Split: a row is held out for validation when a hash of its id falls below `val_percent`
  (deterministic, independent of sharding, batch size and world size).
- Order: per epoch the work units (shards, or stripes of shards when there are more readers than
  shards) are permuted and dealt round-robin to the readers (DDP rank x DataLoader worker). Each
  reader mixes its rows through a bounded block shuffle buffer and yields tokenized batches.
- Exact resume: every reader's batch count is known before reading, so the order in which the
  trainer takes batches from readers (round-robin, `canonical_order`) is a pure function of the
  plan; "epoch + batches consumed" is the whole data position.
- Memory: one chunk per table plus the shuffle buffer per reader; validation rows are capped.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from kd.common.errors import InputError, StoreError
from kd.common.fast_tokenizer import FastTokenizer
from kd.common.finite import MAX_ABS, unusable_rows
from kd.common.locks import let_go_of_inherited_locks
from kd.common.padding import pad_rows
from kd.storage.int8 import DAMAGED, is_scale_column
from kd.storage.manifest import teacher_table
from kd.storage.schema import table_vectors, with_scales
from kd.storage.store import Store, file_repair
from kd.storage.tokenizer_files import load_tokenizer
from kd.student.target import column_key, combine, key_parts
from kd.student.train_config import BASE_DEFAULTS

# Golden-ratio multiplier (Knuth): spreads consecutive or clustered ids evenly over the 100 buckets.
_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
LABEL = "label"
# Pseudo-column: each row's ordinal in the store (shard offset + row in shard); keys CoDIR's memory bank.
POS = "pos"


def is_validation(ids: np.ndarray, val_percent: float) -> np.ndarray:
    """Boolean mask of held-out rows: ((id * golden) >> 32) % 10000 < val_percent * 100."""
    h = (np.asarray(ids, dtype=np.int64).view(np.uint64) * _HASH_MUL) >> np.uint64(32)
    return (h % np.uint64(10000)) < np.uint64(round(val_percent * 100))


def split_rows(ids: np.ndarray, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) masks; rows whose id is in `cfg.exclude` (e.g. evaluation sentences) are in neither."""
    val = is_validation(ids, cfg.val_percent)
    if cfg.exclude:
        out = np.isin(np.asarray(ids, dtype=np.int64), np.asarray(cfg.exclude, dtype=np.int64))
        return ~val & ~out, val & ~out
    return ~val, val


@dataclass(frozen=True)
class Columns:
    """What to read: text columns, label, and per-teacher-table vector columns."""

    texts: tuple[str, ...]  # "text" or ("text_a", "text_b")
    label: bool
    teachers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # teacher name -> columns
    label_names: tuple[str, ...] | None = None  # string labels -> index in a teacher's label_names
    pos: bool = False  # add POS: every row's ordinal in the store (0 .. num_rows - 1)
    # combined targets (student.target): batch key -> (part key, share) of each teacher vector it is built from
    combined: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    parts_only: tuple[str, ...] = ()  # part keys read only to build a combined target: dropped once it is built

    @property
    def pairs(self) -> bool:
        return len(self.texts) == 2

    def tables(self) -> list[str]:
        return ["texts", *map(teacher_table, self.teachers)]


def available_columns(store: Store) -> list[str]:
    """Every "<teacher>.<column>" a store offers (vector columns only), plus "label" when present."""
    out = []
    for teacher in sorted(store.manifest.teachers()):
        out += [column_key(teacher, c) for c in store.table(teacher_table(teacher)).columns
                if c not in ("id", "n_tokens", "truncated") and not is_scale_column(c)]
    if LABEL in store.table("texts").columns:
        out.append(LABEL)
    return out


def resolve_columns(store: Store, specs: list[str],
                    combined: dict[str, tuple[tuple[str, float], ...]] | None = None) -> Columns:
    """Map objective column names to store tables; unknown names raise an error listing what exists. A combined
    target's key (`combined`, from the objectives' Context) is read as its parts' columns."""
    texts = store.table("texts")
    text_cols = ("text_a", "text_b") if store.manifest.pairs else ("text",)
    teachers: dict[str, list[str]] = {}
    label = pos = False
    combined = {k: v for k, v in (combined or {}).items() if k in specs}
    parts = [key for k in combined for key, _ in combined[k]]
    for spec in dict.fromkeys(s for s in [*specs, *parts] if s not in combined):
        if spec == POS:
            pos = True
            continue
        if spec == LABEL:
            if LABEL not in texts.columns:
                raise InputError(
                    "the objective needs labels but the store's texts have no label column",
                    store.root, "precompute with --label-column, or choose an objective without labels",
                )
            label = True
            continue
        teacher, col = key_parts(spec)
        rec = store.manifest.tables.get(teacher_table(teacher))
        if not col or rec is None or col not in rec.columns:
            raise InputError(
                f"the store has no column {spec!r}",
                store.root,
                f"available: {', '.join(available_columns(store)) or 'none'}",
            )
        teachers.setdefault(teacher, []).append(col)
    names = next((tuple(store.table(teacher_table(t)).meta["label_names"]) for t in teachers
                  if store.table(teacher_table(t)).meta.get("label_names")), None)
    return Columns(text_cols, label, {t: tuple(c) for t, c in teachers.items()}, names, pos, combined,
                   tuple(k for k in dict.fromkeys(parts) if k not in specs))


@dataclass
class DataConfig:
    """Everything that fixes the stream of batches (two runs with equal configs see equal batches)."""

    store: str
    columns: list[str]  # "<teacher>.<column>" or "label", from the objectives
    tokenizer: str  # teacher whose stored tokenizer the student uses
    tokenizer_dir: str | None = None  # that tokenizer outside the store (the --init student's own); None: the store's
    batch_size: int = BASE_DEFAULTS["batch_size"]
    max_length: int = BASE_DEFAULTS["max_length"]
    shuffle_buffer: int = 10_000
    val_percent: float = 2.0
    max_val_rows: int = 2_000
    seed: int = 0
    num_workers: int = 0
    chunk_rows: int = 4_096
    exclude: tuple[int, ...] = ()  # ids never trained or validated on (`kd leakage --exclude-out`)
    combined: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)  # Columns.combined
    bucket: bool = False  # batches of similar length within the shuffle buffer (less padding); trainer: on
    first_ids: bool = False  # the student's cut of a longer text (StudentConfig.first_ids)

    def tokenizer_path(self, store: Store) -> str:
        return self.tokenizer_dir or store.tokenizer_dir(self.tokenizer)


@dataclass
class Plan:
    """Row counts known before reading, from which every reader's batch count follows.

    `counts[k, p]` is the number of training rows of stripe p of shard k (rows whose index within
    the shard is p modulo `stripes`). Stripes exist only when there are more readers than shards.
    """

    cfg: DataConfig
    columns: Columns
    world: int
    counts: np.ndarray  # [num_shards, stripes] int64
    num_val: int
    excluded: int = 0  # rows left out by `cfg.exclude`

    @property
    def readers_per_rank(self) -> int:
        return max(1, self.cfg.num_workers)

    @property
    def stripes(self) -> int:
        return int(self.counts.shape[1])

    def units(self, epoch: int, rank: int, reader: int) -> list[tuple[int, int]]:
        """Work units (shard, stripe) of one reader in one epoch: a per-epoch permutation, dealt round-robin."""
        units = [(k, p) for k in range(self.counts.shape[0]) for p in range(self.stripes)]
        order = np.random.default_rng([self.cfg.seed, epoch, 0x5EED]).permutation(len(units))
        g, total = rank * self.readers_per_rank + reader, self.world * self.readers_per_rank
        return [units[i] for i in order[g::total]]

    def reader_batches(self, epoch: int, rank: int) -> list[int]:
        bs = self.cfg.batch_size
        return [
            math.ceil(sum(int(self.counts[k, p]) for k, p in self.units(epoch, rank, r)) / bs)
            for r in range(self.readers_per_rank)
        ]

    def steps(self, epoch: int) -> int:
        """Batches per rank in an epoch; under DDP the minimum over ranks, so no rank waits forever."""
        return min(sum(self.reader_batches(epoch, r)) for r in range(self.world))

    def train_rows(self) -> int:
        return int(self.counts.sum())


def canonical_order(batches: list[int]) -> list[int]:
    """Reader of each batch: round-robin over readers, skipping exhausted ones (DataLoader's own order)."""
    left, order = list(batches), []
    while any(left):
        for r, n in enumerate(left):
            if n:
                order.append(r)
                left[r] -= 1
    return order


def build_plan(store: Store, cfg: DataConfig, world: int = 1) -> Plan:
    """Read the `id` column of every shard once: train/val counts, and a check of every table read.

    Truncated or foreign shards fail here, in the main process, with the file named; so does a damaged
    tokenizer file (checked against its manifest sha256: it would otherwise mis-tokenize silently), and
    so does a NaN/Inf in any teacher column the objectives read (`_check_finite`), before any step.
    """
    if cfg.tokenizer_dir is None:  # (a student's own tokenizer was loaded and checked by the set-up)
        store.verify_folder("tokenizers", cfg.tokenizer)
    cols = resolve_columns(store, cfg.columns, cfg.combined)
    for t in cols.tables():
        store.require_complete(t)
    readers = world * max(1, cfg.num_workers)
    n_shards = store.manifest.num_shards
    stripes = max(1, math.ceil(readers / n_shards))
    counts = np.zeros((n_shards, stripes), dtype=np.int64)
    num_val = excluded = 0
    for k in range(n_shards):
        for teacher, names in cols.teachers.items():
            need = ["id", *names]
            _check_footer(store, teacher_table(teacher), k, need)
            _check_finite(store, teacher_table(teacher), k, need, cfg.chunk_rows)
        ids = _open(store, "texts", k).read(columns=["id"]).column("id").to_numpy()
        train, val = split_rows(ids, cfg)
        num_val += int(val.sum())
        excluded += len(ids) - int(train.sum()) - int(val.sum())
        counts[k] = np.bincount(np.nonzero(train)[0] % stripes, minlength=stripes)
    if cfg.exclude and not excluded:
        # an id file that names no row left nothing out: written for another store, or not kd's ids at all
        raise InputError(f"none of the {len(cfg.exclude):,} ids in --exclude-ids is a row of this store, so nothing "
                         "would be left out", "--exclude-ids", f"write the file for this store: kd leakage "
                         f"{store.root} --exclude-out FILE")
    return Plan(cfg, cols, world, counts, num_val, excluded)


def _open(store: Store, table: str, k: int, verify: bool = True) -> pq.ParquetFile:
    """Shard k of a table; its bytes are checked against the manifest (sha256) unless only the footer is read."""
    rec = store.shard_record(table, k)
    path = store.path_of(rec.file)
    try:
        if verify:
            data = store.read_verified(rec)
            store.check_schema(table, k, data)  # the declared column types, before numpy meets them
            return pq.ParquetFile(pa.BufferReader(data))
        return pq.ParquetFile(store.loc.fs.open_input_file(path))
    except (OSError, pa.ArrowException) as e:
        raise StoreError(
            f"cannot read shard {k} of table {table!r} ({e})", path,
            DAMAGED,
        ) from e


def _check_footer(store: Store, table: str, k: int, columns: list[str]) -> None:
    pf = _open(store, table, k, verify=False)  # footer only: the data is verified when it is read
    path = _shard_path(store, table, k)
    want = store.table(table).shards[k].rows
    if pf.metadata.num_rows != want:
        raise StoreError(
            f"shard {k} of table {table!r} has {pf.metadata.num_rows} rows, the manifest says {want}",
            path, DAMAGED,
        )
    missing = [c for c in columns if c not in pf.schema_arrow.names]
    if missing:
        raise StoreError(f"shard {k} of table {table!r} lacks columns {missing}", path,
                         DAMAGED)


def _check_finite(store: Store, table: str, k: int, columns: list[str], chunk_rows: int) -> None:
    """Refuse NaN/Inf targets, naming table, shard, column and row id: one such row makes every weight NaN.

    kd precompute never commits them; this catches stores from older versions or other writers. It reads
    the target columns once more (verified, chunk by chunk, one vectorised `isfinite` per chunk): I/O only,
    no tokenizing, small next to an epoch of training.
    """
    for part in _batches(store, table, k, columns, chunk_rows):
        for c in columns[1:]:
            bad = unusable_rows(table_vectors(part, c, _shard_path(store, table, k)))
            if len(bad):
                raise StoreError(
                    f"column {c!r} of table {table!r} is not finite (NaN/Inf) or out of range (|value| > "
                    f"{MAX_ABS:g}) in shard {k}, first at row id {int(part.column('id')[int(bad[0])].as_py())} "
                    f"({len(bad)} row(s) in this chunk)",
                    _shard_path(store, table, k),
                    DAMAGED)


def read_aligned(store: Store, cols: Columns, k: int, chunk_rows: int) -> Iterator[dict[str, np.ndarray]]:
    """Chunks of shard k of every needed table, zipped row for row, ids checked equal.

    Yields {"id", text columns (object arrays), "label", "<teacher>.<column>" float32 arrays}.
    """
    tables = cols.tables()
    wanted = {"texts": ["id", *cols.texts, *([LABEL] if cols.label else [])]}
    wanted.update({teacher_table(t): ["id", *c] for t, c in cols.teachers.items()})
    iters = {t: _batches(store, t, k, wanted[t], chunk_rows) for t in tables}
    row0 = sum(store.table("texts").shards[j].rows for j in range(k))  # POS of the next row
    pending: dict[str, pa.RecordBatch | None] = dict.fromkeys(tables)
    while True:
        for t in tables:
            if pending[t] is None or pending[t].num_rows == 0:
                pending[t] = next(iters[t], None)
        if any(pending[t] is None for t in tables):
            if not all(pending[t] is None for t in tables):
                short = next(t for t in tables if t != "texts" and (pending[t] is None) != (pending["texts"] is None))
                raise _misaligned(store, k, short, "has another number of rows than 'texts'")
            return
        n = min(pending[t].num_rows for t in tables)
        parts = {t: pending[t].slice(0, n) for t in tables}
        pending = {t: pending[t].slice(n) for t in tables}
        yield _zip_chunk(store, cols, k, parts, row0)
        row0 += n


def _zip_chunk(store: Store, cols: Columns, k: int, parts: dict[str, pa.RecordBatch],
               row0: int) -> dict[str, np.ndarray]:
    """One chunk of equally long record batches of shard k (one per table) as read_aligned's dict; every
    teacher batch's ids must equal the texts batch's (`row0`: the shard-wide position of its first row)."""
    ids = parts["texts"].column("id").to_numpy()
    chunk: dict[str, np.ndarray] = {"id": ids}
    if cols.pos:
        chunk[POS] = np.arange(row0, row0 + len(ids), dtype=np.int64)
    for c in cols.texts:
        chunk[c] = parts["texts"].column(c).to_numpy(zero_copy_only=False)
    if cols.label:
        chunk[LABEL] = _labels(parts["texts"].column(LABEL), cols.label_names, store, k)
    for teacher, names in cols.teachers.items():
        t = teacher_table(teacher)
        other = parts[t].column("id").to_numpy()
        if not np.array_equal(other, ids):
            row = int(np.nonzero(other != ids)[0][0])
            raise _misaligned(store, k, t, f"has other ids than 'texts' (first difference at chunk row {row})")
        for c in names:
            chunk[column_key(teacher, c)] = table_vectors(parts[t], c, _shard_path(store, t, k))
    for key, members in cols.combined.items():
        chunk[key] = combine([chunk[m] for m, _ in members], [share for _, share in members])
    for key in cols.parts_only:
        del chunk[key]
    return chunk


def _misaligned(store: Store, k: int, table: str, what: str) -> StoreError:
    return StoreError(
        f"shard {k} of table {table!r} {what}: the tables are not aligned",
        _shard_path(store, table, k),
        "re-run the kd command that wrote this table with --overwrite",
    )


def _shard_path(store: Store, table: str, k: int) -> str:
    return store.loc.path(store.table(table).shards[k].file)


def _batches(store: Store, table: str, k: int, columns: list[str], rows: int) -> Iterator[pa.RecordBatch]:
    """Shard k of `table` in record batches of `columns`, plus the scale column of each int8 one."""
    pf = _open(store, table, k)
    try:
        yield from pf.iter_batches(batch_size=rows, columns=with_scales(columns, pf.schema_arrow.names))
    except (OSError, pa.ArrowException) as e:
        raise StoreError(
            f"cannot read shard {k} of table {table!r} ({e})", _shard_path(store, table, k),
            DAMAGED,
        ) from e


def _labels(col: pa.Array, names: tuple[str, ...] | None, store: Store, k: int) -> np.ndarray:
    """Class labels as int64 (missing: -1), scores as float (missing: NaN), strings via label_names."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        index = {n: i for i, n in enumerate(names or ())}
        unknown = sorted({v for v in col.to_pylist() if v is not None and v not in index})
        if unknown:
            raise InputError(
                f"labels {unknown[:5]} of shard {k} are not among the teacher's label names {list(names or [])}",
                store.root, "precompute with a teacher whose labels match, or with integer class labels",
            )
        return np.array([-1 if v is None else index[v] for v in col.to_pylist()], dtype=np.int64)
    if pa.types.is_integer(col.type):
        return col.fill_null(-1).to_numpy().astype(np.int64)
    return col.to_numpy(zero_copy_only=False).astype(np.float64)


def _select(chunk: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[idx] for k, v in chunk.items()}


def _concat(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return b if a is None else {k: np.concatenate([a[k], b[k]]) for k in b}


def _rows(chunk: dict[str, np.ndarray] | None) -> int:
    return 0 if chunk is None else len(chunk["id"])


def shuffled_rows(store: Store, plan: Plan, units: list[tuple[int, int]], rng: np.random.Generator,
                  tokens: Callable[[list[str]], np.ndarray] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Training rows of the units in batches of `batch_size` (last one partial), mixed by a block buffer.

    - Each new chunk joins the buffer, the buffer is permuted, and whole batches are taken from the
      front while more than `shuffle_buffer` rows would remain; the rest is flushed at the end.
    - So every emitted batch is a uniform sample of up to buffer + chunk rows, and the number of
      batches is ceil(rows / batch_size), as the plan predicts.
    - `tokens`: each text's token count, by which `--bucket` sorts (None: its characters).
    """
    cfg, bs = plan.cfg, plan.cfg.batch_size
    pool: dict[str, np.ndarray] | None = None
    for k, p in units:
        offset = 0
        for chunk in read_aligned(store, plan.columns, k, cfg.chunk_rows):
            n = _rows(chunk)
            pos = np.arange(offset, offset + n)
            offset += n
            keep = split_rows(chunk["id"], cfg)[0] & (pos % plan.stripes == p)
            pool = _concat(pool, _select(chunk, np.nonzero(keep)[0]))
            perm = rng.permutation(_rows(pool))  # indices, not a permuted copy: rows are copied once
            take = max(0, (_rows(pool) - cfg.shuffle_buffer) // bs) * bs
            for batch in _bucketed(pool, perm[:take], bs, plan.columns, rng, tokens) if cfg.bucket else \
                    (perm[s : s + bs] for s in range(0, take, bs)):
                yield _select(pool, batch)
            pool = _select(pool, perm[take:])
    if _rows(pool):
        rest = np.arange(_rows(pool))
        for batch in _bucketed(pool, rest, bs, plan.columns, rng, tokens) if cfg.bucket else \
                (rest[s : s + bs] for s in range(0, len(rest), bs)):
            yield _select(pool, batch)


def _bucketed(pool: dict[str, np.ndarray], rows: np.ndarray, bs: int, cols: Columns,
              rng: np.random.Generator, tokens: Callable[[list[str]], np.ndarray] | None) -> list[np.ndarray]:
    """Length buckets: the rows about to be emitted, sorted by token count, cut into batches, the batches
    in random order. Padding (a batch is as long as its longest text) shrinks while each batch is still
    a draw from the same buffer; only the batch order and membership depend on length, not the rows used.
    """
    if len(rows) <= bs:
        return [rows] if len(rows) else []
    lengths = np.zeros(len(rows), dtype=np.int64)
    for c in cols.texts:
        texts = list(pool[c][rows])
        # Tokens, not characters: on the frontier corpus characters per token vary ~2x between texts (numbers,
        # names, other scripts), so batches sorted by characters were still 28 % padding against 2 % by tokens
        # (4,096-row buckets, MiniLM's tokenizer, 40,000 rows). Counting them costs a second tokenization of each
        # row, a few ms per 64 batches.
        n = tokens(texts) if tokens else np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        lengths = np.maximum(lengths, n)
    batches = [rows[b] for b in length_batches(lengths, bs)]
    full = [b for b in batches if len(b) == bs]  # a partial batch stays last, as without buckets
    return [full[i] for i in rng.permutation(len(full))] + [b for b in batches if len(b) < bs]


def length_batches(lengths: np.ndarray, bs: int) -> list[np.ndarray]:
    """Positions into `lengths`, sorted by length and cut into batches of `bs` (the last one partial): the batches of
    a length bucket (`_bucketed` then shuffles their order)."""
    by_length = np.argsort(lengths, kind="stable")
    return [by_length[s : s + bs] for s in range(0, len(by_length), bs)]


def bucketed_padding(lengths: np.ndarray, bs: int) -> float:
    """The share of token slots that are padding when rows of these lengths are batched in one length bucket (each
    batch as long as its longest row): what `--bucket` leaves over a shuffle buffer of that many rows."""
    lengths = np.asarray(lengths, dtype=np.int64)
    slots = sum(len(b) * int(lengths[b].max()) for b in length_batches(lengths, bs))
    return 1.0 - float(lengths.sum()) / max(1, slots)


class Tokenize:
    """Rows -> model batch: tokenized text(s), id, targets and labels as tensors (see module contract)."""

    def __init__(self, tokenizer_dir: str, max_length: int, tokenizer: Any = None, first_ids: bool = False) -> None:
        """`tokenizer`: the one training set-up loaded from `tokenizer_dir` (then not loaded again); `first_ids`:
        the student's cut (`StudentConfig.first_ids`)."""
        self.dir, self.max_length, self.first_ids = tokenizer_dir, max_length, first_ids
        self._tok = tokenizer
        self._fast: FastTokenizer | None = None

    @property
    def tokenizer(self):
        if self._tok is None:  # loaded lazily: each DataLoader worker loads its own copy
            self._tok = load_tokenizer(self.dir, file_repair(os.path.dirname(os.path.dirname(self.dir))))
        return self._tok

    @property
    def fast(self) -> FastTokenizer:
        if self._fast is None:
            self._fast = FastTokenizer.from_transformers(self.tokenizer, self.dir)
        return self._fast

    def count(self, texts: list[str]) -> np.ndarray:
        """Each text's token count as the student sees it (truncated at max_length): what length buckets sort by."""
        rows = self.fast.encode(texts, max_length=self.max_length, first_ids=self.first_ids)["input_ids"]
        return np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))

    def encode(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """The student's batch: the ids its `encode` gives these texts (common/fast_tokenizer.py), right-padded."""
        rows = self.fast.encode(texts, max_length=self.max_length, first_ids=self.first_ids)["input_ids"]
        ids, mask = pad_rows(rows, self.fast.settings.pad_id)
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}

    def __call__(self, rows: dict[str, np.ndarray], cols: Columns) -> dict[str, torch.Tensor]:
        batch: dict[str, torch.Tensor] = {"id": torch.from_numpy(np.ascontiguousarray(rows["id"]))}
        if cols.pairs:
            for side, c in zip("ab", cols.texts):
                batch.update({f"{side}.{k}": v for k, v in self.encode(list(rows[c])).items()})
        else:
            batch.update(self.encode(list(rows[cols.texts[0]])))
        for key, v in rows.items():
            if key in ("id", *cols.texts):
                continue
            arr = np.ascontiguousarray(v)
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32, copy=False)
            batch[key] = torch.from_numpy(arr)
        return batch


class TrainStream(IterableDataset):
    """One epoch of one rank: each DataLoader worker is one reader with its own units and shuffle RNG."""

    def __init__(self, store: Store, plan: Plan, epoch: int, rank: int, skip: list[int],
                 tokenizer: Any = None) -> None:
        self.store, self.plan, self.epoch, self.rank, self.skip = store, plan, epoch, rank, skip
        self.tokenize = Tokenize(plan.cfg.tokenizer_path(store), plan.cfg.max_length, tokenizer, plan.cfg.first_ids)

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        reader = 0 if info is None else info.id
        units = self.plan.units(self.epoch, self.rank, reader)
        g = self.rank * self.plan.readers_per_rank + reader
        rng = np.random.default_rng([self.plan.cfg.seed, self.epoch, g])
        for i, rows in enumerate(shuffled_rows(self.store, self.plan, units, rng, self.tokenize.count)):
            if i < self.skip[reader]:
                continue  # resume: the rows were read (the buffer needs them) but are not tokenized
            batch = self.tokenize(rows, self.plan.columns)
            batch["_reader"] = reader
            yield batch


def train_batches(store: Store, plan: Plan, epoch: int, start: int, rank: int = 0,
                  tokenizer: Any = None, pin: bool = False) -> Iterator[dict]:
    """Batches [start, plan.steps(epoch)) of an epoch for one rank, in the canonical order (`tokenizer`: the
    plan's tokenizer if already loaded; DataLoader workers fork with it). `pin`: page-locked batches (training on a
    GPU), whose copies to it then run asynchronously beside the step (`non_blocking`)."""
    order = canonical_order(plan.reader_batches(epoch, rank))[: plan.steps(epoch)]
    skip = [order[:start].count(r) for r in range(plan.readers_per_rank)]
    if start >= len(order):
        return
    nw = plan.cfg.num_workers
    if nw:
        # Workers fork after the main process may have used a tokenizer; its thread pool is not fork-safe.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    loader = DataLoader(
        TrainStream(store, plan, epoch, rank, skip, tokenizer), batch_size=None, num_workers=nw,
        generator=torch.Generator(),  # keeps DataLoader from drawing on the global RNG (exact resume)
        prefetch_factor=2 if nw else None, pin_memory=pin,
        worker_init_fn=let_go_of_inherited_locks,  # a killed run's lock must not outlive it in its workers
    )
    waiting: list[deque] = [deque() for _ in range(plan.readers_per_rank)]
    it = iter(loader)
    try:
        for reader in order[start:]:
            while not waiting[reader]:
                b = next(it)
                waiting[b.pop("_reader")].append(b)
            yield waiting[reader].popleft()
    finally:
        del it  # shuts the workers down when the epoch is cut short (DDP minimum, max_steps)


def validation_batches(store: Store, plan: Plan, rank: int = 0, world: int = 1,
                       tokenizer: Any = None) -> list[dict]:
    """The held-out rows (first `max_val_rows` in shard order), tokenized once; rank r keeps batches r::world."""
    cfg = plan.cfg
    tok = Tokenize(cfg.tokenizer_path(store), cfg.max_length, tokenizer, cfg.first_ids)
    rows: dict[str, np.ndarray] | None = None
    for k in range(store.manifest.num_shards):
        if _rows(rows) >= cfg.max_val_rows or plan.num_val == 0:
            break
        for chunk in read_aligned(store, plan.columns, k, cfg.chunk_rows):
            rows = _concat(rows, _select(chunk, np.nonzero(split_rows(chunk["id"], cfg)[1])[0]))
            if _rows(rows) >= cfg.max_val_rows:
                break
    if not _rows(rows):
        return []
    n, bs = min(_rows(rows), cfg.max_val_rows), cfg.batch_size
    batches = [tok(_select(rows, np.arange(s, min(s + bs, n))), plan.columns) for s in range(0, n, bs)]
    return batches[rank::world]
