"""The writing steps both precompute engines share: what they write from, and how a shard becomes a commit.

- `Prepared`: the job plus what `precompute.run` prepared from it (the open writer, the loaded teachers and
  their outputs, this writer's rows, the shard plan, the row counts, the start time);
- tables are declared before any shard is committed: `texts`, and `teachers/<name>` with the settings that
  encode it (a store holding the teacher with other settings is refused);
- a teacher shard is its texts shard encoded (`encode_shard`: tokenized, unless the engine did that ahead,
  then length-sorted token-budget batches, order restored), refused if any vector is NaN/Inf in the dtype it
  is stored in, then committed by the writer (temp file, fsync, rename, record);
- per-teacher files (tokenizer, input embeddings, vocab, init) are written once, their sha256 recorded in the
  manifest's `extras.files`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
from safetensors.numpy import save

from kd.common.errors import StoreError
from kd.common.layers import parse_layers
from kd.common.progress import Bar
from kd.pipeline.engines.plan import ShardPlan
from kd.pipeline.grow import teacher_differences
from kd.pipeline.job import PrecomputeJob
from kd.pipeline.reuse import ReuseSource
from kd.pipeline.rows import RowCounts
from kd.pipeline.teacher.batches import Tokenized, forward_all, input_embeddings, tokenize
from kd.pipeline.teacher.keep_layers import folder_name, init_files
from kd.pipeline.teacher.model import Output, Teacher
from kd.pipeline.teacher.partial import Partial
from kd.storage import fs
from kd.storage.manifest import Manifest, ShardRecord, same_settings
from kd.storage.schema import VectorDType, column_types, type_name, vector_columns
from kd.storage.store import FRAGMENTS, StoreWriter, shard_file


@dataclass
class PrecomputeSummary:
    store: str
    rows_total: int
    rows_computed: int = 0  # rows the teachers encoded
    rows_reused: int = 0  # rows copied from the --reuse store instead
    shards_written: int = 0
    shards_skipped: int = 0
    empty_dropped: int = 0
    duplicates_dropped: int = 0
    truncated: int = 0
    seconds: float = 0.0
    encode_seconds: float = 0.0  # of `seconds`, the encoding and committing of rows (the rest: loading, reading)
    bytes_written: int = 0
    teachers: list[str] = field(default_factory=list)
    vocab_written: list[str] = field(default_factory=list)  # teachers whose `vocab` output was computed
    files_written: list[str] = field(default_factory=list)  # tokenizer / input-embedding files (re)written
    retried: int = 0  # --engine ray: units run again because the worker running them died
    rows_per_node: dict[str, int] = field(default_factory=dict)  # --engine ray: rows committed per Ray node id

    @property
    def nothing_to_do(self) -> bool:
        return self.shards_written == 0 and not self.vocab_written and not self.files_written

    @property
    def rate(self) -> float:
        return self.rows_computed / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class Prepared:
    """What an engine writes from: the job, and what was prepared from it before the writer opened."""

    job: PrecomputeJob
    writer: StoreWriter
    teachers: list[Teacher]  # loaded, in --teacher order
    outputs: dict[str, list[Output]]  # teacher name -> its row outputs
    rows: pa.Table  # this writer's texts rows: its owned shards, concatenated in order
    plan: ShardPlan
    owned: list[int]  # the shards this writer writes
    index: int  # this writer's rank; rank 0 writes the per-teacher files
    counts: RowCounts
    pairs: bool
    t0: float  # when the run started (perf_counter)
    reuse: dict[str, ReuseSource] = field(default_factory=dict)  # teacher name -> its rows in the --reuse store

    @property
    def existing(self) -> Manifest | None:
        """The store's merged manifest as the writer found it (None: new, or wiped by --overwrite)."""
        return self.writer.existing

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.teachers]

    def summary(self) -> PrecomputeSummary:
        return PrecomputeSummary(self.writer.loc.root, self.plan.num_rows, empty_dropped=self.counts.empty_dropped,
                                 duplicates_dropped=self.counts.duplicates_dropped, teachers=self.names)

    @cached_property
    def position(self) -> dict[int, int]:
        """Owned shard -> its place in `rows` (in shards)."""
        return {k: i for i, k in enumerate(self.owned)}

    def texts_shard(self, k: int) -> pa.Table:
        """Owned shard k of the `texts` rows."""
        return self.rows.slice(self.position[k] * self.plan.shard_rows, self.plan.size(k))


def declare_texts(ctx: Prepared) -> None:
    ctx.writer.declare("texts", "texts", {f.name: type_name(f.type) for f in ctx.rows.schema}, {"pairs": ctx.pairs})


def commit_texts(ctx: Prepared, k: int) -> ShardRecord:
    return ctx.writer.commit("texts", k, ctx.texts_shard(k))


