"""The options of `kd leakage`, declared once (kd.common.options); `apps.leakage.check_store` takes the same
keywords. Light to import: `kd --help` builds the command from these fields (apps.leakage imports numpy)."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common.options import check_ranges, option


@dataclass(frozen=True)
class LeakageConfig:
    """Which store `kd leakage` checks against the evaluation sets, and where the overlapping ids go."""

    store: str = option(argument=True, remote=True, help="Store written by kd precompute")
    exclude_out: str | None = option(None, help="Write the overlapping rows' ids here (for train-student "
                                                "--exclude-ids)")
    overwrite: bool = option(False, help="Replace an --exclude-out file written by kd")

    def __post_init__(self) -> None:
        check_ranges(self, "kd leakage options")
