"""A killed precompute loses at most SPILL_SECONDS of work, not the whole shard in flight (issue 50).

The shard's finished batches are kept in the store (`.partial/`) while it is encoded; a rerun runs only the other
batches, and the committed shard is byte-identical to an uninterrupted run's. Here the spill interval is 0 (every
batch is kept as it finishes) and the "kill" is an exception or a Ctrl-C raised by the teacher's forward pass after
a number of batches, in process; one test kills a real `kd precompute` process with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)

from kd.pipeline.precompute import precompute
from kd.pipeline.teacher import partial as P
from kd.pipeline.teacher.model import Teacher

REAL_LAUNCH = Teacher.launch
OPTS = dict(shard_rows=400, batch_tokens=256, backend="torch", progress=False)


@pytest.fixture()
def corpus(tmp_path, sentences) -> Path:
    path = tmp_path / "news.txt"
    path.write_text("\n".join(sentences[:300]) + "\n", encoding="utf-8")
    return path


def _shard_bytes(store: Path) -> bytes:
    (shard,) = sorted((store / "teachers").rglob("*.parquet"))
    return shard.read_bytes()


def _counting(monkeypatch, fail_after: int | None = None, error: type[BaseException] = RuntimeError) -> list[int]:
    """Count the teacher's batches; raise `error` at batch `fail_after` (the "kill")."""
    calls = [0]

    def launch(self, enc, outputs):
        calls[0] += 1
        if fail_after is not None and calls[0] > fail_after:
            raise error("killed")
        return REAL_LAUNCH(self, enc, outputs)

    monkeypatch.setattr(Teacher, "launch", launch)
    return calls


@pytest.fixture()
def whole(tmp_path_factory, corpus, tiny_teacher) -> tuple[bytes, int]:
    """The uninterrupted run: its shard's bytes and its number of batches."""
    out = tmp_path_factory.mktemp("whole") / "store"
    with pytest.MonkeyPatch.context() as mp:
        calls = _counting(mp)
        precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **OPTS)
    assert not (out / P.FOLDER).exists()
    return _shard_bytes(out), calls[0]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_rerun_runs_only_the_batches_the_killed_run_did_not_finish(tmp_path, corpus, tiny_teacher, whole,
                                                                     monkeypatch, error):
    want, batches = whole
    assert batches >= 10  # the premise: one shard, many batches
    monkeypatch.setattr(P, "SPILL_SECONDS", 0.0)
    out = tmp_path / "store"
    _counting(monkeypatch, fail_after=7, error=error)
    with pytest.raises(error):
        precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **OPTS)
    assert not list((out / "teachers").rglob("*.parquet"))  # nothing committed: the shard was in flight
    # one part per batch at interval 0: the batches fetched before the kill (the one launched behind them is lost)
    kept = len(list((out / P.FOLDER).rglob("part-*.safetensors")))
    assert 6 <= kept <= 7
    calls = _counting(monkeypatch)
    precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **OPTS)
    assert calls[0] == batches - kept  # the finished batches were kept, not run again
    assert _shard_bytes(out) == want  # byte-identical to the uninterrupted run
    assert not (out / P.FOLDER).exists()  # the parts go with the commit


def test_a_shard_with_reuse_keeps_its_finished_batches_too(tmp_path, corpus, tiny_teacher, sentences, monkeypatch):
    """With --reuse a shard encodes only the rows the other store lacks, and those batches are kept as they finish
    as well (they were not: a kill lost the whole shard in flight, a quarter of an hour of mpnet per 20,000-row
    shard on one core). The kept batches are keyed by the ids of the rows to encode, so another --reuse store
    (other rows to encode) drops them instead of mixing them in."""
    old = tmp_path / "old"
    half = tmp_path / "half.txt"
    half.write_text("\n".join(sentences[:100]) + "\n", encoding="utf-8")
    precompute([str(half)], str(old), [f"t={tiny_teacher}"], **OPTS)
    reused = OPTS | {"reuse": str(old)}
    with pytest.MonkeyPatch.context() as mp:
        calls = _counting(mp)
        precompute([str(corpus)], str(tmp_path / "whole"), [f"t={tiny_teacher}"], **reused)
    want, batches = _shard_bytes(tmp_path / "whole"), calls[0]
    assert batches >= 8  # the premise: the rows to encode span many batches
    monkeypatch.setattr(P, "SPILL_SECONDS", 0.0)
    out = tmp_path / "store"
    _counting(monkeypatch, fail_after=5)
    with pytest.raises(RuntimeError):
        precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **reused)
    kept = len(list((out / P.FOLDER).rglob("part-*.safetensors")))
    assert 4 <= kept <= 5
    calls = _counting(monkeypatch)
    summary = precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **reused)
    assert calls[0] == batches - kept and summary.rows_reused == 100
    assert _shard_bytes(out) == want and not (out / P.FOLDER).exists()
    # killed again with --reuse, rerun without it: the kept batches are other rows', dropped, the shard computed whole
    out2 = tmp_path / "store2"
    _counting(monkeypatch, fail_after=5)
    with pytest.raises(RuntimeError):
        precompute([str(corpus)], str(out2), [f"t={tiny_teacher}"], **reused)
    calls = _counting(monkeypatch)
    precompute([str(corpus)], str(out2), [f"t={tiny_teacher}"], **OPTS)
    plain = tmp_path / "plain"
    precompute([str(corpus)], str(plain), [f"t={tiny_teacher}"], **OPTS)
    assert calls[0] * 2 > batches and _shard_bytes(out2) == _shard_bytes(plain)


