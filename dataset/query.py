"""The store as a SQL dataset: DuckDB views over the committed shards.

- One view per table, reading only the shard files the manifest commits (`read_parquet([...])`),
  so a half-written or uncommitted file is never seen.
- Vector columns are cast back to fixed-size arrays (`FLOAT[dim]`, `FLOAT[dim][L]` for per-layer
  states; DuckDB writes the inner size first), because Parquet keeps the fixed size only in
  pyarrow's schema metadata and DuckDB would read FLOAT[] lists that `array_*` functions refuse.
- int8 columns are dequantized in the view (code x its `<column>__scale`, storage.int8), so a view shows
  FLOAT vectors whatever the store's dtype; the scale columns themselves are not shown.
- `outputs` joins every aligned table to `texts` on id (LEFT JOIN: rows of an incomplete table
  read NULL), each column prefixed with its table's view name.
- The connection cannot touch a file (issue 48): views read the shards through pyarrow datasets
  registered with DuckDB, then DuckDB's own `enable_external_access = false` and `lock_configuration`
  refuse every file access SQL can ask for (COPY ... TO, EXPORT DATABASE, ATTACH, read_csv, INSTALL) and
  any later SET that would lift them. Parsing the SQL for writes instead would miss a form; a setting of
  the engine misses none. A result leaves only through `export` (kd query -o), whose connection may write one
  file: kd's temporary file beside the output (DuckDB's `allowed_paths`, set before the lock).

View names (`view_names`):
    texts                    -> texts
    teachers/<name>          -> <name>            e.g. minilm
    students/<name>          -> student_<name>    e.g. student_bilstm
    derived/<name>           -> <name>            e.g. clusters_minilm_sentence
Characters other than letters, digits and `_` become `_`; a name that would clash with another
view (or with `texts`/`outputs`) gets its kind as prefix (`teacher_`, `derived_`). Every table is
also reachable by its quoted path, e.g. `SELECT * FROM "teachers/minilm"`.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from kd.common.errors import InputError, KdError, StoreError, located
from kd.common.options import path_argument
from kd.common.outputs import claim_output, temp_path, write_file
from kd.common.stop import Stopped, StopRequest, Terminated
from kd.storage.int8 import scale_column
from kd.storage.manifest import Manifest
from kd.storage.schema import is_int8, vector_shape
from kd.storage.soundness import require_sound_content
from kd.storage.store import Store

RESERVED = ("texts", "outputs")
T = TypeVar("T")
_KIND_PREFIX = {"teacher": "teacher_", "student": "student_", "derived": "derived_"}


class Format(str, Enum):
    """Output formats of `kd query`."""

    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


def _sanitize(name: str) -> str:
    s = re.sub(r"\W", "_", name, flags=re.ASCII)
    return f"t_{s}" if s[:1].isdigit() else s


def view_names(manifest: Manifest) -> dict[str, str]:
    """Table path -> view name, by the rule in the module docstring (stable for a given manifest)."""
    names: dict[str, str] = {}
    taken = set(RESERVED)
    # Teachers first so they keep their bare names when a derived table would clash with them.
    order = {"texts": 0, "teacher": 1, "student": 2, "derived": 3}
    for table, rec in sorted(manifest.tables.items(), key=lambda kv: (order.get(kv[1].kind, 4), kv[0])):
        if table == "texts":
            names[table] = "texts"
            continue
        short = table.split("/", 1)[-1]
        view = _sanitize(("student_" + short) if rec.kind == "student" else short)
        if view in taken:
            view = _sanitize(_KIND_PREFIX.get(rec.kind, "table_") + short)
        while view in taken:
            view += "_"
        taken.add(view)
        names[table] = view
    return names


def resolve_table(store: Store, name: str) -> str:
    """Table path from a path ("teachers/tiny-bert"), a view name ("tiny_bert") or a bare name ("tiny-bert")."""
    if name in store.manifest.tables:
        return name
    names = view_names(store.manifest)
    for table, view in names.items():
        if view == name:
            return table
    bare = [t for t in names if t.split("/", 1)[-1] == name]
    if len(bare) == 1:
        return bare[0]
    have = ", ".join(f"{v} ({t})" for t, v in names.items())
    raise InputError(f"the store has no table {name!r}", store.root, f"use one of: {have}")


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def duckdb_type(t: pa.DataType) -> str | None:
    """DuckDB array type for a fixed-size vector column (None for scalar columns)."""
    shape = vector_shape(t)
    if not shape:
        return None
    return "FLOAT" + "".join(f"[{n}]" for n in reversed(shape))


def _committed_files(store: Store, table: str) -> list[str]:
    rec = store.manifest.tables[table]
    return [store.path_of(rec.shards[k].file) for k in sorted(rec.shards)]


def _dequantized(column: str, shape: tuple[int, ...], alias: str) -> str:
    """SQL for int8 codes times their scale (list comprehensions: DuckDB 1.1 and 2.x both read them)."""
    q, s = f"{alias}.{_ident(column)}", f"{alias}.{_ident(scale_column(column))}"
    if len(shape) == 1:
        return f"[x * {s} FOR x IN {q}]"
    return f"[[x * {s}[i] FOR x IN {q}[i]] FOR i IN range(1, {shape[0] + 1})]"


def _view_schema(schema: pa.Schema) -> pa.Schema:
    """The file's fields a view shows: all but the scale columns of int8 columns."""
    scales = {scale_column(f.name) for f in schema if is_int8(f.type)}
    return pa.schema([f for f in schema if f.name not in scales])


