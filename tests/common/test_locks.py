"""common.locks: a flock is released when its holder dies, and a helper process forked from the holder lets go of it."""

import os
import signal
import time

from kd.common.locks import let_go_of_inherited_locks, try_lock


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
