"""Names users give to things inside a store (teachers, student tables, indexes) and path safety.

- A name becomes a folder (`teachers/<name>/`) and a DuckDB view, so it is restricted to a safe
  character set: a letter or digit first, then letters, digits, `_`, `-`, `.`; at most 64 characters;
  never `.` or `..`. This rules out path traversal (`../../x`) and quoting trouble in SQL.
- `inside` checks that a path built from a store root and parts resolves inside that root (symlinks
  included), the second line of defence for every write; `links_out` finds the symlinks of a whole folder
  that lead out of it (a received student or export, read as a whole).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence

from kd.common.errors import KdError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def check_name(name: str, what: str = "name") -> str:
    """Return `name` if it is safe as a table/folder name, else raise KdError saying what to use."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", "..") or ".." in name:
        raise KdError(
            f"invalid {what} {name!r}",
            None,
            "use 1-64 characters: letters, digits, '_', '-', '.', starting with a letter or digit (no '..')",
        )
    return name


def real_inside(root: str, *parts: str) -> tuple[str, bool]:
    """(the real path of root/parts, whether it lies inside root's real path), symlinks followed."""
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, *parts))
    return target, os.path.commonpath([base, target]) == base


def inside(root: str, *parts: str) -> str:
    """The real path of root/parts, refusing one that escapes root (e.g. through '..' or a symlink)."""
    target, ok = real_inside(root, *parts)
    if not ok:
        linked = any(os.path.islink(os.path.join(root, *parts[:i])) for i in range(1, len(parts) + 1))
        fix = (f"a symlink in the store leads out of it: run kd validate {root} --repair (it sets the link aside), "
               "or replace the link by a folder or file of the store" if linked
               else "use a plain name without '..' or '/'")
        raise KdError("refusing to write outside the store", target, fix)
    return target


def first_link(root: str | os.PathLike, skip: Sequence[str | os.PathLike] = ()) -> str | None:
    """The first symlink under `root` (a linked folder reported, never entered; the paths in `skip` neither reported
    nor entered, a dangling link among them: os.walk lists it as a file), or None: for folders kd writes in place,
    where any link would be written or copied through."""
    skipped = {os.fspath(p) for p in skip}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skipped]
        names = [os.path.join(dirpath, n) for n in (*dirnames, *filenames)]
        links = [p for p in names if p not in skipped and os.path.islink(p)]
        if links:
            return links[0]
    return None


def links_out(root: str, allowed: Sequence[str] = ()) -> Iterator[tuple[str, str]]:
    """(path relative to root, real target) of each symlink under `root` whose target lies outside root's real path
    and outside every `allowed` folder, by `real_inside`. A linked folder is reported, never entered."""
    for dirpath, dirnames, filenames in os.walk(root):  # (os.walk does not follow linked folders)
        for name in sorted(dirnames + filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if not os.path.islink(os.path.join(root, rel)):
                continue
            target, ok = real_inside(root, rel)
            if not ok and not any(real_inside(base, target)[1] for base in allowed):  # (absolute: target itself)
                yield rel, target
