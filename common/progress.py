"""The one progress bar of every long kd job (precompute, train, embed, eval): count, rate, ETA.

- On a terminal: a rich bar with `done/total unit`, `unit/s`, elapsed and ETA, plus any extra
  fields (e.g. the loss) the job passes to `update`.
- Elsewhere (a log file, CI, `nohup`): rich would print nothing until the end, so a plain line is
  written every `every` seconds (HEARTBEAT_S, 8) instead, by a heartbeat thread when the job itself reports
  nothing that long (a teacher's batch of documents on one core can take a minute): never silent for long.
- `step("unpacking mpnet")`: the same for a step with nothing to count (unpacking, exporting a graph, loading a
  teacher): a spinner on a terminal, a start and a done line elsewhere; `showing(False)` turns steps off for a
  job whose progress is off.
It lives in `storage` because both stages use it and must not import each other.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _Rate(ProgressColumn):
    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        return Text(f"{task.speed:,.0f} {self.unit}/s" if task.speed else f"- {self.unit}/s", "progress.data.speed")


class _Fields(ProgressColumn):
    def render(self, task) -> Text:
        return Text(" ".join(_fmt(k, v) for k, v in task.fields.items()))


def _fmt(key: str, value: Any) -> str:
    return f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


SPEED_WINDOW_S = 24 * 3600.0  # the rate and ETA of a bar on a terminal: over the whole run (see Bar.__enter__)
HEARTBEAT_S = 8.0  # a log line at least this often (issue 49: no gap over 10 s; the thread may wake a second late)
# A step (unpacking, converting, loading) runs inside calls that can hold the GIL for seconds, which delays the
# heartbeat thread: 3.7 s late in the recorded dry run on a loaded core. Steps are few, so their beat is shorter.
STEP_HEARTBEAT_S = 5.0


class _Heartbeat:
    """Calls `beat()` from a daemon thread whenever `every` seconds passed since `last()` (both the owner's):
    the job's own reports reset the clock, so a busy job's log gets no extra lines."""

    def __init__(self, every: float, last: Callable[[], float], beat: Callable[[], None]) -> None:
        self.every, self.last, self.beat = every, last, beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kd-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.every / 2)):
            if time.perf_counter() - self.last() >= self.every:
                self.beat()

    def __enter__(self) -> _Heartbeat:
        if self.every > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class Bar:
    """Usage: `with Bar("precompute", total=n) as bar: bar.advance(rows, loss=0.3)`."""

    def __init__(self, label: str, total: float, unit: str = "rows", enabled: bool = True, completed: float = 0,
                 every: float = HEARTBEAT_S) -> None:
        within = _WITHIN.get()
        self.label = f"{within} · {label}" if within else label
        self.total, self.unit, self.enabled, self.every = total, unit, enabled, every
        self.done, self.start_done, self.fields = completed, completed, {}
        self._console = Console(stderr=True)
        self._rich: Progress | None = None
        self._heart: _Heartbeat | None = None
        self._t0 = self._last = 0.0

    def __enter__(self) -> Bar:
        self._t0 = time.perf_counter()
        # a log's first line after half an interval: the silent set-up before a bar (a student built, its head
        # fitted) plus a whole first interval made gaps of 16 s in `kd demo`'s log
        self._last = self._t0 - self.every / 2
        if self.enabled and self._console.is_terminal:
            # rich estimates speed from the last 30 s of updates by default: a unit slower than that (a teacher's
            # batch of documents on CPU) leaves one update in the window, so no rate and no ETA, ever. The whole
            # run's average is what the log line uses too.
            self._rich = Progress(TextColumn(f"[bold]{escape(self.label)}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn(self.unit), _Rate(self.unit), TimeElapsedColumn(), TextColumn("ETA"),
                                  TimeRemainingColumn(), _Fields(), console=self._console,
                                  speed_estimate_period=SPEED_WINDOW_S)
            self._rich.__enter__()
            self._task = self._rich.add_task(self.label, total=self.total, completed=self.done)
        elif self.enabled:
            self._heart = _Heartbeat(self.every, lambda: self._last, self._log).__enter__()
        return self

    def advance(self, n: float = 1, **fields: Any) -> None:
        self.update(self.done + n, **fields)

    def skip(self, n: float) -> None:
        """`n` units turned out to need no work (rows copied from a --reuse store, or kept by a killed run): out of
        the total, so the rate and ETA count only the work left (counted as done, they made a 10k-row copy look
        like 10k rows to encode at the teacher's rate: an ETA of 9 hours for 20 minutes of work)."""
        self.total -= n
        if self._rich is not None:
            self._rich.update(self._task, total=self.total)

    def update(self, completed: float | None = None, **fields: Any) -> None:
        if completed is not None:
            self.done = completed
        self.fields.update(fields)
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done, **fields)
        elif self.enabled and time.perf_counter() - self._last >= self.every:
            self._log()

    def _log(self) -> None:
        now = time.perf_counter()
        self._last = now
        rate = (self.done - self.start_done) / max(now - self._t0, 1e-9)
        eta = _clock((self.total - self.done) / rate) if rate > 0 and self.total else "-"
        pct = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        extra = "".join(f", {_fmt(k, v)}" for k, v in self.fields.items())
        print(f"{self.label}: {self.done:,.0f}/{self.total:,.0f} {self.unit}{pct}, {rate:,.1f} {self.unit}/s, "
              f"elapsed {_clock(now - self._t0)}, ETA {eta}{extra}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._heart is not None:
            self._heart.__exit__(*exc)
        if self._rich is not None:
            self._rich.__exit__(*exc)
        elif self.enabled and self.done != self.start_done:
            self._log()


# A job made of jobs (kd distill) names the step each bar belongs to: "[4/9] train stage six-layer · train: ...".
_WITHIN: ContextVar[str] = ContextVar("kd_progress_within", default="")


def within(step_label: str) -> contextlib.AbstractContextManager[None]:
    """Bars made inside this block carry `step_label` before their own."""
    return _scoped(_WITHIN, step_label)


@contextlib.contextmanager
def _scoped(var: ContextVar, value: Any) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


# Steps run deep inside library calls (resolve, export, load) that have no progress flag of their own, so the
# job that owns one says once, with `showing`, whether they print. On by default, as the bars are.
_STEPS: ContextVar[bool] = ContextVar("kd_progress_steps", default=True)
SLOW_S = 2.0  # a spinner's step ending sooner leaves no line behind: a quick load is not news


def showing(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """Steps inside this block print only when `enabled` (a job's `progress` option)."""
    return _scoped(_STEPS, enabled)


@contextlib.contextmanager
def step(label: str, enabled: bool | None = None, every: float = STEP_HEARTBEAT_S) -> Iterator[None]:
    """One line for a step with nothing to count: `with step("unpacking mpnet"): ...`.

    On a terminal a spinner while it runs, then `label: 12.3 s` if it took over SLOW_S; in a log `label ...`
    at the start (a killed job shows where it was), `label: still running, 10 s` every `every` seconds, and
    `label: done in 12.3 s` at the end (none if it failed: the error says why). Nothing when `enabled` is False
    or, left None, inside `showing(False)`.
    """
    if not (_STEPS.get() if enabled is None else enabled):
        yield
        return
    console = Console(stderr=True)
    t0 = time.perf_counter()
    if console.is_terminal:
        with console.status(label):
            yield
        if time.perf_counter() - t0 >= SLOW_S:
            console.print(f"{label}: {time.perf_counter() - t0:.1f} s", highlight=False, markup=False)
        return
    print(f"{label} ...", file=sys.stderr, flush=True)
    last = [t0]

    def beat() -> None:
        last[0] = time.perf_counter()
        print(f"{label}: still running, {last[0] - t0:.0f} s", file=sys.stderr, flush=True)

    with _Heartbeat(every, lambda: last[0], beat):
        yield
    print(f"{label}: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