def test_a_resumed_shard_s_kept_rows_leave_the_progress_total(tmp_path, corpus, tiny_teacher, monkeypatch):
    """Rows the killed run kept are no work of the rerun: out of the bar's total, as --reuse's copied rows, so the
    rate and ETA count only the rows encoded (counted as done, a resumed 100k-row mpnet pass showed 918 rows/s and
    an ETA of 1 minute for an hour of work)."""
    from kd.common.progress import Bar

    monkeypatch.setattr(P, "SPILL_SECONDS", 0.0)
    out = tmp_path / "store"
    _counting(monkeypatch, fail_after=7)
    with pytest.raises(RuntimeError):
        precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **OPTS)
    _counting(monkeypatch)
    skipped, encoded = [], []
    real_skip, real_advance = Bar.skip, Bar.advance
    monkeypatch.setattr(Bar, "skip", lambda self, n: (skipped.append(n), real_skip(self, n))[1])
    monkeypatch.setattr(Bar, "advance", lambda self, n=1, **f: (encoded.append(n), real_advance(self, n, **f))[1])
    summary = precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **OPTS)
    assert sum(skipped) > 0 and sum(skipped) + sum(encoded) == summary.rows_total, (skipped, encoded)


def test_kept_batches_of_other_settings_are_dropped_not_used(tmp_path, corpus, tiny_teacher, whole, monkeypatch):
    """Batches kept under another batch plan (another --batch-tokens) are not this run's batches: removed, and the
    shard is computed whole, equal to an uninterrupted run with the new plan."""
    monkeypatch.setattr(P, "SPILL_SECONDS", 0.0)
    out = tmp_path / "store"
    _counting(monkeypatch, fail_after=5)
    with pytest.raises(RuntimeError):
        precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **OPTS)
    other = OPTS | {"batch_tokens": 512}
    calls = _counting(monkeypatch)
    precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **other)
    fresh = tmp_path / "fresh"
    more = _counting(monkeypatch)
    precompute([str(corpus)], str(fresh), [f"t={tiny_teacher}"], **other)
    assert calls[0] == more[0] and _shard_bytes(out) == _shard_bytes(fresh)


def test_a_damaged_part_is_dropped(tmp_path, corpus, tiny_teacher, whole, monkeypatch):
    want, batches = whole
    monkeypatch.setattr(P, "SPILL_SECONDS", 0.0)
    out = tmp_path / "store"
    _counting(monkeypatch, fail_after=6)
    with pytest.raises(RuntimeError):
        precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **OPTS)
    part = sorted((out / P.FOLDER).rglob("part-*.safetensors"))[2]
    part.write_bytes(part.read_bytes()[:100])  # a part cut short (a disk that filled)
    calls = _counting(monkeypatch)
    precompute([str(corpus)], str(out), [f"t={tiny_teacher}"], **OPTS)
    assert calls[0] == batches and _shard_bytes(out) == want


def test_sigkill_mid_shard_keeps_the_finished_batches(tmp_path, corpus, tiny_teacher, whole):
    """A real process killed with SIGKILL: the parts it wrote are read back by the rerun (spill interval 0 through
    a sitecustomize on the subprocess's path, each batch slowed so the kill lands mid-shard)."""
    want, batches = whole
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import time\nfrom kd.pipeline.teacher import partial\nfrom kd.pipeline.teacher.model import Teacher\n"
        "partial.SPILL_SECONDS = 0.0\n_real = Teacher.launch\n"
        "def _slow(self, enc, outputs):\n    time.sleep(0.3)\n    return _real(self, enc, outputs)\n"
        "Teacher.launch = _slow\n", encoding="utf-8")
    out = tmp_path / "store"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "kd", "precompute", str(corpus), "-o", str(out), "-t", f"t={tiny_teacher}",
           "--shard-rows", "400", "--batch-tokens", "256", "--backend", "torch", "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list((out / P.FOLDER).rglob("part-*.safetensors"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = len(list((out / P.FOLDER).rglob("part-*.safetensors")))
    assert 4 <= kept < batches
    res = subprocess.run(cmd[:-1] + ["--no-progress"], env=os.environ, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert _shard_bytes(out) == want and not (out / P.FOLDER).exists()
