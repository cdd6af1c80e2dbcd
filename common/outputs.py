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
5. the output is a folder (or a file) as the command needs, and the nearest existing folder is writable;
   an empty path is refused as such;
6. an existing file is replaced only with `--overwrite`, and only when kd wrote it (`is_kd_file`);
7. a file's record goes beside it (below): a file is never named as a record (nor as a temp file), and nothing but
   kd's record of it stands where its record goes.

How kd knows a file is its own (rule 6): `write_file` writes every single-file output (query -o, leakage
--exclude-out, eval --json/--markdown/--plot, embed -o) into a temporary file beside it and renames it into
place, so a killed run never leaves half a file under the final name; before the rename it writes a hidden
sidecar `.NAME.kd.json` holding the command and the sha256 of the bytes it wrote. A file is kd's when its
sidecar exists and its sha256 still matches: any format is covered (CSV and JSON lines have no room for a
marker), and a user's file put at that path later, or edited since, no longer matches, so it is never replaced.
A symbolic link at the output's path is replaced by the file, never written through (the gate checked what it
named; a link made after the gate, inside kd distill's --out while it ran, had a user's file overwritten).

Folders (`locked_output`): a command that builds a folder holds an exclusive flock on `.NAME.kd-lock` beside it
while it works; a second command writing the same folder is refused. The kernel drops a flock when its holder
dies, even by kill -9, so no stale lock is ever left. A folder is built in `.NAME.kd-partial-PID` beside the
target and renamed into place at the end (`partial_folder`); partials left by a killed run are removed by the
next run under the lock, so rerunning the same command needs no `--overwrite`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path

from kd.common.errors import InputError, KdError, as_kd_error
from kd.common.locks import try_lock
from kd.common.paths import is_uri, local_path, plain_path, refuse_empty

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
    # anchored: a user's JSON holding the same pair deeper ({"meta": {"format": ...}}) is not kd's record
    return re.match(r'\s*\{\s*"format"\s*:\s*"' + re.escape(name) + '"', head) is not None


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
    if (folder / "finetune_args.json").is_file():  # pipeline.teacher.finetune.ARGS_FILE, written first
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
        if raw is None or is_uri(raw):
            continue
        inp = local_path(raw)
        if out == inp:
            raise InputError(f"{flag} is the input {raw}; it would be overwritten", str(out),
                             f"pass another {flag}")
        if inp in out.parents:
            raise InputError(f"{flag} lies inside the input {raw}", str(out), f"pass a {flag} outside it")
        if out in inp.parents:
            # (it said "--overwrite would delete it" to kd distill, which has no --overwrite: a probe)
            raise InputError(f"{flag} contains the input {raw}: writing the output there may replace or delete it",
                             str(out), f"pass a {flag} that does not hold the input")


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
    if not os.access(folder, os.W_OK | os.X_OK) or not _can_create_in(folder):
        raise InputError(f"{flag} cannot be written: {folder} is not writable", str(out), f"pass a writable {flag}")


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in `folder`: os.access answers yes to root for /proc or a read-only mount.
    TemporaryFile is an unnamed O_TMPFILE on Linux, so the probe leaves nothing behind."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


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
    refuse_empty(out, flag)
    if is_uri(out):  # (precompute writes a store to a URI itself, claiming only a local one)
        raise InputError(f"{flag} is a remote address; {command} writes here, on this machine", os.fspath(out),
                         f"pass a local path for {flag} and copy the result there afterwards")
    path = local_path(out)
    if file and path.is_dir():
        raise InputError(f"{flag} is an existing folder, {command} writes one file", str(out),
                         f"pass a file path for {flag}")
    if file and os.fspath(out).endswith(("/", os.sep)):  # (a file was written at the name: a probe)
        raise InputError(f"{flag} ends in '/', a folder's path, where {command} writes one file", str(out),
                         f"pass a file path for {flag} (without the trailing '/')")
    if not file and path.exists() and not path.is_dir():
        raise InputError(f"{flag} is an existing file, not a folder", str(out), f"pass a folder path for {flag}")
    _check_inputs(path, inputs, flag)
    _check_parents(path, flag)
    if file:
        _check_record_place(path, flag)
        if path.exists() and not overwrite:
            fix = ("pass another path, or --overwrite to replace it" if is_kd_file(path) else
                   "pass another path: kd did not write this file, so --overwrite will not replace it either")
            raise InputError(f"{flag} already exists", str(out), fix)
        if path.exists() and not is_kd_file(path):
            raise InputError(f"--overwrite only replaces a file kd wrote, and {flag} is not one (or was changed "
                             "since)", str(out), f"pass a new {flag}, or remove this file yourself")
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


