"""A rich progress bar that counts rows and shows rows/s and ETA (or nothing, when disabled)."""

from __future__ import annotations

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


class RateColumn(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed:,.0f} rows/s" if task.speed else "- rows/s", style="progress.data.speed")


class RowProgress:
    def __init__(self, total: int, enabled: bool = True, label: str = "rows") -> None:
        self.enabled, self.total, self.label = enabled, total, label
        self._p: Progress | None = None

    def __enter__(self) -> RowProgress:
        if self.enabled:
            self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("rows"), RateColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                               TimeRemainingColumn(), console=Console(stderr=True))
            self._p.__enter__()
            self._task = self._p.add_task(self.label, total=self.total)
        return self

    def advance(self, n: float) -> None:
        if self._p is not None:
            self._p.advance(self._task, n)

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)
