"""What a `kd distill` step records of the files it wrote (distill.json's "files": {step: {name: sha256}}), and the one
comparison of those files with the record: a rerun redoes a step whose file is gone or changed (`run._intact`),
deletes only export files as the export wrote them (`run._foreign_files`), and copies another run's stage only as that
run trained it (`shared_stages`).

Names are relative to the run folder. A run of a kd from before 2026-11-30 recorded names only (a list): those files
compare by name, with no sha256 to check.
"""

from __future__ import annotations

import os
from pathlib import Path

from kd.storage import fs

Record = dict[str, str | None]  # name -> sha256 (None: recorded by name only)


def record(root: Path, paths: tuple[Path, ...]) -> dict[str, str]:
    """Every file under `paths` (files or folders inside `root`), relative to `root`, with its sha256. Left out: kd's
    own dotfiles (a lock's, a marker's)."""
    files = [p for path in paths for p in ([path] if path.is_file() else sorted(path.rglob("*")))]
    return {str(p.relative_to(root)): fs.file_sha256(p) for p in files if p.is_file() and not p.name.startswith(".")}


def well_formed(files: object) -> bool:
    """A step's record as `record` writes it (or a list of names, before 2026-11-30), every name relative and inside
    the run (a recorded "../x" was checked outside --out: a probe)."""
    names = files if isinstance(files, list) else list(files) if isinstance(files, dict) else None
    return names is not None and all(isinstance(n, str) and n and not os.path.isabs(n) and ".." not in Path(n).parts
                                     for n in names) and \
        (not isinstance(files, dict) or all(isinstance(h, str) for h in files.values()))


def recorded(state: dict, step: str) -> Record | None:
    """The files distill.json `state` records for `step`, or None (none recorded, or no record kd writes: another run's
    distill.json is read unchecked)."""
    files = state.get("files")
    files = files.get(step) if isinstance(files, dict) else None
    if not well_formed(files):
        return None
    return dict.fromkeys(files) if isinstance(files, list) else dict(files)


def as_written(path: Path, sha: str | None) -> bool:
    """Whether the file at `path` is the one recorded with `sha` (None: by name only)."""
    return path.is_file() and (sha is None or fs.file_sha256(path) == sha)


def first_changed(root: Path, files: Record) -> tuple[Path, str] | None:
    """The first of `files` (under `root`) gone, then the first not as written, with the reason; None: all as recorded.
    (Every file's presence is checked before any is hashed: a gone one is found without reading the weights.)"""
    gone = next((root / n for n in files if not (root / n).is_file()), None)
    if gone is not None:  # (is_file: a file replaced by a folder was "there", and a broken export stayed done)
        return gone, "is gone"
    changed = next((root / n for n, sha in files.items() if not as_written(root / n, sha)), None)
    return (changed, "is not as it was written") if changed is not None else None
