"""common.stop: the first signal is a request, the second one acts as if kd had never set a handler."""

from __future__ import annotations

import signal

import pytest

from kd.common.stop import Stopped, StopRequest


def test_first_signal_is_recorded_second_interrupts_and_handlers_come_back():
    # Python's own Ctrl-C handler before, whatever earlier tests left (ray.init sets handlers of its own)
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _second_signal_interrupts()
    finally:
        signal.signal(signal.SIGINT, found)


def _second_signal_interrupts() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyboardInterrupt), StopRequest() as stop:
        signal.raise_signal(signal.SIGTERM)
        assert (stop.signum, stop.name) == (signal.SIGTERM, "SIGTERM")  # nothing was interrupted
        signal.raise_signal(signal.SIGINT)  # the second: Python's own Ctrl-C
        for _ in range(1000):  # the KeyboardInterrupt is raised between two bytecodes
            pass
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_stopped_exits_like_a_shell_reports_the_signal():
    e = Stopped(signal.SIGINT, "stopped", "out", "rerun")
    assert e.exit_code == 130 and "fix:   rerun" in str(e)
