"""The one progress bar of every long kd job (precompute, train, embed, eval): count, rate, ETA.

- On a terminal: a rich bar with `done/total unit`, `unit/s`, elapsed and ETA, plus any extra
  fields (e.g. the loss) the job passes to `update`.
- Elsewhere (a log file, CI, `nohup`): rich would print nothing until the end, so a plain line is
  written every `every` seconds instead. A job started in the background is never silent for long.
It lives in `storage` because both stages use it and must not import each other.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
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


class Bar:
    """Usage: `with Bar("precompute", total=n) as bar: bar.advance(rows, loss=0.3)`."""

    def __init__(self, label: str, total: float, unit: str = "rows", enabled: bool = True, completed: float = 0,
                 every: float = 30.0) -> None:
        self.label, self.total, self.unit, self.enabled, self.every = label, total, unit, enabled, every
        self.done, self.start_done, self.fields = completed, completed, {}
        self._console = Console(stderr=True)
        self._rich: Progress | None = None
        self._t0 = self._last = 0.0

    def __enter__(self) -> Bar:
        self._t0 = self._last = time.perf_counter()
        if self.enabled and self._console.is_terminal:
            self._rich = Progress(TextColumn(f"[bold]{self.label}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn(self.unit), _Rate(self.unit), TimeElapsedColumn(), TextColumn("ETA"),
                                  TimeRemainingColumn(), _Fields(), console=self._console)
            self._rich.__enter__()
            self._task = self._rich.add_task(self.label, total=self.total, completed=self.done)
        return self

    def advance(self, n: float = 1, **fields: Any) -> None:
        self.update(self.done + n, **fields)

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
        if self._rich is not None:
            self._rich.__exit__(*exc)
        elif self.enabled and self.done != self.start_done:
            self._log()
