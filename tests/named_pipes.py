"""Named pipes (FIFOs) as inputs, for the tests that kd refuses them without opening them: opening a pipe nobody
writes to blocks forever, so each comes with a timer that unblocks such an open."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def make_fifo(path: Path) -> Path:
    """A named pipe at `path`."""
    os.mkfifo(path)
    return path


def unblocking(fifo: Path) -> threading.Timer:
    """Should a reader open the pipe after all, a writer opens it after 20 s: the test then fails, never hangs."""
    timer = threading.Timer(20, lambda: open(fifo, "wb").close())
    timer.daemon = True
    timer.start()
    return timer
