"""The folder an export is written to: claimed before anything is read, swapped in whole at the end.

- `prepare_output`: the gate every kd output goes through (`common.outputs.claim_output`);
- `export_folder`: the export held (`common.outputs.locked_output`: a second export into the same folder is
  refused) and built in a partial folder beside the target (`outputs.partial_folder`: a killed export's is
  removed by the next one, which needs no `--overwrite`);
- `replace_folder`: the finished export is renamed into place; a previous export is moved aside first and
  removed after, so no half-written folder remains.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kd.common.errors import InputError
from kd.common.outputs import (
    EXPORT,
    claim_output,
    file_lost,
    kd_record_left,
    kd_wrote,
    locked_output,
    partial_folder,
    sidecar_of,
)
from kd.student.model_card import export_card


def prepare_output(out: str | os.PathLike, source: str | os.PathLike, overwrite: bool) -> Path:
    """The output folder's resolved path, checked by `common.outputs.claim_output` before the student is read:
    never the student, a folder inside it or holding it, nor a store or another student; a non-empty one only
    with `overwrite`, and only when it holds a previous export (`replace_folder` swaps it in at the end)."""
    return claim_output(out, "kd export", (EXPORT,), [source], overwrite=overwrite, fresh=True)


@contextmanager
def export_folder(out: str | os.PathLike, source: str | os.PathLike, overwrite: bool) -> Iterator[tuple[Path, Path]]:
    """(target, scratch): build the export in `scratch / "model"`; when the block ends without an error it
    replaces the target. The target is claimed again under the lock: another export may just have finished."""
    with locked_output(prepare_output(out, source, overwrite), "kd export") as target:
        prepare_output(out, source, overwrite)
        scratch = partial_folder(target)
        try:
            yield target, scratch
            export_card(scratch / "model", Path(source))
            _shareable(scratch / "model")
            _keep_foreign(scratch / "model", target)
            replace_folder(scratch / "model", target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _shareable(folder: Path) -> None:
    """Give every file the mode a plain open() gives (0666 less the umask): safetensors writes weights 0600, so an
    export copied to a shared model folder or served by another user could not be read."""
    umask = os.umask(0)
    os.umask(umask)
    for p in folder.rglob("*"):
        if p.is_file() and not p.is_symlink():
            p.chmod(0o666 & ~umask)


def _keep_foreign(new: Path, target: Path) -> None:
    """--overwrite replaces an export, never a user's files in it: a file the new export does not write (notes
    someone added) refuses the swap, and the old folder stays as it was."""
    if not target.is_dir():
        return
    mine = {p.relative_to(new) for p in new.rglob("*")}

    def replaced(p: Path) -> bool:  # a file the new export writes, or kd's record of one (kd distill's card's)
        file = sidecar_of(p)
        return p.relative_to(target) in mine or (file is not None and file.relative_to(target) in mine
                                                 and (kd_wrote(p) or kd_record_left(p)))

    # (any kd output counted as the export's: vectors kd embed wrote into the folder were deleted: a probe)
    foreign = sorted({file_lost(p).relative_to(target) for p in target.rglob("*") if p.is_file() and not replaced(p)})
    if foreign:
        raise InputError(f"--overwrite would delete {len(foreign)} file(s) that kd export did not write, e.g. "
                         f"{foreign[0]}", str(target), "move them out first, or pass a new --out")


def replace_folder(src: Path, target: Path) -> None:
    """Move a finished directory into place; an old one is moved aside first and removed after (a kill in
    between leaves it among the partials the next export removes)."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.kd-partial-old-{os.getpid()}")
        os.replace(target, old)
    os.replace(src, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
