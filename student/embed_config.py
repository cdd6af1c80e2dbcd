"""The options of `kd embed`, declared once (kd.common.options); `student.embed.embed` takes the same keywords.
Light to import: `kd --help` builds the command from these fields (student.embed imports pyarrow and torch)."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common import bounds as B
from kd.common.hardware import check_device
from kd.common.options import check_ranges, option
from kd.common.paths import plain_path


@dataclass(frozen=True)
class EmbedConfig:
    """Whose vectors `kd embed` writes, of which texts, where. Checked when built (ranges, the device)."""

    input: str = option(argument=True, help="A kd store, or a .txt/.jsonl/.csv/.parquet file of texts")
    student: str = option(path=True, help="Folder written by kd train-student")
    out: str | None = option(None, short="-o", help="Store: the same store (default); file input: a Parquet file")
    name: str | None = option(None, help="Table students/NAME (default: the student folder name)")
    text_column: str | None = option(None, help="Text column of a .jsonl/.csv/.parquet input")
    batch_size: int = option(256, range=B.BATCH)
    device: str = option("cpu", devices=B.DEVICES[1:], help="cpu | cuda | cuda:N")
    overwrite: bool = option(False, help="Replace students/NAME written by another student, or an --out file kd "
                                         "wrote")
    progress: bool = option(True, help="Show a progress bar")

    def __post_init__(self) -> None:
        check_ranges(self, "kd embed options")
        # a store (local or remote) or a local file of texts: not a `path` option, which refuses remote addresses
        object.__setattr__(self, "input", plain_path(self.input))
        check_device(self.device)
