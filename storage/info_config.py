"""The option of `kd info`, declared once (kd.common.options). Light to import: `kd --help` builds the command from
this field (storage.info imports rich's tables and the store)."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common.options import check_ranges, option


@dataclass(frozen=True)
class InfoConfig:
    """What `kd info` shows: the store's manifest summary (`storage.info.info`)."""

    store: str = option(argument=True, remote=True, help="Store folder or URI")

    def __post_init__(self) -> None:
        check_ranges(self, "kd info options")
