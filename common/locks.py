"""The one exclusive lock kd takes on a file: a non-blocking flock, which the kernel releases when its holder dies
(even by SIGKILL), so a killed run never leaves a stale lock behind. Stores, training runs and every folder
output (common.outputs.locked_output) hold theirs through `try_lock`."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
import weakref
from typing import IO

from kd.common.errors import InputError

# The lock files this process holds. A forked child shares their open file descriptions, and with them the flock:
# a DataLoader worker kept a killed run's lock for ~5 s, until it noticed its parent was gone (a probe's rerun in
# that window was refused as "another run is writing").
_held: weakref.WeakSet[IO] = weakref.WeakSet()


def try_lock(path: str | os.PathLike, *, unlinked_on_release: bool = False, wait_s: float = 0.0) -> IO | None:
    """An open file holding an exclusive flock on `path` (created if needed), or None when another process holds
    it (still, after `wait_s` seconds of retries). Keep the file open for as long as the lock is needed.

    `unlinked_on_release`: the lock's holders delete the file when they let go, so a file we opened may be
    unlinked before our flock lands; a lock on an unlinked inode guards nothing, so we check and try again."""
    _refuse_no_regular_file(path)
    give_up = time.monotonic() + wait_s
    while True:
        f = open(path, "a+")  # noqa: SIM115 - held by the caller
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            if time.monotonic() >= give_up:
                return None
            time.sleep(0.02)
            continue
        if not unlinked_on_release:
            _held.add(f)
            return f
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(f.fileno()).st_ino == os.stat(path).st_ino:
                _held.add(f)
                return f
        f.close()


def _refuse_no_regular_file(path: str | os.PathLike) -> None:
    """A lock path holding something other than a file: opening a FIFO to append raised a traceback (probe), a
    folder an OS error, and kd must not lock, or later delete, what a user put there."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "no regular file"
        raise InputError(f"kd's lock file is {kind}", os.fspath(path),
                         "move it away (kd creates the lock file itself) and run again")


def held_elsewhere(path: str | os.PathLike) -> bool:
    """Whether another process holds the lock on `path` (an existing file), asked without taking it: a shared flock
    on a read-only open, which an exclusive holder refuses, dropped at once. Nothing is created or written (a dry
    run may look at a lock file it cannot write); a run that meets the shared flock in that instant waits it out
    (`try_lock`'s `wait_s`)."""
    if not os.path.isfile(path):  # none (a FIFO would block the open below forever: probe)
        return False
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def let_go_of_inherited_locks(*_: object) -> None:
    """In a forked child that only helps its parent (a DataLoader worker): stop sharing the parent's locks, so they
    end with the parent. Each descriptor is pointed at /dev/null rather than closed (closing would leave its number
    free for reuse while the inherited file object may still close it), and never unlocked (that would release the
    parent's lock too). Takes and ignores a DataLoader's worker id."""
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        for f in list(_held):
            if not f.closed:
                os.dup2(null, f.fileno())
    finally:
        os.close(null)
    _held.clear()
