"""The one exclusive lock kd takes on a file: a non-blocking flock, which the kernel releases when its holder dies
(even by SIGKILL), so a killed run never leaves a stale lock behind. Stores, training runs and every folder
output (common.outputs.locked_output) hold theirs through `try_lock`."""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import IO


def try_lock(path: str | os.PathLike, *, unlinked_on_release: bool = False) -> IO | None:
    """An open file holding an exclusive flock on `path` (created if needed), or None when another process holds
    it. Keep the file open for as long as the lock is needed.

    `unlinked_on_release`: the lock's holders delete the file when they let go, so a file we opened may be
    unlinked before our flock lands; a lock on an unlinked inode guards nothing, so we check and try again."""
    while True:
        f = open(path, "a+")  # noqa: SIM115 - held by the caller
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return None
        if not unlinked_on_release:
            return f
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(f.fileno()).st_ino == os.stat(path).st_ino:
                return f
        f.close()
