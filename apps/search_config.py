"""The options of `kd search`, declared once (kd.common.options); `apps.search.search_text` takes the same keywords.
Light to import: `kd --help` builds the command from these fields (apps.search imports numpy and faiss)."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common import bounds as B
from kd.common.errors import InputError
from kd.common.options import check_ranges, option


@dataclass(frozen=True)
class SearchConfig:
    """What `kd search` looks for, in which store, embedded by which model. Checked when built, before the store
    is opened."""

    store: str = option(argument=True, remote=True, help="Store folder")
    query: str = option(argument=True, help="Query text")
    student: str | None = option(None, path=True, help="Student directory to embed the query")
    teacher: str | None = option(None, help="Teacher of the store to embed the query")
    k: int = option(10, flag="-k", range=B.K, help="How many results")
    table: str | None = option(None, help="Indexed table (default: the teacher's, or by dim)")
    column: str | None = option(None, help="Indexed column (default: teacher's default target)")
    kind: str | None = option(None, choices=B.IndexKind, help="Index kind when several exist")

    def __post_init__(self) -> None:
        if not isinstance(self.query, str) or not self.query.strip():  # an empty text has no meaning to be near to
            raise InputError("the query text is empty", "kd search QUERY", 'pass the text to search for, e.g. '
                             '"rates rose"')
        check_ranges(self, "kd search options")
        if (self.student is None) == (self.teacher is None):
            raise InputError("give exactly one query encoder", "kd search", "pass --student DIR or --teacher NAME")