def declare_teacher(ctx: Prepared, t: Teacher, meta: dict) -> None:
    """Declare table teachers/<name> with `meta` (what the encoding process reports), refusing a store that
    already has this teacher written with other settings."""
    name = f"teachers/{t.name}"
    old = ctx.existing.tables.get(name) if ctx.existing else None
    if old is not None and old.meta and not same_settings(old.meta, meta):
        raise StoreError(f"the store already has teacher {t.name!r} written with other settings "
                         f"({teacher_differences(old.meta, meta)})", ctx.writer.loc.root,
                         "pass the store's settings (kd info STORE shows them), another name (--teacher NEW=PATH), "
                         "or a new --out")
    ctx.writer.declare(name, "teacher", columns(t, ctx.outputs[t.name], ctx.pairs, ctx.job.vdtype), meta)


def stored_backend(existing: Manifest | None, name: str) -> str | None:
    """The backend the store holds teacher `name`'s table with (None: not in the store). Stores from before
    `backend` was recorded ran torch."""
    rec = existing.tables.get(f"teachers/{name}") if existing is not None else None
    return rec.meta.get("backend", "torch") if rec is not None and rec.meta else None


def columns(t: Teacher, outputs: list[Output], pairs: bool, dtype: VectorDType) -> dict[str, str]:
    """The column types of table teachers/<name>: one vector column per output (and side of a pair)."""
    shapes = {Output.cls: (t.dim,), Output.mean: (t.dim,), Output.sentence: (t.dim,),
              Output.layers: (t.num_layers + 1, t.dim), Output.logits: (len(t.label_names or []),)}
    cols = {"id": "int64", "n_tokens": "int32", "truncated": "bool"}
    sides = ("",) if (not pairs or t.has_head) else ("_a", "_b")
    for o in outputs:
        for s in sides:
            cols |= column_types(o.value + s, shapes[o], stored_dtype(o.value, dtype))
    return cols


def stored_dtype(column: str, dtype: VectorDType) -> VectorDType:
    """The dtype column `column` is stored in: `logits` stay float32 under int8 (a few numbers per row, and
    soft targets under a temperature are too sensitive to quantisation error to save so little)."""
    return VectorDType.float32 if dtype is VectorDType.int8 and column == Output.logits.value else dtype


def shard_texts(shard: pa.Table, pairs: bool) -> list:
    """The texts of a `texts` shard as the tokenizer takes them: strings, or (a, b) pairs."""
    return list(zip(shard["text_a"].to_pylist(), shard["text_b"].to_pylist())) if pairs else shard["text"].to_pylist()


def encode_shard(t: Teacher, outputs: list[Output], k: int, shard: pa.Table, pairs: bool, vdtype: VectorDType,
                 batch_tokens: int | None, on_batch=None, tokens: Tokenized | None = None,
                 partial: Partial | None = None, on_kept=None) -> tuple[pa.Table, int]:
    """Shard k of teacher table `t` from its `texts` shard: (the table to commit, how many rows were truncated).
    `tokens`: the shard already tokenized for `t` (the local engine does it ahead, on another thread); `partial`:
    where its finished batches are kept until the commit (pipeline/teacher/partial.py; `on_kept` gets the number
    of rows a killed run kept). Non-finite vectors are refused before anything is committed."""
    tokens = tokens or tokenize(t, shard_texts(shard, pairs), batch_tokens)
    vecs = forward_all(t, tokens, outputs, on_batch, partial, on_kept)
    # Cast once, to what is stored: the finiteness check then sees float16 overflow, and the Arrow columns
    # are built from the cast arrays without a second copy.
    stored = {c: _as_stored(v, stored_dtype(c, vdtype)) for c, v in vecs.items()}
    refuse_non_finite(t.name, k, shard, pairs, stored)
    trunc = tokens.n_tokens > t.max_length
    cols = {"id": shard["id"], "n_tokens": pa.array(tokens.n_tokens), "truncated": pa.array(trunc)}
    for c, v in stored.items():
        cols |= vector_columns(c, v, stored_dtype(c, vdtype))
    return pa.table(cols), int(trunc.sum())


def _as_stored(v: np.ndarray, dtype: VectorDType) -> np.ndarray:
    """float32 vectors in their stored float dtype; int8 keeps float32 (`vector_columns` quantises it). An
    overflow becomes inf silently here: `refuse_non_finite` reports it with the rows it hit."""
    if dtype is VectorDType.int8:
        return v
    with np.errstate(over="ignore"):
        return v.astype(dtype.value, copy=False)


