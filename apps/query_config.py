"""The options of `kd query`, declared once (kd.common.options). Light to import: `kd --help` builds the command
from these fields (apps.query_shell imports pyarrow and DuckDB's views)."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common import bounds as B
from kd.common.options import check_ranges, option


@dataclass(frozen=True)
class QueryConfig:
    """Which store `kd query` reads, the SQL (None: statements read from stdin), and where the result goes."""

    store: str = option(argument=True, remote=True, help="Store folder")
    sql: str | None = option(None, argument=True, help="SQL; without it an interactive prompt reads stdin")
    format: str = option("table", choices=B.QueryFormat, short="-f", help="table | csv | json | parquet")
    out_file: str | None = option(None, flag="--out", short="-o", help="Write the result to this file")
    overwrite: bool = option(False, help="Replace an --out file written by kd")

    def __post_init__(self) -> None:
        check_ranges(self, "kd query options")
