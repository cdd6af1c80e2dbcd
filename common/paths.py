"""The file a path names: one rule for every path a user gives kd (a file or folder it reads or writes, a store),
and for telling whether a rerun names the same files as the run it continues.

- A file: URI is a local path: file:///abs, file:/abs, file://localhost/abs, %-escapes (`Path.as_uri()` writes a
  space as %20, '#' as %23). One of another host, with no path, or with a query or fragment is refused, as is a
  NUL anywhere (no path holds one: Python's ValueError reached the user).
- Any other `scheme://...` is a remote address: a store may live there (pyarrow opens it), a file kd reads or
  writes by itself may not (`Path("s3://b/x")` is ./s3:/b/x: a probe's outputs landed there, exit 0).
- Anything else is a path as the OS reads it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from kd.common.errors import InputError

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")  # RFC 3986; a scheme is case-insensitive (FILE:///x)


def is_uri(path: str | os.PathLike) -> bool:
    """A remote address (s3://, gs://, hdfs://): kd compares it as it is written. A file: URI is a local path."""
    text = os.fspath(path)
    scheme = _SCHEME.match(text)
    return scheme is not None and text[scheme.end():].startswith("//") and not _is_file_uri(text)


def _is_file_uri(text: str) -> bool:
    return text[:5].lower() == "file:"


def refuse_empty(path: str | os.PathLike, flag: str) -> None:
    """Path("") is the working folder: kd never takes an empty (or blank) path for it, to read or to write."""
    if not os.fspath(path).strip():
        raise InputError(f"{flag} is empty", f"{flag} {os.fspath(path)!r}", f"pass a path for {flag}")


def plain_path(path: str | os.PathLike) -> str:
    """The path a local path or file: URI names, as the OS reads it (relative stays relative); a remote address
    unchanged (the caller decides whether one may be there)."""
    text = os.fspath(path)
    if "\0" in text or ("%00" in text.lower() and _is_file_uri(text)):
        raise InputError("a path holding a NUL character", repr(text), "pass the path without it")
    if not _is_file_uri(text):
        return text
    uri = urlparse(text)
    if uri.netloc.lower() not in ("", "localhost"):  # (a host name is case-insensitive: file://LOCALHOST/x)
        raise InputError("a file: URI of another machine is no local path", text,
                         "pass a local path (file:///abs/path or /abs/path)")
    if uri.query or uri.fragment or text.endswith(("?", "#")):
        raise InputError("a file: URI with a query or fragment ('?' or '#' ends its path)", text,
                         "pass the path itself, or escape '#' as %23 and '?' as %3F")
    if not uri.path:
        raise InputError("a file: URI naming no path", text, "pass the path (file:///abs/path or /abs/path)")
    return unquote(uri.path)  # (url2pathname on POSIX; urllib.request costs 19 ms at import)


def local_path(path: str | os.PathLike) -> Path:
    """The file a local path names, as kd compares paths: `plain_path`, made absolute, symlinks followed (so `run`,
    `run/`, `/abs/run`, `file:///abs/run` and a link to it are one). A remote address is refused."""
    text = os.fspath(path)
    if is_uri(text):
        raise InputError("a remote address where kd needs a local path", text,
                         "pass a local path, and copy the result there afterwards")
    return Path(plain_path(text)).resolve()


def named_files(opts: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """`opts` with each option of `keys` (a path, or a list of paths) as the file it names (`local_path`; a URI as
    it is): how kd tells whether a rerun names the same files as the run it continues."""
    return opts | {k: _named(opts[k], _file_named) for k in keys if k in opts}


def as_given(path: str | os.PathLike) -> Path:
    """A local path made absolute as given, links not followed (`local_path` follows them): the spelling an old
    record's relative paths are matched against (`recorded_files`)."""
    return Path(os.path.abspath(plain_path(path)))


def recorded_files(record: dict[str, Any], keys: Iterable[str], out: Path, record_file: str | os.PathLike, *,
                   guess_here: bool = True, fix: str = "pass --overwrite to start again, or use a new --out"
                   ) -> dict[str, Any]:
    """`named_files` for a record a run left in its folder `out` (`as_given`), read from `record_file`. kd before
    2026-11-30 recorded paths as typed, relative to the folder the run was started from: that folder is `out` less
    the parts of the recorded out (`--out runs/a` in /w: /w; `--out .`: out itself), tried as given and then with its
    links followed, and a relative path is read against it. Where the recorded out cannot tell (absent, absolute,
    climbing with '..', or not the end of `out`: a moved folder), `guess_here` reads a relative path against the
    current folder (a rerun from the same folder matches, as before), else as a name that equals no file (where a
    wrong match would delete the run's work). A recorded value that names no local file is the record's fault, said
    so (it read as if the user had typed it: a probe)."""
    def file_named(v: Any) -> Any:
        if not isinstance(v, str) or is_uri(v) or os.path.isabs(plain_path(v)):
            return _file_named(v)
        if start is not None:
            return str(local_path(start / plain_path(v)))
        return str(local_path(v)) if guess_here else f"{v} (relative to a folder the record does not name)"

    try:
        start = start_folder(record.get("out"), out)
        return record | {k: _named(record[k], file_named) for k in keys if k in record}
    except InputError as e:
        raise InputError(f"{os.fspath(record_file)} records a path kd cannot read ({e.what}: {e.where}), so which "
                         "files its run read is unknown", os.fspath(record_file), fix) from None


def start_folder(typed: Any, out: Path) -> Path | None:
    """The folder a run recorded with out `typed` (as typed) was started from, if `out` tells it."""
    if not isinstance(typed, str) or not typed or is_uri(typed) or os.path.isabs(plain_path(typed)):
        return None
    parts = Path(plain_path(typed)).parts
    if ".." in parts:
        return None
    for folder in dict.fromkeys([out, out.resolve()]):
        if not parts:  # "." (or "./"): the run was started in its own folder
            return folder
        if folder.parts[-len(parts):] == parts and len(folder.parts) > len(parts):
            return folder.parents[len(parts) - 1]
    return None


def _file_named(v: Any) -> Any:
    return str(local_path(v)) if isinstance(v, str) and not is_uri(v) else v


def _named(v: Any, file_named: Callable[[Any], Any]) -> Any:
    """An option's value with each path in it (one, or a list) as `file_named` reads it."""
    return [file_named(x) for x in v] if isinstance(v, list) else file_named(v)
