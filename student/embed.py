"""`kd embed`: a trained student's vectors for a store (as an aligned table) or for a file of texts.

- Store input: shard k of `texts` becomes shard k of `students/<name>` (id + `embedding`, or
  `embedding_a`/`embedding_b` for pair stores), so DuckDB joins it with any teacher row by row.
  Each shard is committed when done; a killed run resumes at the first missing shard. The table's
  meta names the student (weights checksum), so vectors of two students never mix under one name.
- File input (.txt one text per line; .jsonl/.csv/.parquet with a text column): a Parquet file
  with row, text, embedding.
- No NaN/Inf vector is ever written: a student whose weights hold one is refused on load
  (`student.saved.load`), and every batch of vectors is checked before it is committed, naming the
  first bad row (`finite_vectors`); the shards committed before it are sound and stay.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kd.common.errors import InputError, KdError, StoreError
from kd.common.finite import non_finite_rows
from kd.common.inputs import ColumnSpec, read_inputs
from kd.common.options import with_options
from kd.common.outputs import claim_output, write_file
from kd.common.progress import Bar
from kd.storage import fs
from kd.storage.manifest import Manifest
from kd.storage.names import check_name
from kd.storage.schema import VectorDType, type_name, vector_type, vectors_to_arrow
from kd.storage.store import Store, open_writer
from kd.student.embed_config import EmbedConfig
from kd.student.saved import LoadedStudent, load


@dataclass
class EmbedSummary:
    output: str  # the store (table inside it) or the Parquet file written
    table: str | None
    rows: int
    shards_written: int
    shards_skipped: int
    seconds: float


def _is_store(path: str) -> bool:
    loc = fs.resolve(path)
    return fs.exists(loc, "manifest.json") or bool(fs.list_files(loc, "manifests"))


def student_meta(st: LoadedStudent) -> dict:
    """What identifies the vectors: two runs with equal meta write equal shards."""
    info = st.info
    return {
        "student": str(st.path.resolve()), "weights_sha256": info["weights_sha256"],
        "arch": st.config.arch.value, "out_dim": st.dim, "num_parameters": info["num_parameters"],
        "objectives": info.get("objectives"), "target": info.get("target"),
        "trained_on": info.get("store_fingerprint"), "dtype": "float32",
    }


def embed(student: str | os.PathLike, input: str, out: str | None = None, **options: Any) -> EmbedSummary:
    """`run` for `student`'s vectors of `input`; `options` are `EmbedConfig`'s fields (name, text_column,
    batch_size, device, overwrite, progress)."""
    return run(EmbedConfig(input, student, out, **options))


with_options(embed, EmbedConfig, ("input", "student", "out"))  # help(embed) lists the config's keywords


def run(cfg: EmbedConfig) -> EmbedSummary:
    """Embed a store (into `students/<name>` of that store) or a text file (into Parquet at `out`)."""
    t0 = time.perf_counter()
    input, out = cfg.input, cfg.out
    if _is_store(input):
        if out is not None and fs.resolve(out) != fs.resolve(input):
            raise InputError("a store's student vectors are written into that store", out,
                             f"leave --out off, or pass --out {input}")
        if cfg.text_column is not None:  # a store's texts are its `texts` table: the option would be ignored
            raise InputError("--text-column is for file inputs; a store's texts are its own", input,
                             "drop --text-column")
        table_name = check_name(Path(cfg.student).resolve().name if cfg.name is None else cfg.name,
                                "student table name (--name)")
        st = load(cfg.student, device=cfg.device)
        return _embed_store(st, input, table_name, cfg.batch_size, cfg.overwrite, cfg.progress, t0)
    if out is None:
        raise InputError("--out is needed for a file input (a Parquet file to write)", input,
                         "pass --out vectors.parquet")
    claim_output(out, "kd embed", inputs=[input, cfg.student], overwrite=cfg.overwrite, file=True)
    texts = read_texts(input, cfg.text_column)
    st = load(cfg.student, device=cfg.device)
    vecs = finite_vectors(st.encode(texts, batch_size=cfg.batch_size), np.arange(len(texts)), input)
    table = pa.table({"row": pa.array(np.arange(len(texts), dtype=np.int64)), "text": pa.array(texts),
                      "embedding": vectors_to_arrow(vecs, VectorDType.float32)})
    write_file(out, lambda tmp: pq.write_table(table, tmp, compression="zstd"), "kd embed")  # whole or not at all
    return EmbedSummary(out, None, len(texts), 1, 0, time.perf_counter() - t0)


def finite_vectors(vecs: np.ndarray, rows: np.ndarray, where: str, row: str = "row") -> np.ndarray:
    """`vecs`, unless a row holds NaN/Inf (an overflow in the student): refused, naming the first row."""
    bad = non_finite_rows(vecs)
    if len(bad):
        raise KdError(f"the student gave NaN/Inf vectors for {len(bad)} text(s), the first at {row} "
                      f"{int(rows[bad[0]])}; nothing was written for them", where,
                      "the student is unsound for these texts (its activations overflow): retrain it, or drop "
                      "those texts")
    return vecs


def read_texts(path: str, text_column: str | None = None) -> list[str]:
    """Texts of a .txt (one per line, blanks skipped), .jsonl, .csv/.tsv or .parquet file.

    Read by `common.inputs` (what precompute uses): non-UTF-8 bytes, malformed JSON lines and missing
    columns are errors naming the file and line.
    """

    p = Path(path)
    if not p.exists():
        raise InputError("input not found (neither a kd store nor a file)", path,
                         "pass a store folder written by kd precompute, or a .txt/.jsonl/.csv/.parquet file")
    if p.is_dir():
        raise InputError("the input is a folder but not a kd store", path, "pass a store or a file")
    texts = read_inputs([path], ColumnSpec(text=text_column)).texts
    kept = [t.lstrip("\ufeff") for t in texts if isinstance(t, str) and t.strip()]
    if not kept:  # as kd precompute refuses it: a 0-row file is never what was wanted
        raise InputError(f"no text to embed ({len(texts)} read, all empty)", path,
                         "check --text-column and that the file is not empty")
    return kept


def _writer_id(name: str) -> str:
    return "student-" + re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _drop_table(path: str, table: str, writer_id: str) -> None:
    """Forget a table (before rewriting it): from manifest.json and this writer's fragment."""
    loc = fs.resolve(path)
    for parts in (("manifest.json",), ("manifests", f"{writer_id}.json")):
        if fs.exists(loc, *parts):
            m = Manifest.from_json(fs.read_bytes(loc, *parts), loc.path(*parts))
            m.tables.pop(table, None)
            fs.atomic_write_bytes(loc, m.to_json().encode(), *parts)


