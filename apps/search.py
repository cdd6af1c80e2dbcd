"""`kd search`: embed a query with a student or a teacher and search a store's faiss index.

- `--teacher NAME` (a teacher of the store, by name, by the spec it was precomputed from, or by a copy of that
  folder, which its weights and config.json settings tell): loads the checkpoint its table meta names, refuses one
  whose weights or config.json settings differ from those of the one that wrote the store, encodes the query with
  the same max_length and searches that teacher's index (column: --column or the teacher's default target). A
  teacher the store does not hold is refused, unless --table names the table to search; a teacher table's writer is
  checked then too.
- `--student DIR`: `student.load(DIR).encode`; a student distilled into a teacher's space
  searches that teacher's index (DSE-style: cheap query encoder, precomputed corpus vectors).
  Which index: --table/--column/--kind, else the only one with the query's dimension.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from kd import student
from kd.apps.search_config import SearchConfig
from kd.common.errors import InputError, KdError
from kd.common.options import with_options
from kd.dataset.index import SearchResult, list_indexes, search
from kd.dataset.query import resolve_table
from kd.pipeline.backends.loading import load_teacher
from kd.pipeline.teacher.model import Output, changed_since
from kd.pipeline.teacher.resolve import (
    TeacherRef,
    TeacherSpec,
    parse_teacher,
    recorded_source,
    resolve_teacher,
)
from kd.storage.store import Store

PAIR_SUFFIXES = ("_a", "_b")


def _teacher_vector(store: Store, teacher: str, text: str, column: str | None, table: str | None
                    ) -> tuple[np.ndarray, str | None, str]:
    # a teacher of the store by its name (loaded from where the store says), or a spec naming one of its tables, by
    # the folder it was precomputed from (any spelling) or by NAME: loaded from the spec, its weights checked below
    teachers = store.manifest.teachers()
    spec = parse_teacher(teacher) if teacher not in teachers else None
    by_source = [t for t in teachers if spec and store.table(f"teachers/{t}").meta.get("source") in
                 (spec.source, recorded_source(spec.source))]
    name = teacher if spec is None else by_source[0] if len(by_source) == 1 else \
        spec.name if spec.name in teachers else None
    ref = _found(spec) if spec is not None else None
    copies = _copies_of(store, teachers, ref.path) if name is None and not by_source and table is None and ref \
        else []  # (a copy of the teacher's folder was "not a teacher of it")
    name = copies[0] if len(copies) == 1 else name
    several = by_source if len(by_source) > 1 else copies  # (the start model is the teacher: two tables)
    if name is None and len(several) > 1 and table is None:
        did = "wrote" if several is by_source else "holds the weights and settings of the teacher of"
        indexed = {i.table for i in list_indexes(store)}  # (the first named had no index, the other one had: a probe)
        pick = next((t for t in several if f"teachers/{t}" in indexed), several[0])
        raise InputError(f"--teacher {teacher} {did} several tables of the store ({', '.join(several)})",
                         "--teacher", f"pass one of their names: --teacher {pick}")
    if name is None and table is None:  # (another teacher's index was searched: a probe)
        raise InputError(f"--teacher {teacher} is not one of the store's teachers ({', '.join(teachers) or 'none'}), "
                         "so no table of its vectors is there to search", "--teacher", "pass one of them (its name, "
                         "or the folder it was precomputed from), or name the table to search with --table")
    # the table searched is --table's, else the teacher's own; the query's model is checked against the one that
    # wrote the searched table (with --table, any checkpoint searched any teacher's vectors: a probe)
    own = f"teachers/{name}" if name else None
    table = resolve_table(store, table) if table else own
    meta = store.table(table).meta if table else {}
    column = column or meta.get("default_target", "mean")
    columns = store.table(table).columns if table else {}
    if table and column not in columns:  # (`--table texts` proposed building an index on texts/mean: a probe)
        vectors = [c for c, kind in columns.items() if kind.startswith("float[") and kind.count("[") == 1]
        raise InputError(f"table {table!r} has no column {column!r}" if vectors else
                         f"table {table!r} holds no vectors to search", "--column" if vectors else "--table",
                         f"pass --column {' or '.join(vectors)}" if vectors else
                         f"pass --table one of the teachers' ({', '.join(teachers)})")
    output = column[:-2] if column.endswith(PAIR_SUFFIXES) else column
    if output not in {o.value for o in Output}:
        raise InputError(f"a teacher cannot encode a query into column {column!r}", "--column",
                         "use cls, mean or sentence (or their _a/_b forms in pair stores)")
    source = store.table(own).meta.get("source", teacher) if spec is None else ref or spec.source
    model = load_teacher(source, max_length=meta.get("max_length"))
    changed = changed_since(model.ref.path, meta)
    if changed:
        wrote = f"--teacher {meta['source']}" if meta.get("source") else "the teacher that wrote it (see kd info STORE)"
        # (another teacher's own table named by --table: "restore that checkpoint" pointed at the wrong fix: a probe)
        restore = f"restore that checkpoint's {changed}" + \
            ("" if meta.get("source") == recorded_source(model.ref.source) else f", or pass {wrote}")
        fix = f"search its own table (--table {own}), or pass {wrote}" if own and own != table else restore
        raise KdError(f"the checkpoint at {model.ref.path!r} is not the teacher that wrote table {table!r} (its "
                      f"{changed} differ)", model.ref.path, fix)
    return model.encode([text], outputs=[Output(output)])[output][0], table, column


def _found(spec: TeacherSpec) -> TeacherRef | None:
    """`spec`'s checkpoint on this machine, or None (the load names why; "not one of the store's teachers" lists
    them)."""
    try:
        return resolve_teacher(spec)
    except KdError:
        return None


def _copies_of(store: Store, teachers: list[str], path: str) -> list[str]:
    """The teachers of the store whose weights and config.json settings the checkpoint at `path` holds (a copy of
    a folder elsewhere, or under another name; a store that records no digest has none)."""
    metas = {t: store.table(f"teachers/{t}").meta for t in teachers}
    return [t for t, meta in metas.items() if meta.get("weights_sha256") and changed_since(path, meta) is None]


def _student_vector(student_dir: str, text: str) -> np.ndarray:
    return np.asarray(student.load(student_dir).encode([text]))[0]


def search_text(store_path: str | os.PathLike, query: str, **options: Any) -> SearchResult:
    """`search_store` of `query` in the store at `store_path`; `options` are `SearchConfig`'s fields (student or
    teacher, k, table, column, kind)."""
    return search_store(SearchConfig(store_path, query, **options))


with_options(search_text, SearchConfig, ("store",))  # help(search_text) lists the config's keywords


def search_store(cfg: SearchConfig) -> SearchResult:
    """Embed `cfg.query` with exactly one of student/teacher and return the top-k rows of the store."""
    store = Store.open(cfg.store, content=True)
    table, column = cfg.table, cfg.column
    if cfg.teacher is not None:
        vec, table, column = _teacher_vector(store, cfg.teacher, cfg.query, column, table)
    else:
        vec = _student_vector(cfg.student, cfg.query)
    return search(store, vec[None, :], cfg.k, table=table, column=column, kind=cfg.kind)
