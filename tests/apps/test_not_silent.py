"""Nothing silent for long (issue 49): `kd eval`'s timing shows a bar, and a bar whose units are slow (a teacher's
batch of documents on a CPU) still shows its rate and ETA."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console
from student_stores import make_store, tiny_student

from kd.apps.eval.speed import measure_speed, speed_texts
from kd.common import progress


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny trained student (folder name: student)."""
    root = tmp_path_factory.mktemp("silent")
    return tiny_student(make_store(root / "store"), root / "student")


def test_a_bar_of_slow_units_shows_an_eta(monkeypatch):
    """Before, rich estimated speed from the last 30 s only: with a 40 s batch one update was ever in the window,
    so the bar showed no rate and no ETA for the whole run."""
    clock = [0.0]
    monkeypatch.setattr(progress, "Console", lambda **kw: Console(file=io.StringIO(), force_terminal=True, width=200,
                                                                  get_time=lambda: clock[0]))
    with progress.Bar("mpnet: brown-documents", 2_000, "texts") as bar:
        for _ in range(3):
            clock[0] += 40.0
            bar.advance(256)
        task = bar._rich.tasks[0]
        assert task.speed is not None and task.time_remaining is not None
        assert abs(task.time_remaining - (2_000 - 768) / (256 / 40)) < 1.0


def test_timing_reports_progress_outside_the_timed_calls():
    texts = [f"sentence {i}" for i in range(300)]
    ticks: list[int] = []
    res = measure_speed(lambda t: np.zeros((len(t), 4), np.float32), texts, 16, 300, progress=ticks.append)
    assert sum(ticks) == speed_texts(texts, 16, 300) == 1 + 256 + 16 + 300
    assert res.n_b1 == 16 and res.n_b256 == 300


def test_eval_times_a_model_under_a_bar(setup, capfd):
    """Before: 'timing student', then nothing until the table (~140 s for mpnet on 2 cores)."""
    from kd.apps.eval.config import EvalConfig, Measure
    from kd.apps.eval.run import evaluate

    evaluate(EvalConfig(students=[str(setup)], measures=[Measure.speed], speed_b1=8, speed_big=64, cache=False))
    err = " ".join(capfd.readouterr().err.split())
    total = speed_texts(list(range(1500)), 8, 64)
    assert f"student: timing: {total:,}/{total:,} texts (100.0%)" in err and "ETA" in err, err


def test_a_piped_bar_whose_job_reports_nothing_still_logs_every_interval(capsys):
    """In a log (no terminal) a bar printed only when the job reported progress: a 30 s teacher batch on one core
    left the log silent that long. A heartbeat thread now writes the line when the job has not."""
    import time

    with progress.Bar("mpnet: brown-documents", 100, "texts", every=0.4) as bar:
        bar.advance(1)
        time.sleep(1.5)  # the job is busy inside one unit: it reports nothing
    lines = [x for x in capsys.readouterr().err.splitlines() if "brown-documents" in x]
    assert len(lines) >= 3, lines  # >= 2 heartbeats in 1.5 s at 0.4 s, plus the closing line
    assert all("1/100 texts" in x for x in lines), lines


def test_a_bar_that_reports_often_gets_no_extra_heartbeat_lines(capsys):
    import time

    with progress.Bar("train", 1_000, "steps", every=4.0) as bar:
        for _ in range(20):
            bar.advance(1)
            time.sleep(0.01)
    assert len(capsys.readouterr().err.splitlines()) == 1  # the closing line only: 0.2 s < the first 2 s


def test_a_long_step_says_it_is_still_running(capsys):
    import time

    with progress.step("exporting mpnet for openvino", enabled=True, every=0.4):
        time.sleep(1.3)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "exporting mpnet for openvino ..." and err[-1].startswith("exporting mpnet for openvino: done in")
    assert sum("still running" in x for x in err) >= 2, err
