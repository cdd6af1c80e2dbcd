"""Ends the processes of a local Ray runtime when the `kd precompute --engine ray` driver that started it ends.

Ray ends its head processes with the driver (the kernel's parent-death signal), but its agents (dashboard
and runtime-env agents, children of the raylet) first try to report the raylet's death to the dead GCS and
outlive a killed driver by a minute or more. This script, started by the driver just before `ray.init`
(`python ray_reaper.py DRIVER_PID`, in its own session, stdin a pipe whose write end only the driver holds):
- notes the driver's children that exist already (not Ray's) and says "ready";
- every POLL_S records the driver's newer descendants from /proc (pid and start time): the Ray runtime;
- when stdin reads end-of-file, the driver is gone (it ended, or was killed, even by SIGKILL: the kernel
  closes its end of the pipe) or has shut Ray down: it sends SIGTERM to every recorded process still alive
  (the same start time, so never a reused pid), then SIGKILL to what is left after GRACE_S, and exits.
Standard library only, run by path: it must start fast and not depend on the driver's imports. Linux (/proc).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

POLL_S = 0.5
GRACE_S = 2.0


def _stat(pid: int | str) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, or None when it is gone (or a zombie: it has
    ended, and only waits for a parent that may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ..., starttime (22nd)
    return None if fields[0] in (b"Z", b"X") else (int(fields[1]), int(fields[19]))


def descendants(root: int) -> set[tuple[int, int]]:
    """(pid, start time) of every live descendant of `root`."""
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(name)) is not None:
            children.setdefault(st[0], []).append((int(name), st[1]))
    out, todo = set(), [root]
    while todo:
        for proc in children.get(todo.pop(), []):
            if proc not in out:
                out.add(proc)
                todo.append(proc[0])
    return out


def alive(procs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Those of the (pid, start time) processes still running (not a later process with a reused pid)."""
    return {(pid, start) for pid, start in procs if (st := _stat(pid)) is not None and st[1] == start}


def end(procs: set[tuple[int, int]], grace_s: float = GRACE_S) -> None:
    """SIGTERM the processes, then SIGKILL those still alive after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, _ in alive(procs):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while alive(procs) and time.monotonic() < deadline:
            time.sleep(0.05)


def main(driver: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the driver's terminal is the driver's to handle
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    before = descendants(driver) | {(os.getpid(), (_stat(os.getpid()) or (0, 0))[1])}
    print("ready", flush=True)
    seen: set[tuple[int, int]] = set()
    while True:
        seen |= descendants(driver) - before
        ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if ready and not os.read(sys.stdin.fileno(), 1 << 12):
            break
    end(seen)


if __name__ == "__main__":
    main(int(sys.argv[1]))
