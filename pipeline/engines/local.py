"""`kd precompute --engine local`: this process encodes its shards, one writer thread commits them.

- declare `texts` and every teacher (its settings from this process's copy); writer 0 saves each teacher's
  tokenizer files and input embeddings;
- `plan_units` over the shards this writer owns: what the store has not committed yet;
- shard by shard, commit the texts shard, then encode it with each teacher (length-sorted token-budget batches,
  order restored; with --reuse only the rows the other store lacks, `reuse.encode_reusing`) and hand the table
  to the writer thread; at most one encoded shard waits for that thread while the next is computed, so memory
  stays bounded;
- while a unit (shard, teacher) runs its forward pass, a tokenizer thread tokenizes the next one: on a GPU the
  device otherwise idles while the host tokenizes each shard (the Rust tokenizer releases the GIL, so the
  two overlap on any machine with a core to spare);
- publish the merged manifest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa

from kd.common.progress import Bar
from kd.pipeline.engines.plan import UnitPlan, plan_units
from kd.pipeline.engines.shards import (
    PrecomputeSummary,
    Prepared,
    columns,
    commit_texts,
    declare_teacher,
    declare_texts,
    encode_shard,
    save_teacher_files,
    shard_texts,
)
from kd.pipeline.reuse import encode_reusing
from kd.pipeline.teacher.batches import Tokenized, compute_signature, tokenize
from kd.pipeline.teacher.model import Teacher
from kd.pipeline.teacher.partial import Partial, clear_table, partial_key
from kd.storage.alignment import ids_digest
from kd.storage.manifest import ShardRecord, settings


def write(ctx: Prepared) -> PrecomputeSummary:
    """Write what is left of this writer's shards (see the module docstring); the run's summary."""
    summary = ctx.summary()
    declare_texts(ctx)
    for t in ctx.teachers:
        declare_teacher(ctx, t, t.meta(ctx.outputs[t.name], ctx.job.vdtype.value))
        if ctx.index == 0:
            summary.files_written += save_teacher_files(ctx.writer, t)
    todo = plan_units(ctx.existing, ctx.plan, ctx.names, ctx.owned)
    summary.shards_skipped = todo.skipped
    t = time.perf_counter()
    _encode_and_commit(ctx, todo, summary)
    summary.encode_seconds = time.perf_counter() - t
    summary.shards_written = todo.shards
    ctx.writer.publish()
    summary.seconds = time.perf_counter() - ctx.t0
    return summary


def _encode_and_commit(ctx: Prepared, todo: UnitPlan, summary: PrecomputeSummary) -> None:
    """Encode on this thread, tokenize the next unit on a second, commit on a third, shard by shard
    (`UnitPlan.shard_major`)."""
    by_name = {t.name: t for t in ctx.teachers}
    pending: list[Future] = []
    with (ThreadPoolExecutor(max_workers=1) as pool, ThreadPoolExecutor(max_workers=1) as tokenizer,
          Bar("precompute", todo.rows, "rows", ctx.job.progress) as bar):
        def prepare(unit: tuple[int, str | None]) -> _Ready | None:
            k, name = unit
            return None if name is None else _prepare(ctx, by_name[name], k)

        for (k, name), ready in _ahead(tokenizer, prepare, todo.shard_major()):
            if name is None:
                pending.append(pool.submit(commit_texts, ctx, k))
                continue
            partial = _partial(ctx, by_name[name], k, ready)
            table, truncated, reused = _encode(ctx, by_name[name], k, bar, ready, partial)
            summary.truncated += truncated
            summary.rows_computed += table.num_rows - reused
            summary.rows_reused += reused
            # Bound memory: at most one shard waits for the writer thread while the next is computed.
            while len(pending) > 1:
                summary.bytes_written += pending.pop(0).result().bytes
            pending.append(pool.submit(_commit, ctx, f"teachers/{name}", k, table, partial))
        for f in pending:
            summary.bytes_written += f.result().bytes
    if ctx.writer.loc.is_local:  # every owned shard is committed: nothing a kill between commit and clear left
        for t in ctx.teachers:
            clear_table(ctx.writer.loc.root, f"teachers/{t.name}")


def _commit(ctx: Prepared, table: str, k: int, rows: pa.Table, partial: Partial | None) -> ShardRecord:
    record = ctx.writer.commit(table, k, rows)
    if partial is not None:  # (a kill before this line leaves parts the run's end removes)
        partial.clear()
    return record


def _partial(ctx: Prepared, t: Teacher, k: int, ready: _Ready) -> Partial | None:
    """Where shard k of `t` keeps its finished batches until committed (a local store). Keyed by the ids of the
    rows to encode: with --reuse those depend on the other store, and another one's batches are never mixed in."""
    if not ctx.writer.loc.is_local:
        return None
    key = partial_key(settings(t.meta(ctx.outputs[t.name], ctx.job.vdtype.value)), ids_digest(ready.rows["id"]),
                      [side.batches for side in ready.tokens.sides], compute_signature(t))
    return Partial(ctx.writer.loc.root, f"teachers/{t.name}", k, key)


T = TypeVar("T")
R = TypeVar("R")
_END = object()


def _ahead(pool: ThreadPoolExecutor, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) in order, fn of the next item running on `pool` while the caller works on this one."""
    it = iter(items)
    item = next(it, _END)
    future = pool.submit(fn, item) if item is not _END else None
    while future is not None:
        nxt = next(it, _END)
        after = pool.submit(fn, nxt) if nxt is not _END else None
        yield item, future.result()
        item, future = nxt, after


@dataclass(frozen=True)
class _Ready:
    """A unit's rows to encode (all of its texts shard, or with --reuse those the other store lacks), tokenized."""

    rows: pa.Table
    tokens: Tokenized


def _prepare(ctx: Prepared, t: Teacher, k: int) -> _Ready:
    """What a teacher's forward pass needs of shard k, computed without the model (so on another thread)."""
    shard = ctx.texts_shard(k)
    rows = shard.take(pa.array(ctx.reuse[t.name].new_rows(shard))) if t.name in ctx.reuse else shard
    return _Ready(rows, tokenize(t, shard_texts(rows, ctx.pairs), ctx.job.batch_tokens))


def _encode(ctx: Prepared, t: Teacher, k: int, bar: Bar, ready: _Ready,
            partial: Partial | None) -> tuple[pa.Table, int, int]:
    """Teacher `t`'s table of shard k: (table, rows truncated, rows taken from the --reuse store)."""
    def encode(rows: pa.Table) -> tuple[pa.Table, int]:
        assert rows["id"].equals(ready.rows["id"]), "the rows tokenized ahead are the rows to encode"
        return encode_shard(t, ctx.outputs[t.name], k, rows, ctx.pairs, ctx.job.vdtype, ctx.job.batch_tokens,
                            bar.advance, ready.tokens, partial, bar.skip)

    if t.name not in ctx.reuse:
        return (*encode(ready.rows), 0)
    cols = list(columns(t, ctx.outputs[t.name], ctx.pairs, ctx.job.vdtype))
    shard = ctx.texts_shard(k)
    bar.skip(shard.num_rows - ready.rows.num_rows)  # copied, not encoded: before the encoding, for its ETA
    table, truncated, reused = encode_reusing(ctx.reuse[t.name], shard, cols, encode)
    return table, truncated, reused