def _embed_store(st: LoadedStudent, path: str, name: str, batch_size: int, overwrite: bool, progress: bool,
                 t0: float) -> EmbedSummary:
    store = Store.open(path, content=True)
    texts = store.require_complete("texts")
    table, wid = f"students/{name}", _writer_id(name)
    meta = student_meta(st)
    existing = store.manifest.tables.get(table)
    if existing is not None and existing.meta != meta:
        if not overwrite:
            raise StoreError(f"the store already has {table!r} from another student "
                             f"({existing.meta.get('student')})", store.root,
                             "pick another --name, or pass --overwrite to replace it")
        _drop_table(path, table, wid)
        store = Store.open(path)
    sides = ("text_a", "text_b") if store.manifest.pairs else ("text",)
    out_cols = ["embedding_a", "embedding_b"] if store.manifest.pairs else ["embedding"]
    vtype = type_name(vector_type((st.dim,), VectorDType.float32))
    w = open_writer(path, store.manifest, wid)
    try:
        w.declare(table, "student", {"id": "int64", **dict.fromkeys(out_cols, vtype)}, meta)
        now = w.existing or store.manifest  # read under the lock: what another run committed since counts as done
        done = set(now.tables[table].shards) if table in now.tables else set()
        done |= set(w.manifest.tables[table].shards)
        todo = [k for k in sorted(texts.shards) if k not in done]
        rows = 0
        with Bar("embed", sum(texts.shards[k].rows for k in todo), "rows", progress) as bar:
            for k in todo:
                shard = store.read_shard("texts", k, ["id", *sides])
                cols = {"id": shard.column("id")}
                for side, col in zip(sides, out_cols):
                    vecs = finite_vectors(st.encode(shard.column(side).to_pylist(), batch_size=batch_size),
                                          shard.column("id").to_numpy(), f"{path} (shard {k}, {side})", "row id")
                    cols[col] = vectors_to_arrow(vecs, VectorDType.float32)
                w.commit(table, k, pa.table(cols))
                rows += shard.num_rows
                bar.advance(shard.num_rows)
        w.publish()
    finally:
        w.close()
    return EmbedSummary(store.root, table, rows, len(todo), len(texts.shards) - len(todo), time.perf_counter() - t0)
