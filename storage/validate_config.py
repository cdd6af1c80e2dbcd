"""The options of `kd validate`, declared once (kd.common.options). Light to import: `kd --help` builds the command
from these fields (storage.validate imports pyarrow)."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common.options import check_ranges, option


@dataclass(frozen=True)
class ValidateConfig:
    """What `kd validate` checks (`storage.validate.validate_store`), and whether it repairs first."""

    store: str = option(argument=True, remote=True, help="Store folder or URI")
    repair: bool = option(False, help="Drop damaged shards from the record (re-run precompute to redo them)")

    def __post_init__(self) -> None:
        check_ranges(self, "kd validate options")