def _check_record_place(path: Path, flag: str) -> None:
    """Rule 7. A file named as a record would be another output's record, or have one of its own at a name no record
    takes (kd eval wrote its Markdown table over its JSON report's record, exit 0: a probe); a user's file or a
    folder where the record goes was replaced without --overwrite, or failed the command after its work."""
    if sidecar_of(path) is not None:
        raise InputError(f"{flag} is named as kd's record of another file (.NAME.kd.json: where kd keeps the sha256 "
                         "of a file it wrote)", str(path), f"give {flag} another name")
    if path.name.startswith(".kd-tmp-"):  # (kd's next write beside it deleted it as a killed write's temp: a probe)
        raise InputError(f"{flag} is named as one of kd's temporary files (.kd-tmp-...), which kd deletes once their "
                         "writer is gone", str(path), f"give {flag} another name")
    side = sidecar(path)
    if side.is_symlink():  # (a dangling one was replaced, exit 0: a probe; kd never makes a link there)
        raise InputError(f"{flag}'s record goes at {side.name} beside it, which is a symbolic link (to "
                         f"{os.readlink(side)})", str(side), f"remove the link {side}")
    if side.is_dir():
        raise InputError(f"{flag}'s record goes at {side.name} beside it, which is a folder", str(side),
                         f"move or delete {side}")
    if side.exists() and not is_kd_record(side):
        raise InputError(f"{flag}'s record goes at {side.name} beside it, which holds a file kd did not write",
                         str(side), f"move {side} away (kd keeps its record of {flag} there)")


def _check_replaceable(path: Path, kind: str | None, kinds: Collection[str], command: str, flag: str) -> None:
    """Rule 4: only a folder of this command's kinds, with no other kd output below it."""
    if kind not in kinds:
        raise InputError(f"--overwrite only replaces a folder written by {command}, and {flag} is not one",
                         str(path), f"pass a new {flag}, or empty this folder yourself")
    below = _foreign_below(path)
    if below is not None:
        raise InputError(f"--overwrite would delete {_describe(kind_of(below))} inside {flag}: {below}",
                         str(path), f"move it out first, or pass a new {flag}")


# --- single files: written whole, recognised by a sidecar -------------------------------------------------
_SIDECAR_FORMAT = "kd-output"


def sidecar(path: Path) -> Path:
    """The hidden record beside a file kd wrote (see the module docstring)."""
    return path.with_name(f".{path.name}.kd.json")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def is_kd_file(path: str | os.PathLike) -> bool:
    """Whether kd wrote this file and it is unchanged since: its sidecar names the file's sha256."""
    path = Path(path)
    side = sidecar(path)
    if not path.is_file() or not _has_format(side, _SIDECAR_FORMAT):
        return False
    try:
        return json.loads(side.read_text(encoding="utf-8")).get("sha256") == _sha256(path)
    except (OSError, ValueError, RecursionError, AttributeError):  # (a sidecar edited into another shape)
        return False


def sidecar_of(path: str | os.PathLike) -> Path | None:
    """The file whose sidecar `path` is (`sidecar`'s inverse), or None when `path` is none."""
    p = Path(path)
    is_sidecar = p.name.startswith(".") and p.name.endswith(".kd.json") and len(p.name) > len("..kd.json")
    return p.with_name(p.name[1:-len(".kd.json")]) if is_sidecar else None


def is_kd_record(path: str | os.PathLike) -> bool:
    """A sidecar as kd writes it (a kd-output record, named for the file beside it), whatever that file holds now."""
    return sidecar_of(path) is not None and _has_format(Path(path), _SIDECAR_FORMAT)


def file_lost(path: str | os.PathLike) -> Path:
    """What a user would lose with `path`: for kd's record of a file they changed since (a card they edited), that
    file, which the refusal names; else `path`."""
    file = sidecar_of(path)
    return file if file is not None and file.exists() and is_kd_record(path) else Path(path)


def kd_record_left(path: str | os.PathLike) -> bool:
    """A sidecar kd wrote whose file is gone: what deleting a kd file by hand leaves."""
    file = sidecar_of(path)
    return file is not None and not file.exists() and is_kd_record(path)


def kd_wrote(path: str | os.PathLike) -> bool:
    """A file kd wrote (`is_kd_file`: e.g. kd distill's model card beside an export), or such a file's sidecar."""
    file = sidecar_of(path)
    return is_kd_file(path) or (file is not None and is_kd_file(file))


