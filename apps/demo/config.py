"""Every option of `kd demo`, declared once (flag, help, range: kd.common.options). Light to import: `kd --help`
builds the command from these fields."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common import bounds as B
from kd.common.errors import InputError
from kd.common.options import bounded, check_ranges, option


@dataclass
class DemoConfig:
    """Every option of `kd demo` (flags, help and ranges declared here: kd.common.options)."""

    out: str | None = option(None, short="-o", help="Folder for everything the demo writes (default: kd-demo; with "
                                                    "--quick: kd-demo-quick, so that the two never share one)")
    quick: bool = option(False, help="Tiny corpus slice and a few training steps (smoke test)")
    sentences: int | None = bounded(None, B.ROWS)  # default: all 6,000 bundled (quick: 400)
    epochs: int | None = option(None, range=B.EPOCHS, help="Training epochs of the BiLSTM tier (default: the arch's, "
                                                           "as kd train-student; static: its own)")
    tiers: tuple[str, ...] = ("static", "bilstm")
    threads: int | None = option(None, range=B.THREADS, help="Torch threads (default: all, or 1 when the CPUs are "
                                                             "busy)")
    overwrite: bool = option(False, help="Redo every stage instead of reusing finished ones")
    cache: bool = option(True, help="Reuse the teacher's evaluation vectors and speed of earlier runs")
    progress: bool = option(True, help="Show progress bars")

    def __post_init__(self) -> None:
        check_ranges(self, "kd demo options")
        if self.quick and self.epochs is not None:  # (quick trains a fixed 30 steps: --epochs was dropped silently)
            raise InputError(f"--epochs {self.epochs} with --quick, whose students train a fixed 30 steps of one epoch",
                             "kd demo options", "drop --quick to train for --epochs, or drop --epochs")
        if self.out is None:
            self.out = "kd-demo-quick" if self.quick else "kd-demo"
