"""`kd query`: one SQL statement to the terminal or a file, or an interactive prompt.

- Results print as a rich table (the first MAX_ROWS rows, read as a stream; long cells such as vectors shortened),
  or go through DuckDB COPY to csv/json/parquet (`dataset.query.export`); csv/json without
  --out print to stdout.
- The prompt reads lines until one ends with ';' (so it works piped: `kd query S < file.sql`),
  runs them, prints the result, and keeps going after an error. `.tables` lists the views,
  `.quit` (or end of input) leaves.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from typing import TextIO

import pyarrow as pa
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from kd.apps.query_config import QueryConfig
from kd.common.errors import KdError
from kd.dataset.query import Format, connect, export, head
from kd.storage import fs
from kd.storage.names import real_inside
from kd.storage.schema import vector_shape
from kd.storage.store import Store

MAX_ROWS = 50  # rows a terminal table shows; the rest of a result goes through --out
MAX_CELL = 60


def _fmt(v: object) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _cell(v: object) -> str:
    s = _fmt(v)
    return s if len(s) <= MAX_CELL else s[: MAX_CELL - 1] + "…"


def _type(t: pa.DataType) -> str:
    shape = vector_shape(t)
    if not shape:
        return str(t)
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return f"{t}[{']['.join(map(str, shape))}]"


def render(result: pa.Table, more: bool) -> Group:
    """A rich table of a result's first rows (`dataset.query.head`), and a line with the count, saying when
    there are more (a line, not the table's caption: a caption wraps at a narrow table's width)."""
    t = Table(show_lines=False)
    for f in result.schema:
        t.add_column(Text.assemble(f"{f.name}\n", (_type(f.type), "dim")), overflow="fold")
    for row in result.to_pylist():
        t.add_row(*(_cell(v) for v in row.values()))
    count = (f"the first {result.num_rows} rows; there are more: use --out FILE for all" if more
             else f"{result.num_rows} rows")
    return Group(t, Text(count, style="dim"))


def shell(cfg: QueryConfig, console: Console, stdin: TextIO) -> int:
    """`kd query`: print or write the result of `cfg.sql` (0 failures), or, without SQL, run the statements read
    from `stdin` (`repl`: a prompt when it is a terminal); returns how many statements failed."""
    if cfg.sql is not None:
        query(cfg.store, cfg.sql, cfg.format, cfg.out_file, console, cfg.overwrite)
        return 0
    return repl(cfg.store, stdin, console, interactive=stdin.isatty())


def query(store_path: str, sql: str, fmt: Format, out: str | None, console: Console,
          overwrite: bool = False) -> None:
    """Run `sql` on the store and print or write its result (the `kd query STORE SQL` command)."""
    fmt = Format(fmt)
    if out is not None:
        rows = export(store_path, sql, out, fmt, overwrite=overwrite)
        console.print(f"wrote {rows} rows to {out}", style="dim", highlight=False)
        return
    if fmt is Format.table:
        console.print(render(*head(store_path, sql, MAX_ROWS)))
        return
    if fmt is Format.parquet:
        raise KdError("parquet output needs a file", None, "add --out FILE.parquet")
    # COPY writes files only; go through a temporary one so the output is DuckDB's own csv/json.
    tmp_root = tempfile.gettempdir()
    loc = fs.resolve(store_path)
    if loc.is_local and real_inside(loc.root, tmp_root)[1]:  # (a file:// address too; tmp_root is absolute)
        # never a folder of ours inside the store, even for a moment (the sixth probe: TMPDIR set inside it)
        raise KdError("the temporary folder kd query prints through lies inside the store", tmp_root,
                      "set TMPDIR to a folder outside the store, or write the result with --out FILE")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"out.{fmt.value}")
        export(store_path, sql, path, fmt)
        with open(path, encoding="utf-8") as f:
            shutil.copyfileobj(f, console.file)  # in chunks: the result may be larger than memory


def repl(store_path: str, lines: Iterable[str], console: Console, interactive: bool = False) -> int:
    """Run ';'-terminated statements read from `lines`; returns how many statements failed."""
    store = Store.open(store_path)
    con = connect(store)
    failures, buf = 0, []
    if interactive:
        views = ", ".join(_views(con))
        console.print(f"kd store {store.root}: views {views}. End statements with ';', .quit to leave.")
        console.print("kd> ", end="")
    for line in lines:
        stripped = line.strip()
        if not buf and stripped in (".quit", ".exit", "\\q"):
            break
        if not buf and stripped == ".tables":
            console.print(" ".join(_views(con)))
        elif stripped:
            buf.append(line.rstrip("\n"))
            if stripped.endswith(";"):
                sql, buf = "\n".join(buf), []
                try:
                    result, more = head(store, sql, MAX_ROWS, con=con)
                    if result.num_columns:
                        console.print(render(result, more))
                except KdError as e:
                    failures += 1
                    console.print(Text.assemble(("error:", "bold red"), f" {e}"))
        if interactive:
            console.print("...> " if buf else "kd> ", end="")
    if buf:
        console.print(Text("ignored an unterminated statement (no ';' at the end)", style="yellow"))
    return failures


def _views(con) -> list[str]:
    return [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall()]