def _unwritable(path: Path, flag: str, e: OSError) -> KdError:
    disk = as_kd_error(e) if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else None
    if disk is not None:  # a full disk or the file-size limit: not the folder's rights
        return KdError(disk.what, str(path), disk.fix)
    return InputError(f"{flag} cannot be written: {e.strerror or e}", str(path),
                      f"pass a {flag} in a folder you can write to")


def _dead(pid: str) -> bool:
    """Whether no process has this id (a temp file's writer that was killed)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return True
    except PermissionError:
        return False
    return False


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def killed_write(path: str | os.PathLike) -> bool:
    """A temp file of a kd write (`temp_path`) whose process is gone: what a kill leaves."""
    pid, _, rest = Path(path).name.removeprefix(".kd-tmp-").partition(".")
    return Path(path).name.startswith(".kd-tmp-") and pid.isdigit() and bool(rest) and _dead(pid)


def _remove_stale_temps(path: Path) -> None:
    """Temp files (the output's and its sidecar's) of killed writes of this output: their writer is gone."""
    for name in (path.name, sidecar(path).name):
        for tmp in path.parent.glob(f".kd-tmp-*.{_glob_escape(name)}"):
            if killed_write(tmp) and not tmp.is_dir():  # (a folder so named is no temp of kd's: it failed the write)
                tmp.unlink(missing_ok=True)


def temp_path(path: str | os.PathLike) -> Path:
    """The temporary file beside `path` that write_file writes and renames into place (this process's); beside a
    link at `path`, not beside what it names (`written_path`)."""
    path = written_path(path)
    return path.with_name(f".kd-tmp-{os.getpid()}.{path.name}")


def write_file(path: str | os.PathLike, write: Callable[[Path], object], command: str,
               flag: str = "--out") -> Path:
    """Write one output file the kd way: missing parent folders created, `write(tmp)` into a temporary file
    beside it (same suffix, so writers that read it see the right format), the sidecar, then a rename.
    An OSError (an unwritable place such as /proc/x, a full disk) becomes an InputError naming the path. A symbolic
    link at the path is replaced by the file, never written through (a link made inside kd distill's --out while it
    ran had its report and card written onto a user's files outside it: a probe)."""
    path = written_path(path)
    tmp = temp_path(path)
    side = sidecar(path)
    side_tmp = temp_path(side)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(path)
        open(tmp, "xb").close()  # a place no file can be made (/proc/x) fails here, not inside the writer
        write(tmp)
        record = {"format": _SIDECAR_FORMAT, "command": command, "file": path.name, "sha256": _sha256(tmp)}
        side_tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        os.replace(side_tmp, side)
        os.replace(tmp, path)
    except OSError as e:
        raise _unwritable(path, flag, e) from e
    finally:
        tmp.unlink(missing_ok=True)
        side_tmp.unlink(missing_ok=True)
    return path


def written_path(path: str | os.PathLike) -> Path:
    """The file `write_file` writes for `path`: `local_path`, but a link as the last component is the link itself (its
    folder resolved), which the file replaces."""
    given = Path(plain_path(os.fspath(path))) if not is_uri(os.fspath(path)) else None
    if given is not None and given.is_symlink():
        return local_path(given.parent) / given.name
    return local_path(path)


def write_text(path: str | os.PathLike, text: str, command: str, flag: str = "--out") -> Path:
    """`write_file` for a text (UTF-8)."""
    return write_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), command, flag)


# --- folders: one writer at a time, built aside and renamed into place ------------------------------------
def _lock_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.kd-lock")


@contextlib.contextmanager
def locked_output(path: str | os.PathLike, command: str, flag: str = "--out") -> Iterator[Path]:
    """Hold the output folder `path` (resolved, already claimed) for this process: a second writer of the same
    folder is refused. The lock dies with the process (flock), so a killed run leaves none behind."""
    path = local_path(path)
    lock = _lock_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = try_lock(lock, unlinked_on_release=True)
    except OSError as e:
        raise _unwritable(path, flag, e) from e
    if f is None:
        raise InputError(f"another {command} is writing {flag} right now (its lock is held)", str(path),
                         f"wait for it to finish, or pass another {flag}")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()
        f.close()


def partial_folder(path: Path) -> Path:
    """A new, empty folder beside `path` to build it in (renamed into place at the end). Call under
    `locked_output`: partials of this output left by killed runs are removed first."""
    for old in path.parent.glob(f".{_glob_escape(path.name)}.kd-partial-*"):
        shutil.rmtree(old, ignore_errors=True)
    work = path.with_name(f".{path.name}.kd-partial-{os.getpid()}")
    work.mkdir()
    return work
