"""The test session's heartbeat: a process of its own that says which test is still running whenever the session
wrote nothing for a while (tests/conftest.py starts it and tells it, over its stdin, what runs and when it wrote).

Why a process and not a thread of the session: a thread needs the GIL, and a call that holds it (Ray shutting a
cluster down, an interpreter's exit) kept the beat from firing: the walk of the test command found 17.7 s without
a byte between two tests, and 14 s after pytest's summary. This process also beats through the session's end, and
leaves when the session's process has gone (it is reparented): not when its stdin closes, which the session's
finalization does before its libraries' own teardown (11.3 s without a beat after the summary in one walk).

usage: python tests/heartbeat.py SECONDS   (stdout: the terminal; stdin: lines "run NODEID" and "wrote")
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time


def main(every: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the session's to report, not this helper's
    parent, out = os.getppid(), sys.stdout.fileno()
    what, since = "the collection of the tests", time.monotonic()
    last, pending, stdin = since, b"", True
    while os.getppid() == parent:
        ready = select.select([0], [], [], 0.5)[0] if stdin else time.sleep(0.5)
        now = time.monotonic()
        if ready:
            chunk = os.read(0, 65536)
            if not chunk:  # the session let go of its end (its objects are freed before its C teardown): beat on
                stdin, what, since = False, "the end of the session", now
                continue
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                kind, _, text = line.decode("utf-8", "replace").partition(" ")
                if kind == "run":
                    what, since = text, now
                else:
                    last = now
        if now - last >= every:
            try:
                os.write(out, f"\n  still running {what} ({now - since:.0f} s)\n".encode())
            except OSError:  # the terminal or pipe is gone: nobody to tell
                return
            last = now


if __name__ == "__main__":
    main(float(sys.argv[1]))
