"""Pure planning: which shards a writer owns, which of them are left to write, how a shard is cut into
batches. No I/O here.

- Rows are cut into contiguous shards of `shard_rows`; shard k belongs to writer k % num_writers,
  so ranks of torchrun (or --shard-index) write disjoint shards of one store.
- What is left (`plan_units`): every owned `texts` shard and every owned (teacher, shard) unit that the
  store's merged manifest does not record as committed; a resume redoes exactly these.
- Inside a shard, rows are cut into token-budget batches (`common/token_batches.py`, shared with the
  students' encode).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from kd.storage.manifest import Manifest


@dataclass(frozen=True)
class ShardPlan:
    num_rows: int
    shard_rows: int

    @property
    def num_shards(self) -> int:
        return max(1, math.ceil(self.num_rows / self.shard_rows))

    def bounds(self, k: int) -> tuple[int, int]:
        return k * self.shard_rows, min(self.num_rows, (k + 1) * self.shard_rows)

    def size(self, k: int) -> int:
        lo, hi = self.bounds(k)
        return hi - lo

    def owned(self, shard_index: int, num_writers: int) -> list[int]:
        return [k for k in range(self.num_shards) if k % num_writers == shard_index]


def writer_rank(num_shards: int | None, shard_index: int | None) -> tuple[int, int]:
    """(index, count) from explicit options, else from torchrun's RANK/WORLD_SIZE, else (0, 1)."""
    if num_shards is not None and num_shards < 1:
        raise ValueError(f"--num-shards {num_shards} must be >= 1 (the number of writers)")
    if num_shards is not None or shard_index is not None:
        n, i = num_shards or 1, shard_index or 0
    else:
        n, i = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    if not 0 <= i < n:
        raise ValueError(f"--shard-index {i} must be in [0, {n})")
    return i, n


@dataclass(frozen=True)
class Unit:
    teacher: str  # teacher name (table teachers/<name>)
    shard: int


@dataclass(frozen=True)
class UnitPlan:
    texts: list[int]  # texts shards left to commit
    units: list[Unit]  # (teacher, shard) left to encode, teacher-major
    rows: int  # rows the units encode
    skipped: int = 0  # shards whose texts and every teacher's rows are already committed

    @property
    def empty(self) -> bool:
        return not self.texts and not self.units

    @property
    def shards(self) -> int:
        """How many shards (row ranges) this run commits something of: its texts or a teacher's rows. A user counts
        shards, not tables: 3 shards of 2 teachers left are "3 shards", not 6 units."""
        return len(set(self.texts) | {u.shard for u in self.units})

    def shard_major(self) -> list[tuple[int, str | None]]:
        """Everything left as (shard, teacher), shard by shard: a shard's texts (teacher None) first, then its
        teachers in the planned order (the one-process engine's order: a killed run leaves whole shards)."""
        rank = {t: i for i, t in enumerate(dict.fromkeys(u.teacher for u in self.units))}
        todo: list[tuple[int, str | None]] = [(k, None) for k in self.texts]
        todo += [(u.shard, u.teacher) for u in self.units]
        return sorted(todo, key=lambda x: (x[0], -1 if x[1] is None else rank[x[1]]))


def plan_units(existing: Manifest | None, plan: ShardPlan, teachers: list[str],
               owned: list[int] | None = None) -> UnitPlan:
    """What is left of the `owned` shards (default: all): texts shards and (teacher, shard) units not committed
    in `existing` (the merged manifest; None: a new store)."""
    tables = existing.tables if existing else {}
    shards = list(range(plan.num_shards)) if owned is None else owned

    def left(table: str) -> list[int]:
        done = tables[table].shards if table in tables else {}
        return [k for k in shards if k not in done]

    texts = left("texts")
    units = [Unit(t, k) for t in teachers for k in left(f"teachers/{t}")]
    rows = sum(plan.size(u.shard) for u in units)
    todo = UnitPlan(texts, units, rows)
    return replace(todo, skipped=len(shards) - todo.shards)
