"""The options of `kd index`, declared once (kd.common.options). Light to import: `kd --help` builds the command
from these fields (dataset.index imports faiss)."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common import bounds as B
from kd.common.options import check_ranges, option


@dataclass(frozen=True)
class IndexConfig:
    """Which vector column `kd index` indexes (None: `dataset.index.default_vector`'s choice), and how."""

    store: str = option(argument=True, remote=True, help="Store folder")
    table: str | None = option(None, help="Table: view name (minilm) or path (teachers/minilm); default: the first "
                                          "teacher")
    column: str | None = option(None, help="1-D vector column, e.g. sentence; default: sentence, else mean")
    kind: str = option("flat", choices=B.IndexKind, help="flat (exact) | ivf | hnsw")

    def __post_init__(self) -> None:
        check_ranges(self, "kd index options")
