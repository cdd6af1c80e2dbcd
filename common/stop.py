"""Graceful stops: SIGINT / SIGTERM become a request a loop checks between two units of work.

- The first signal is recorded, nothing is interrupted: the loop ends its current unit (a training step
  with its optimizer update), saves, and stops with `Stopped`. Raising from the handler instead would
  land anywhere, e.g. between a backward pass and the optimizer step, or inside a checkpoint write.
- A second signal runs the handler that was there before (Ctrl-C twice: a KeyboardInterrupt now; a
  second SIGTERM: the default, the process ends), for when the unit itself hangs.
- Handlers can only be set from the main thread; elsewhere no stop is ever requested (a scheduler's
  SIGTERM then ends the process as before).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from kd.common.errors import KdError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KdError):
    """A job stopped on request after saving what resumes it; exits 128 + the signal's number, as a shell
    reports a process ended by that signal (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, signum: int, what: str, where: str | None = None, fix: str | None = None) -> None:
        super().__init__(what, where, fix)
        self.signum = signum
        self.exit_code = 128 + signum

    def __reduce__(self):
        return type(self), (self.signum, self.what, self.where, self.fix)


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
