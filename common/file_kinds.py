"""What a path is, found without opening it: a named pipe blocks its opener forever and a device such as /dev/zero
never ends, so every file kd reads by a path it was given is checked here first (inputs, received folders, stores).
"""

from __future__ import annotations

import os
import stat

_NOT_REGULAR = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a character device",
                stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def special_file(path: str | os.PathLike) -> str | None:
    """What `path` is when it exists but is neither a regular file nor a folder (e.g. "a named pipe (FIFO)"), else
    None; found without opening it: opening a named pipe blocks until something writes into it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing, or cannot be reached: the reader that opens it says so
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else _NOT_REGULAR.get(stat.S_IFMT(mode), "not a file")