def _select_list(schema: pa.Schema, prefix: str | None, alias: str) -> Iterator[str]:
    for f in _view_schema(schema):
        cast = duckdb_type(f.type)
        expr = f"{alias}.{_ident(f.name)}"
        if is_int8(f.type):
            if scale_column(f.name) not in schema.names:
                raise StoreError(f"int8 column {f.name!r} has no scale column {scale_column(f.name)!r}", None,
                                 "the store is damaged: run kd validate STORE")
            expr = _dequantized(f.name, vector_shape(f.type), alias)
        if cast:
            expr = f"CAST({expr} AS {cast})"
        yield f"{expr} AS {_ident(f.name if prefix is None else f'{prefix}_{f.name}')}"


def connect(store_path: str | os.PathLike | Store, database: str = ":memory:", verify: bool = True,
            writable: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per table plus `outputs` (see module docstring).

    - Every file a view reads is checked against its manifest sha256 first (DuckDB reads the files
      itself, so this is the one chance); `verify=False` skips that on a store you just validated.
    - Tables with no committed shard get no view.
    - Local stores are read by path; remote ones (s3://...) through their pyarrow datasets.
    - `writable`: the one file SQL may write (export's temporary file); None: none.
    """
    store = store_path if isinstance(store_path, Store) else Store.open(store_path)
    if verify:
        # DuckDB reads every value of every table: once per store state they are checked as validate does
        require_sound_content(store)
        for table in store.manifest.tables:
            store.verify_files(table)
    con = duckdb.connect(database)
    names = view_names(store.manifest)
    schemas: dict[str, pa.Schema] = {}
    for table, view in names.items():
        files = _committed_files(store, table)
        if not files:
            continue
        raw = f"__raw_{view}"
        con.register(raw, ds.dataset(files, format="parquet", filesystem=store.loc.fs))
        source = _ident(raw)
        schema = pq.read_schema(files[0], filesystem=store.loc.fs)
        schemas[table] = _view_schema(schema)
        body = f"SELECT {', '.join(_select_list(schema, None, 's'))} FROM {source} AS s"
        con.execute(f"CREATE VIEW {_ident(view)} AS {body}")
        if view != table:
            con.execute(f"CREATE VIEW {_ident(table)} AS SELECT * FROM {_ident(view)}")
    if "texts" in schemas:
        con.execute(f"CREATE VIEW outputs AS {_outputs_sql(names, schemas)}")
    _status(con, store)
    _lock(con, writable)
    return con


def _lock(con: duckdb.DuckDBPyConnection, writable: str | None) -> None:
    """No file access from SQL from here on (but `writable`, export's temporary file), and no SET that would give
    it back (see module docstring)."""
    if writable is not None:
        con.execute(f"SET allowed_paths = [{_sql_str(writable)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _status(con: duckdb.DuckDBPyConnection, store: Store) -> None:
    """A `kd_status` table (table, shards committed, shards expected, complete), and a warning on stderr when
    any table is incomplete: a query then answers from the committed part only."""
    n = store.manifest.num_shards
    rows = [(t, len(r.shards), n, len(r.shards) == n) for t, r in sorted(store.manifest.tables.items())]
    con.execute("CREATE TABLE kd_status (tbl VARCHAR, shards_committed INTEGER, shards_expected INTEGER, "
                "complete BOOLEAN)")
    if rows:
        con.executemany("INSERT INTO kd_status VALUES (?, ?, ?, ?)", rows)
    partial = [f"{t} ({c}/{e} shards)" for t, c, e, ok in rows if not ok]
    if partial:
        print(f"warning: the store is incomplete, queries see only committed rows: {', '.join(partial)} "
              "(see the kd_status table; re-run kd precompute to finish it)", file=sys.stderr)


def _outputs_sql(names: dict[str, str], schemas: dict[str, pa.Schema]) -> str:
    cols = ["t.*"]
    joins = []
    used = {f.name for f in schemas["texts"]}
    for i, (table, view) in enumerate(names.items()):
        if table == "texts" or table not in schemas:
            continue
        alias = f"j{i}"
        for f in schemas[table]:
            if f.name == "id":
                continue
            out = f"{view}_{f.name}"
            if out in used:  # e.g. teacher "a" column "b_c" vs teacher "a_b" column "c"
                out = f"{view}__{f.name}"
            used.add(out)
            cols.append(f"{alias}.{_ident(f.name)} AS {_ident(out)}")
        joins.append(f"LEFT JOIN {_ident(view)} AS {alias} USING (id)")
    return f"SELECT {', '.join(cols)} FROM texts AS t {' '.join(joins)}"


def _fix(e: Exception) -> str:
    """The fix line for a failed query: memory is not the views' fault (issue 48's probe)."""
    if isinstance(e, duckdb.OutOfMemoryException) or "Out of Memory" in str(e):
        return "the query needs more memory than there is: add a LIMIT or an aggregate, or write it with --out FILE"
    return "list the views with: SHOW TABLES"


def split_statements(sql: str) -> list[str]:
    """SQL text -> its statements (DuckDB's own parser, so ';' inside strings is fine)."""
    if not isinstance(sql, str):
        raise InputError(f"the SQL must be a str, not {sql!r} ({type(sql).__name__})", None,
                         'pass it as text, e.g. "SELECT count(*) FROM texts"')
    try:
        return [str(s.query).strip() for s in duckdb.extract_statements(sql) if str(s.query).strip()]
    except duckdb.Error as e:
        raise InputError(f"cannot parse the SQL: {e}", None, "check the statement's syntax") from e


def _run_all_but_last(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    statements = split_statements(sql)
    if not statements:
        raise InputError("no SQL statement given", None, 'pass a query, e.g. "SELECT count(*) FROM texts"')
    for s in statements[:-1]:
        con.execute(s).fetchall()  # drain: DuckDB refuses new work while a result is pending
    return statements[-1]


def _interruptible(cons: list[duckdb.DuckDBPyConnection], work: Callable[[], T]) -> T:
    """`work()` in a thread, so that Ctrl-C interrupts the query. DuckDB holds the calling thread in C++ until
    a query ends, so a KeyboardInterrupt raised there waits for the whole query; a main thread that only
    waits takes it at once and asks every connection of the work to stop (`interrupt`)."""
    done: dict[str, Any] = {}
    # an Event, not Thread.join: on Python 3.11 a KeyboardInterrupt inside join(timeout) can mark the thread as
    # ended while it still runs, and the query's connection was then closed busy and the process aborted at exit
    finished = threading.Event()

    def run() -> None:
        try:
            done["value"] = work()
        except BaseException as e:  # handed to the main thread below, whatever it is
            done["error"] = e
        finally:
            finished.set()

    thread, started = threading.Thread(target=run, name="kd-query", daemon=True), False
    try:
        # a signal while the thread starts is held (StopRequest) and raised once `started` says whether there is
        # a query to stop: a KeyboardInterrupt inside Thread.start() (it waits for the thread to run) left the
        # query running unseen, and the process aborted at exit
        with StopRequest() as held:
            thread.start()
            started = True
        if held.signum is not None:
            raise Terminated() if held.signum == signal.SIGTERM else KeyboardInterrupt()
        while not finished.wait(0.1):
            pass
    except KeyboardInterrupt as e:
        while started:  # again until the work ends: an interrupt between two of its statements stops neither
            for con in cons:
                con.interrupt()
            if finished.wait(0.1):
                break
        raise Stopped(getattr(e, "signum", signal.SIGINT), "the query was interrupted; nothing was written") from None
    if "error" in done:
        raise done["error"]
    return done["value"]


RESULT_VIEW = "__kd_result"  # the view export copies from


def _stream(rel: duckdb.DuckDBPyRelation) -> pa.RecordBatchReader:
    """The relation's result as Arrow batches, computed as they are read (to_arrow_reader from DuckDB 1.4; the old
    name before)."""
    return rel.to_arrow_reader() if hasattr(rel, "to_arrow_reader") else rel.fetch_record_batch()


def head(
    store_path: str | os.PathLike | Store, sql: str, rows: int, con: duckdb.DuckDBPyConnection | None = None
) -> tuple[pa.Table, bool]:
    """The first `rows` rows of the last statement's result, and whether it has more: read as a stream and
    stopped there, so a result of any size (`SELECT * FROM range(1e10)`) shows its head in bounded memory
    where the whole table (run_query) would be built first. All of it goes through `export`."""
    con = connect(store_path) if con is None else con

    def work() -> tuple[pa.Table, bool]:
        rel = con.sql(_run_all_but_last(con, sql))
        if rel is None:
            return pa.table({}), False
        reader, batches, n = _stream(rel), [], 0
        for batch in reader:
            batches.append(batch)
            n += batch.num_rows
            if n > rows:
                break
        reader.close()  # the rest is never computed
        table = pa.Table.from_batches(batches, reader.schema)
        return table.slice(0, rows), n > rows

    try:
        return _interruptible([con], work)
    except (duckdb.Error, OSError) as e:  # read through Arrow, DuckDB's errors arrive as pyarrow's OSError
        raise KdError(f"query failed: {e}", None, _fix(e)) from e


def run_query(
    store_path: str | os.PathLike | Store, sql: str, con: duckdb.DuckDBPyConnection | None = None
) -> pa.Table:
    """Run SQL (one or more ';'-separated statements) on the store; the last statement's result."""
    con = connect(store_path) if con is None else con

    def work() -> pa.Table:
        rel = con.sql(_run_all_but_last(con, sql))  # None for statements without a result (SET, CREATE ...)
        if rel is None:
            return pa.table({})
        return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()

    try:
        return _interruptible([con], work)
    except duckdb.Error as e:
        raise KdError(f"query failed: {e}", None, _fix(e)) from e


def export(
    store_path: str | os.PathLike | Store,
    sql: str,
    out: str | os.PathLike,
    fmt: Format,
    *,
    overwrite: bool = False,
) -> int:
    """Write the last statement's result to `out` with DuckDB COPY; returns the number of rows. An existing
    `out` is replaced only with `overwrite`, and only when kd wrote it (`common.outputs`).

    The query's connection may write one file: the temporary file beside `out` (DuckDB's `allowed_paths`, set
    before file access is locked), so the result goes from the query to the file inside DuckDB, streamed. It
    once streamed through Arrow into a second connection: a Ctrl-C left that one's threads reading from the
    interrupted query, and the process aborted at exit ("exception not rethrown") in place of exiting 130."""
    out = path_argument(out, "out", "kd.dataset.query.export")
    if not isinstance(fmt, str) or fmt not in {f.value for f in Format}:  # (a Format is a str)
        raise InputError(f"format {fmt!r} is not one of {', '.join(f.value for f in Format)}", str(out),
                         "pass csv, json or parquet")
    fmt = Format(fmt)
    if fmt is Format.table:
        raise InputError("--format table prints to the terminal", str(out), "use csv, json or parquet with --out")
    root = store_path.root if isinstance(store_path, Store) else store_path
    claim_output(out, "kd query", inputs=[root], overwrite=overwrite, file=True)  # never into the store
    # straight into kd's own temporary file (write_file): DuckDB's would be another path, not allowed
    opts = {"csv": "FORMAT csv, HEADER true", "json": "FORMAT json", "parquet": "FORMAT parquet"}[fmt.value]
    opts += ", USE_TMP_FILE false"
    rows: list[int] = []
    con = connect(store_path, writable=os.fspath(temp_path(out)))

    def copy(tmp: os.PathLike) -> None:
        def work() -> int:
            rel = con.sql(_run_all_but_last(con, sql))
            if rel is None:
                raise InputError("the last statement returns no rows to write", str(out),
                                 "end the SQL with a SELECT (or another statement that returns rows)")
            rel.create_view(RESULT_VIEW)
            res = con.execute(f"COPY (SELECT * FROM {RESULT_VIEW}) TO {_sql_str(os.fspath(tmp))} ({opts})").fetchone()
            return int(res[0]) if res else 0

        rows.append(_interruptible([con], work))

    try:
        with located(str(out)):  # a full disk is not the SQL's fault: it is the file being written
            write_file(out, copy, "kd query")
        return rows[0]
    except duckdb.Error as e:
        raise KdError(f"query failed: {e}", None, "check the SQL; COPY needs a single SELECT as last statement") from e
    finally:
        con.close()
