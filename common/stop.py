"""Graceful stops: SIGINT / SIGTERM become a request a loop checks between two units of work.

- The first signal is recorded, nothing is interrupted: the loop ends its current unit (a training step
  with its optimizer update), saves, and stops with `Stopped`. Raising from the handler instead would
  land anywhere, e.g. between a backward pass and the optimizer step, or inside a checkpoint write.
- A second signal runs the handler that was there before (Ctrl-C twice: a KeyboardInterrupt now; a
  second SIGTERM: the default, the process ends), for when the unit itself hangs.
- Handlers can only be set from the main thread; elsewhere no stop is ever requested (a scheduler's
  SIGTERM then ends the process as before).
- A command without a StopRequest of its own (eval, export, index, precompute's local engine) still must not
  die silently on SIGTERM: `sigterm_interrupts` makes SIGTERM raise `Terminated`, a KeyboardInterrupt, so it
  unwinds the way Ctrl-C does (finally blocks run, precompute keeps its finished batches) and the CLI says what
  was kept and the command that resumes.
"""

from __future__ import annotations

import contextlib
import copy
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from kd.common.errors import KdError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KdError):
    """A job stopped on request after saving what resumes it; exits 128 + the signal's number, as a shell
    reports a process ended by that signal (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, signum: int, what: str, where: str | None = None, fix: str | None = None) -> None:
        self.resume: str | None = None  # the exact command line that resumes (set by the CLI: `resuming`)
        super().__init__(what, where, fix)
        self.signum = signum
        self.exit_code = 128 + signum

    def _message(self) -> str:
        return super()._message() + (f"\n  resume: {self.resume}" if self.resume else "")

    def resuming(self, command: str) -> Stopped:
        """This stop, its message ending with the command line that resumes it."""
        err = copy.copy(self)
        err.resume = command
        err.args = (err._message(),)
        return err

    def __reduce__(self):
        return type(self), (self.signum, self.what, self.where, self.fix), {"resume": self.resume}


class StopRequest:
    """`with StopRequest() as stop:` ... `if stop.signum is not None:` save and raise `Stopped`."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # the second one: stop now, the way the process would have without us
            self.__exit__()
            signal.raise_signal(signum)
            return
        self.signum = signum

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program was, as Python raises Ctrl-C (see `sigterm_interrupts`)."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside: the first SIGTERM raises `Terminated`; a second one does what the handler before did (the default:
    the process ends), for when the unwinding itself hangs. A StopRequest inside takes SIGTERM over while it
    lives. Main thread only (elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)

    def handle(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, before)
        raise Terminated()

    signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
