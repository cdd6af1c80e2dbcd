"""Keep the calling thread's signal stack across OpenVINO calls.

Why: OpenVINO's CPU plugin installs its own alternate signal stack (sigaltstack) on the thread that compiles a
model, and when the plugin unloads it frees that memory without always putting the thread's previous stack
back (seen with OpenVINO 2026.4 when a model is compiled through a short-lived `ov.Core` after NNCF or
`convert_model` ran). The thread is then left with a dangling signal stack, and the next signal handled on it
(torch DataLoader's SIGCHLD handler when a child exits, Ctrl-C; Python installs its handlers with SA_ONSTACK)
kills the process with SIGSEGV, silently, since faulthandler needs that stack too.

- Read the thread's stack with sigaltstack(NULL, &old) before the call, and set it back afterwards; the
  plugin does not need its own stack to run inference (it only serves its fault handler).
- Linux only (where the bug was seen and sigaltstack is reachable through libc); elsewhere a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator


class _Stack(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _read(libc: ctypes.CDLL | None) -> _Stack | None:
    old = _Stack()
    return old if libc is not None and libc.sigaltstack(None, ctypes.byref(old)) == 0 else None


def current() -> tuple[int, int, int] | None:
    """(address, flags, size) of this thread's alternate signal stack, or None where it cannot be read."""
    old = _read(_libc())
    return None if old is None else (old.ss_sp or 0, old.ss_flags, old.ss_size)


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Run the body, then give this thread back the signal stack it had before."""
    libc = _libc()
    old = _read(libc)
    try:
        yield
    finally:
        if old is not None:
            libc.sigaltstack(ctypes.byref(old), None)