def refuse_non_finite(teacher: str, k: int, shard: pa.Table, pairs: bool, vecs: dict[str, np.ndarray]) -> None:
    """Stop before committing NaN/Inf vectors (an fp16 overflow, a broken checkpoint): they would train an
    all-NaN student without any error. `vecs` are in the dtype they are stored in (int8: the float32 vectors
    before quantisation), so a float16 overflow is caught too."""
    for col, v in vecs.items():
        bad = ~np.isfinite(v)
        rows = np.nonzero(bad.reshape(len(bad), -1).any(axis=1))[0]
        if len(rows):
            ids, texts = shard["id"].to_pylist(), shard_texts(shard, pairs)  # (only to name the rows)
            show = "; ".join(f"id {ids[i]}: {str(texts[i])[:60]!r}" for i in rows[:3])
            raise StoreError(
                f"teacher {teacher!r} produced {len(rows)} non-finite (NaN/Inf) {col!r} vector(s) in shard {k} "
                f"({show}); nothing of this shard was committed", teacher,
                "use --precision fp32 (fp16/bf16 can overflow) and --dtype float32, or check the teacher checkpoint")


def remove_own_temps(writer: StoreWriter, teachers: list[str], owned: list[int]) -> None:
    """Delete temp files a killed or failed run of this writer left (its shards and fragment; any older
    than an hour elsewhere), so they do not take disk space forever."""
    mine = {shard_file(table, k) for k in owned for table in ["texts", *(f"teachers/{t}" for t in teachers)]}
    fs.remove_temps(writer.loc, mine | {f"{FRAGMENTS}/{writer.writer_id}.json"})


# --- per-teacher files ------------------------------------------------------------------------------------------

def record_files(writer: StoreWriter, files: dict[str, bytes]) -> None:
    """Write `files` (store-relative path -> bytes) atomically, then their sha256 into `extras.files`."""
    for rel, data in files.items():
        fs.atomic_write_bytes(writer.loc, data, *rel.split("/"))
    if files:
        writer.set_extra("files", {**writer.manifest.extras.get("files", {}),
                                   **{rel: fs.sha256(data) for rel, data in files.items()}})


def save_teacher_files(writer: StoreWriter, t: Teacher) -> list[str]:
    """Tokenizer files (no weights) and the input-embedding matrix, once per teacher, with their sha256
    in the manifest (`extras.files`) so training refuses a damaged tokenizer instead of mis-tokenizing.

    Written when absent: on the first run, and on the run after `kd validate --repair` set a damaged
    one aside (a tokenizer as a whole folder). Returns the files written."""
    files: dict[str, bytes] = {}
    if not fs.exists(writer.loc, "tokenizers", t.name, "tokenizer_config.json"):
        with contextlib.ExitStack() as stack:
            folder = t.tokenizer_folder  # the cache record's copy: the bytes save_pretrained wrote when measured
            if folder is None:
                folder = stack.enter_context(tempfile.TemporaryDirectory())
                t.tokenizer.save_pretrained(folder)
            for f in sorted(os.listdir(folder)):
                with open(os.path.join(folder, f), "rb") as fh:
                    files[f"tokenizers/{t.name}/{f}"] = fh.read()
    if not fs.exists(writer.loc, "teachers", t.name, "input_embeddings.safetensors"):
        files[f"teachers/{t.name}/input_embeddings.safetensors"] = save({"weight": input_embeddings(t)})
    record_files(writer, files)
    return sorted(files)


def write_init(writer: StoreWriter, t: Teacher, keep_layers: str | None) -> bool:
    """Write teachers/<name>/init-<layers>/ (embeddings + kept layers, config) once, checksummed."""

    layers = parse_layers(keep_layers, t.num_layers, "--keep-layers")
    base = f"teachers/{t.name}/{folder_name(layers)}"
    known = writer.manifest.extras.get("files", {})
    if all(f"{base}/{f}" in known and fs.exists(writer.loc, base, f) for f in ("model.safetensors", "config.json")):
        return False
    record_files(writer, {f"{base}/{name}": data for name, data in init_files(t, layers).items()})
    return True


def write_vocab(writer: StoreWriter, t: Teacher, progress: bool) -> bool:
    """Write teachers/<name>/vocab.safetensors once (with its sha256 in the manifest); False if present."""
    # lazy: torch, which a precompute on a cached ONNX/OpenVINO export never imports
    from kd.pipeline.teacher.vocab import VOCAB_FILE, cached_vocab_bytes, keep_in_cache, vocab_bytes

    rel = f"teachers/{t.name}/{VOCAB_FILE}"
    if rel in writer.manifest.extras.get("files", {}) and fs.exists(writer.loc, *rel.split("/")):
        return False
    data = cached_vocab_bytes(t)
    if data is not None:
        if progress:
            print(f"vocab {t.name}: from the kd cache (it depends on the teacher alone: computed once per machine)",
                  file=sys.stderr, flush=True)
    else:
        with Bar(f"vocab {t.name}", len(t.hf_tokenizer()), "tokens", progress) as bar:
            data = vocab_bytes(t, on_batch=bar.advance)
        keep_in_cache(t, data)
    record_files(writer, {rel: data})
    return True
