"""The folder an export is written to: claimed before anything is read, swapped in whole at the end.

- `prepare_output`: the gate every kd output goes through (`common.outputs.claim_output`);
- `replace_folder`: the finished export, built in a temporary folder beside the target, is renamed into
  place; a previous export is moved aside first and removed after, so no half-written folder remains.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kd.common.outputs import EXPORT, claim_output


def prepare_output(out: str | os.PathLike, source: str | os.PathLike, overwrite: bool) -> Path:
    """The output folder's resolved path, checked by `common.outputs.claim_output` before the student is read:
    never the student, a folder inside it or holding it, nor a store or another student; a non-empty one only
    with `overwrite`, and only when it holds a previous export (`replace_folder` swaps it in at the end)."""
    return claim_output(out, "kd export", (EXPORT,), [source], overwrite=overwrite, fresh=True)


def replace_folder(src: Path, target: Path) -> None:
    """Move a finished directory into place; an old one is moved aside first and removed after."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(src, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
