"""Where kd writes: every folder or file a command writes, and what `--overwrite` may replace, is checked by
`claim_output` (the one gate), on resolved paths, before the command does any work.

kd recognises its own folders (`kind_of`) by the files it writes into them:
- store: `manifest.json` whose format is kd-store, or a `manifests/` folder of kd-store fragments;
- student: `config.json` whose format is kd-student, or the lock of a `kd train-student` run;
- finetune: a student with `task.json` (`kd finetune`); teacher: `finetune_args.json` (`kd finetune-teacher`);
- export: `kd_onnx.json` (`kd export --format onnx`), or a sentence-transformers folder (`modules.json` and
  `config_sentence_transformers.json`, `kd export --format sentence-transformers`).

The rules of `claim_output`:
1. an output is never an input, never inside one, and never contains one;
2. an output is never inside a kd folder (a file in a store, a student in a student);
3. a folder holding a kd output of a kind the command does not write is never written into;
4. `--overwrite` replaces a non-empty folder only when it is of the command's kinds and no other kd output
   lies below it (anything else is refused: "only replaces a folder written by ...");
5. the output is a folder (or a file) as the command needs, and the nearest existing folder is writable.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Collection, Iterable
from pathlib import Path

from kd.common.errors import InputError

STORE, STUDENT, FINETUNE, TEACHER, EXPORT = "store", "student", "finetune", "teacher", "export"
COMMANDS = {STORE: "kd precompute", STUDENT: "kd train-student", FINETUNE: "kd finetune",
            TEACHER: "kd finetune-teacher", EXPORT: "kd export"}
TRAIN_LOCK = ".kd-train.lock"  # kd train-student's lock, left in every student folder it writes
_HEAD = 4096  # kd writes "format" as the first key of its JSON records


def _has_format(path: Path, name: str) -> bool:
    """Whether a JSON file kd wrote starts with its format name (read from its first bytes only)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD).decode("utf-8", "replace")
    except OSError:
        return False
    return re.search(r'"format"\s*:\s*"' + re.escape(name) + '"', head) is not None


def _is_store(folder: Path) -> bool:
    if _has_format(folder / "manifest.json", "kd-store"):
        return True
    frags = folder / "manifests"
    return frags.is_dir() and any(_has_format(p, "kd-store") for p in sorted(frags.glob("*.json"))[:1])


def kind_of(folder: Path) -> str | None:
    """Which kd output a folder is (STORE, FINETUNE, TEACHER, STUDENT, EXPORT), or None."""
    if not folder.is_dir():
        return None
    if _is_store(folder):
        return STORE
    if (folder / "finetune_args.json").is_file():  # pipeline.finetune_teacher.ARGS_FILE, written first
        return TEACHER
    if (folder / "task.json").is_file():  # student.finetune.TASK_FILE
        return FINETUNE
    if _has_format(folder / "config.json", "kd-student") or (folder / TRAIN_LOCK).exists():
        return STUDENT
    if (folder / "kd_onnx.json").is_file() or ((folder / "modules.json").is_file()
                                              and (folder / "config_sentence_transformers.json").is_file()):
        return EXPORT
    return None


def _describe(kind: str) -> str:
    return f"a {kind} (written by {COMMANDS[kind]})"


def _check_inputs(out: Path, inputs: Iterable[str | os.PathLike | None], flag: str) -> None:
    """Rule 1 on resolved paths (symlinks followed): `out` is no input, is not inside one, holds none."""
    for raw in inputs:
        if raw is None or "://" in os.fspath(raw):
            continue
        inp = Path(raw).resolve()
        if out == inp:
            raise InputError(f"{flag} is the input {raw}; it would be overwritten", str(out),
                             f"pass another {flag}")
        if inp in out.parents:
            raise InputError(f"{flag} lies inside the input {raw}", str(out), f"pass a {flag} outside it")
        if out in inp.parents:
            raise InputError(f"{flag} contains the input {raw}; --overwrite would delete it", str(out),
                             f"pass a {flag} that does not hold the input")


def _check_parents(out: Path, flag: str) -> None:
    """Rules 2 and 5: no kd folder above `out`, and the nearest existing folder is a writable folder."""
    for p in out.parents:
        kind = kind_of(p)
        if kind is not None:
            raise InputError(f"{flag} lies inside {_describe(kind)}: {p}", str(out),
                             f"pass a {flag} outside that folder")
    folder = out if out.is_dir() else out.parent
    while not folder.exists():  # the root always exists
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"{flag} cannot be created: {folder} is a file, not a folder", str(out),
                         f"pass a {flag} under a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{flag} cannot be written: {folder} is not writable", str(out), f"pass a writable {flag}")


def _foreign_below(out: Path) -> Path | None:
    """The first kd output below `out` (not `out` itself), which replacing `out` would delete."""
    for dirpath, dirnames, _ in os.walk(out):
        for d in sorted(dirnames):
            if kind_of(Path(dirpath) / d) is not None:
                return Path(dirpath) / d
    return None


def claim_output(out: str | os.PathLike, command: str, kinds: Collection[str] = (),
                 inputs: Iterable[str | os.PathLike | None] = (), *, overwrite: bool = False, fresh: bool = False,
                 remove: bool = False, file: bool = False, flag: str = "--out") -> Path:
    """Check an output path by the rules above and return it resolved; raises InputError naming the path.

    - `file`: the output is one file (refused when it is a folder; an existing one needs `overwrite`);
    - folders: `kinds` are the kd outputs this command writes (rule 3); `fresh`: the command needs an empty
      folder, so a non-empty one needs `overwrite` (rule 4); `remove`: then the old folder is deleted here
      (otherwise the caller replaces it, e.g. by an atomic swap, or resumes in it).
    """
    path = Path(os.fspath(out).removeprefix("file://")).resolve()
    if file and path.is_dir():
        raise InputError(f"{flag} is an existing folder, {command} writes one file", str(out),
                         f"pass a file path for {flag}")
    if not file and path.exists() and not path.is_dir():
        raise InputError(f"{flag} is an existing file, not a folder", str(out), f"pass a folder path for {flag}")
    _check_inputs(path, inputs, flag)
    _check_parents(path, flag)
    if file:
        if path.exists() and not overwrite:
            raise InputError(f"{flag} already exists", str(out), "pass another path, or --overwrite to replace it")
        return path
    kind = kind_of(path)
    if kind is not None and kind not in kinds:
        raise InputError(f"{flag} holds {_describe(kind)}; {command} never writes into it", str(out),
                         f"pass another {flag}")
    full = path.is_dir() and any(path.iterdir())
    if full and fresh and not overwrite:
        raise InputError(f"{flag} already holds files (the output folder is not empty)", str(out),
                         f"pick an empty folder, or pass --overwrite to replace a previous {command} output")
    if full and overwrite:
        _check_replaceable(path, kind, kinds, command, flag)
        if remove:
            shutil.rmtree(path)
    return path


def _check_replaceable(path: Path, kind: str | None, kinds: Collection[str], command: str, flag: str) -> None:
    """Rule 4: only a folder of this command's kinds, with no other kd output below it."""
    if kind not in kinds:
        raise InputError(f"--overwrite only replaces a folder written by {command}, and {flag} is not one",
                         str(path), f"pass a new {flag}, or empty this folder yourself")
    below = _foreign_below(path)
    if below is not None:
        raise InputError(f"--overwrite would delete {_describe(kind_of(below))} inside {flag}: {below}",
                         str(path), f"move it out first, or pass a new {flag}")
