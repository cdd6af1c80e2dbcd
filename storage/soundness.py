"""The one check of a store's row plan, tables and shards that `kd validate` and every reader share (issue 48).

A re-forged store (every checksum and ids digest made to match) passed the readers while `kd validate` refused it,
or passed both: train-student trained on a forged `num_rows`, `kd index` ran without a texts table. So what
validate refuses here, readers refuse too, at two costs (docs/design.md, "Readers refuse what validate refuses"):
- cheap, on every open and every shard read: the manifest alone (`manifest_problems`: row plan, texts table,
  `meta.dim` against the declared column types) and a shard's Parquet footer (`shard_problems`: rows, declared
  columns and types, undeclared extra columns);
- expensive, in `kd validate` and where a reader holds the values anyway: every id a content hash of its text
  and none twice (`id_problems`), every vector component finite and within `common.finite.MAX_ABS`, a vocab
  output of the teacher's width (`vocab_problem`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from kd.common.ids import text_id, text_key
from kd.storage.manifest import Manifest, plan_problems, teacher_table
from kd.storage.schema import canonical_type, type_name, unlike_declared

# Teacher columns pooled from hidden states: their innermost width is the teacher's `meta.dim`. (`sentence` may
# pass a sentence-transformers Dense layer of another width, `logits` has one value per label.)
HIDDEN_COLUMNS = ("cls", "mean", "layers")
_WIDTH = re.compile(r"^\w+\[(\d+)\]")
# A duplicate text whose earlier copy --sample dropped keeps its occurrence number (common.ids): how many more
# occurrences a row of a sampled store may be past the copies the store holds before it.
SAMPLED_OCCURRENCES = 64


def manifest_problems(m: Manifest) -> list[str]:
    """What is wrong with a manifest on its own: its row plan (`plan_problems`), a missing texts table, a teacher
    table whose `meta.dim` is not the width of its hidden-state columns. Each is a sentence naming the field."""
    out = list(plan_problems(m))
    if "texts" not in m.tables:
        out.append("the manifest has no texts table (every table's rows are paired with it by id)")
    for teacher in sorted(m.teachers()):
        name = teacher_table(teacher)
        rec = m.tables[name]
        dim = rec.meta.get("dim")
        if dim is None:
            continue
        for col, typ in sorted(rec.columns.items()):
            width = _WIDTH.match(canonical_type(typ))
            if col.removesuffix("_a").removesuffix("_b") in HIDDEN_COLUMNS and width and int(width[1]) != dim:
                out.append(f"{name}: meta.dim is {dim!r} but column {col!r} is declared {canonical_type(typ)}")
    return out


def shard_problems(schema: pa.Schema, rows: int, recorded_rows: int, declared: dict[str, str]) -> list[str]:
    """What is wrong with a shard's footer against its record and its table's declared columns: another row count,
    a declared column missing or of another type, a column the manifest does not declare."""
    out = [f"{rows:,} rows, the manifest records {recorded_rows:,}"] if rows != recorded_rows else []
    out += [f"column {col!r} is missing" if have is None else f"column {col!r} is {have}, the manifest declares {want}"
            for col, have, want in unlike_declared(schema, declared)]
    out += [f"column {f.name!r} ({type_name(f.type)}) is not declared in the manifest"
            for f in schema if f.name not in declared]
    return out


def id_problems(shards: list[pa.Table], pairs: bool, sampled: bool) -> list[tuple[int, str]]:
    """(shard, what) for rows of the texts table, in store order, whose id is there twice or is not the content
    hash `kd precompute` gives its text (`common.ids`: blake2b of occurrence and text); the first of each kind.
    `sampled`: --sample may have dropped earlier copies of a text, so a few later occurrences are accepted."""
    seen: Counter[str] = Counter()
    ids: set[int] = set()
    dup = wrong = None
    for k, table in enumerate(shards):
        cols = [table[c].to_pylist() for c in (("text_a", "text_b") if pairs else ("text",))]
        for i, row_id in enumerate(table["id"].to_pylist()):
            key = text_key((cols[0][i], cols[1][i]) if pairs else cols[0][i])
            if dup is None and row_id in ids:
                dup = (k, f"id {row_id} appears twice (row {i} of shard {k} and an earlier row)")
            ids.add(row_id)
            if wrong is None and not _is_hash(row_id, key, seen[key], sampled):
                wrong = (k, f"id {row_id} (row {i} of shard {k}) is not the content hash of its text "
                            f"{_clip(key)!r}")
            seen[key] += 1
    return [p for p in (dup, wrong) if p is not None]


def _is_hash(row_id: int, key: str, before: int, sampled: bool) -> bool:
    last = before + (SAMPLED_OCCURRENCES if sampled else 0)
    return any(text_id(key, j) == row_id for j in range(before, last + 1))


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."


def vocab_problem(tensors: dict[str, Any], dim: Any) -> str | None:
    """What is wrong with a teacher's `vocab` output (pipeline.vocab: `vectors` [tokens, dim] float32 and
    `token_ids` 0..tokens-1), against the teacher's `meta.dim`; None when it has that shape."""
    vecs, ids = tensors.get("vectors"), tensors.get("token_ids")
    if vecs is None or ids is None:
        return "the vocab output lacks its 'vectors' or 'token_ids' tensor"
    if vecs.ndim != 2 or vecs.dtype != np.float32 or len(vecs) == 0:
        return f"the vocab output's vectors are {vecs.dtype} {list(vecs.shape)}, not a float32 [tokens, dim] matrix"
    if isinstance(dim, int) and vecs.shape[1] != dim:
        return f"the vocab output's vectors are {vecs.shape[1]} wide, the teacher's dim is {dim}"
    if ids.shape != (len(vecs),):
        return f"the vocab output has {len(vecs):,} vectors but {ids.size:,} token ids"
    return None
