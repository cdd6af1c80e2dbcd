"""Errors a user can act on: every message says what went wrong, where, and how to fix it."""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import os
import re
from collections.abc import Iterator

# What one part of a message (what, where, fix) shows at most: a message quoting what the user gave (a CSV header
# of 2 MB as "columns: ...") took the terminal minutes to lay out, with no output (issue 48's probe).
MAX_PART_CHARS = 2000


def clipped(text: str) -> str:
    if len(text) <= MAX_PART_CHARS:
        return text
    return f"{text[:MAX_PART_CHARS]}... ({len(text):,} characters in all)"


class KdError(Exception):
    """An error caused by user input or store state; the CLI prints it and exits with `exit_code` (2)."""

    exit_code = 2

    def __init__(self, what: str, where: str | None = None, fix: str | None = None) -> None:
        self.what, self.where, self.fix = what, where, fix
        super().__init__(self._message())

    def _message(self) -> str:
        parts = [clipped(self.what)]
        if self.where:
            parts.append(f"  where: {clipped(self.where)}")
        if self.fix:
            parts.append(f"  fix:   {clipped(self.fix)}")
        return "\n".join(parts)

    def at(self, where: str) -> KdError:
        """This error at `where`: same class, exit code and attributes. Not `type(self)(what, where, fix)`, which
        a subclass with its own constructor (Stopped takes the signal first) does not accept."""
        err = copy.copy(self)
        err.where = where
        err.args = (err._message(),)
        return err

    def __reduce__(self):  # pickled whole (what, where, fix), e.g. raised in a Ray worker and re-raised by the driver
        return type(self), (self.what, self.where, self.fix)


class StoreError(KdError):
    """The store is missing, corrupt, incompatible or locked."""


class InputError(KdError):
    """An input file or column cannot be used."""


# errno -> (what, fix) for the OS errors a user causes and can act on (full disk, rights, wrong path); any
# other OSError is left as it is, so a real bug keeps its traceback.
_OS_ERRORS: dict[str, tuple[str, str]] = {
    "ENOSPC": ("the disk is full while writing", "free some space (or write to another disk) and rerun"),
    "EDQUOT": ("the disk quota is exceeded while writing", "free some space (or write to another disk) and rerun"),
    "EFBIG": ("a file grew past the file system's size limit while writing",
              "write to another file system (or free space) and rerun"),
    "EACCES": ("permission denied", "check the path's owner and permissions, or use another path"),
    "EPERM": ("operation not permitted", "check the path's owner and permissions, or use another path"),
    "EROFS": ("the file system is read-only", "write to a writable folder"),
    "ENOENT": ("no such file or directory", "check the path"),
    "EISDIR": ("a folder was given where a file is needed", "pass a file, not a folder"),
    "ENOTDIR": ("a file was given where a folder is needed", "pass a folder, not a file"),
    "ENAMETOOLONG": ("the path is too long", "use a shorter path"),
    "ELOOP": ("too many levels of symbolic links", "check the path's symbolic links (one may point at itself)"),
    "EMFILE": ("too many open files", "raise the limit (ulimit -n) and rerun"),
    "ENFILE": ("too many open files on this system", "close other programs or raise the limit, and rerun"),
    "EIO": ("an input/output error (a failing disk or network file system)", "check the device and rerun"),
}


# What pyarrow says of bytes that are not a Parquet file
_DAMAGED_PARQUET = re.compile(r"Parquet magic bytes|Couldn't deserialize thrift|Parquet file size is 0|"
                              r"invalid parquet|Parquet footer", re.I)
# What pyarrow's S3 / GCS / HDFS filesystems say when the service cannot be reached or refuses
_REMOTE = re.compile(r"AWS Error|Google Cloud|GCS|HDFS|Could not resolve host|Couldn't connect|NETWORK_CONNECTION")


# The disk errors a library may report inside its own exception type (safetensors: "os error 27", DuckDB and
# pyarrow: the strerror text); only these: any other error keeps its traceback.
_DISK = ("ENOSPC", "EDQUOT", "EFBIG")
_DISK_TEXT = {os.strerror(getattr(errno, name)): name for name in _DISK}


def _disk_error_inside(exc: BaseException) -> str | None:
    """The errno name (one of _DISK) a non-OSError exception's message reports, or None."""
    if isinstance(exc, OSError):
        return None
    text = str(exc)
    found = re.search(r"os error (\d+)|errno[ =:]+(\d+)", text, re.I)
    name = errno.errorcode.get(int(found.group(1) or found.group(2))) if found else None
    return name if name in _DISK else next((n for t, n in _DISK_TEXT.items() if t in text), None)


def as_kd_error(exc: BaseException) -> KdError | None:
    """The KdError a user-caused exception amounts to, or None for anything else (a bug keeps its traceback).

    User-caused: a KdError itself; an OSError of a full disk, a missing right or a wrong path; input too deeply
    nested to parse (RecursionError); bytes that are not UTF-8 text; invalid JSON. The CLI prints the result and
    exits with its code; a library caller can `raise as_kd_error(e) or e`.
    """
    if isinstance(exc, KdError):
        return exc
    if isinstance(exc, OSError) and exc.errno is None and _REMOTE.search(str(exc)):
        # pyarrow's remote filesystems (s3://, gs://, hdfs://) raise a bare OSError with the service's message
        return KdError(f"cannot reach the remote storage: {' '.join(str(exc).split())}", None,
                       "check the URI, the network and the credentials (e.g. AWS_PROFILE), or use a local path")
    if isinstance(exc, OSError) and exc.errno is not None:
        what, fix = _OS_ERRORS.get(errno.errorcode.get(exc.errno, ""), (None, None))
        if what is None:
            return None
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None) or None
        return KdError(f"{what} ({exc.strerror or exc})", where, fix)
    disk = _disk_error_inside(exc)
    if disk is not None:  # safetensors, DuckDB: an OS error reported in the library's own exception type
        what, fix = _OS_ERRORS[disk]
        return KdError(f"{what} ({' '.join(str(exc).split())[:200]})", None, fix)
    if type(exc).__module__.startswith("pyarrow") and _DAMAGED_PARQUET.search(str(exc)):
        # a file whose bytes are not Parquet (truncated, or another file renamed), its checksum forged to match
        return InputError(f"a Parquet file is damaged or not Parquet ({' '.join(str(exc).split())})", None,
                          "if it is a store's file: kd validate STORE --repair, then rerun the command that wrote "
                          "it; otherwise check the input file")
    if isinstance(exc, RecursionError):
        return InputError("an input is nested too deeply to read (a crafted or damaged file)", None,
                          "check the files this command reads (JSON nested thousands of levels deep is not kd's)")
    if isinstance(exc, json.JSONDecodeError):
        return InputError(f"a file is not valid JSON ({exc.msg})", f"line {exc.lineno} column {exc.colno}",
                          "check the file (it may be damaged or not the file kd expects)")
    if isinstance(exc, UnicodeDecodeError):
        return InputError(f"a file is not UTF-8 text ({exc.reason} at byte {exc.start}; a binary file?)", None,
                          "pass a UTF-8 text file (convert with: iconv -t utf-8)")
    return None


@contextlib.contextmanager
def located(where: str) -> Iterator[None]:
    """Inside: a user-caused error (`as_kd_error`) that names no place is raised as kd's error at `where` (a full
    disk reported inside DuckDB's or safetensors' own exception names no file; the output being written is it)."""
    try:
        yield
    except Exception as e:
        err = as_kd_error(e)
        if err is None or (err is e and err.where):
            raise
        raise err.at(err.where or where) from e
