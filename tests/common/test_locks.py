"""common.locks: a flock is released when its holder dies, and a helper process forked from the holder lets go of it."""

import os
import signal
import stat
import time

import pytest
from conftest import ROOT

from kd.common.errors import InputError
from kd.common.locks import held_elsewhere, let_go_of_inherited_locks, try_lock


def _fork(then_inherited: bool) -> int:
    """A forked child that (unless `then_inherited`) lets go of its parent's locks, then lives on for 30 s."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        if not then_inherited:
            let_go_of_inherited_locks(0)
        time.sleep(30)
        os._exit(0)
    return pid


def test_a_forked_helper_keeps_the_lock_only_until_it_lets_go(tmp_path):
    path = tmp_path / "x.lock"
    for inherited in (True, False):
        held = try_lock(path)
        assert held is not None and try_lock(path) is None  # a second open file description is refused
        child = _fork(then_inherited=inherited)
        try:
            time.sleep(0.3)  # the child has run its first lines
            held.close()  # the parent ends (as a kill -9 would close it)
            again = try_lock(path)
            assert (again is None) == inherited, f"inherited={inherited}"
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        if again is not None:
            again.close()
    assert try_lock(path) is not None  # once the child is gone the lock is free in either case


def _holder(path, hold_s: float):
    """Another process holding the lock on `path` for `hold_s` seconds (returns once it holds it)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom kd.common.locks import try_lock\n"
                             f"f = try_lock({str(path)!r})\nprint('held', flush=True)\ntime.sleep({hold_s})"],
                            stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT.parent)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_look_at_a_lock_neither_takes_nor_creates_it(tmp_path):
    """kd distill --dry-run looks at a run's lock: it must not create the file, need write access, or keep a run
    that starts in that instant from taking it."""
    path = tmp_path / "x.lock"
    assert not held_elsewhere(path) and not path.exists()  # absent: nothing held, nothing made
    os.mkfifo(tmp_path / "fifo")
    assert not held_elsewhere(tmp_path / "fifo")  # no lock kd took (its open blocked forever: a probe)
    proc = _holder(path, 30)
    try:
        assert held_elsewhere(path)
    finally:
        proc.kill()
        proc.wait()
    assert not held_elsewhere(path)
    mine = try_lock(path)
    assert mine is not None  # the look held nothing
    mine.close()


def test_a_lock_taken_with_a_wait_gets_it_once_a_brief_holder_lets_go(tmp_path):
    path = tmp_path / "x.lock"
    proc = _holder(path, 0.4)
    try:
        assert try_lock(path) is None
        t0 = time.monotonic()
        got = try_lock(path, wait_s=10.0)
        assert got is not None and time.monotonic() - t0 < 5.0
        got.close()
    finally:
        proc.kill()
        proc.wait()


def test_a_lock_path_holding_no_regular_file_is_refused(tmp_path):
    """A FIFO or a folder where kd keeps a lock: opening the FIFO to append raised io.UnsupportedOperation."""
    os.mkfifo(tmp_path / "fifo.lock")
    (tmp_path / "dir.lock").mkdir()
    for name, kind in (("fifo.lock", "a FIFO"), ("dir.lock", "a folder")):
        with pytest.raises(InputError, match=f"lock file is {kind}"):
            try_lock(tmp_path / name)
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo.lock").st_mode) and (tmp_path / "dir.lock").is_dir()  # left so
