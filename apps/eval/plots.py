"""PNG figures of an evaluation report (matplotlib, Agg backend: no display needed).

- `sts_scatter.png`: per STS pair, the student's cosine against the teacher's, one panel per
  student (points on the diagonal = the student reproduces the teacher's similarity);
- `quality_speed.png`: bars of the first quality column (STS when measured) next to bars of
  sentences/s at batch 256 (log scale from 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kd.common.outputs import write_file


class EvalReport(Protocol):
    """What the figures read of `kd.apps.eval.run.EvalReport` (a protocol, so plots never import eval)."""

    models: list[Any]  # .name, .kind, .metrics
    columns: list[Any]  # .measure
    sts_sims: dict[str, np.ndarray]


SCATTER, BARS = "sts_scatter.png", "quality_speed.png"
PLOT_FILES = (SCATTER, BARS)  # every file --plot may write (claimed before the evaluation runs)


def write_plots(report: EvalReport, folder: Path) -> list[Path]:
    """Write the figures the report has data for; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    teacher = next((m for m in report.models if m.kind == "teacher"), None)
    if teacher is not None and teacher.name in report.sts_sims:
        written.append(_scatter(report, teacher.name, folder / SCATTER))
    if any("sent_per_s_b256" in m.metrics for m in report.models):
        written.append(_bars(report, folder / BARS))
    return written


def _scatter(report: EvalReport, teacher: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    others = [m for m in report.models if m.name != teacher and m.name in report.sts_sims]
    n = max(1, len(others))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4), squeeze=False)
    t = report.sts_sims[teacher]
    for ax, m in zip(axes[0], others or [None]):
        if m is None:
            ax.text(0.5, 0.5, "no student", ha="center")
            continue
        s = report.sts_sims[m.name]
        ax.scatter(t, s, s=6, alpha=0.5)
        lo, hi = float(min(t.min(), s.min())), float(max(t.max(), s.max()))
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
        rho = m.metrics.get("sts_spearman")
        ax.set_title(f"{m.name}" + (f" (STS ρ {rho:.1f})" if rho is not None else ""), fontsize=9)
        ax.set_xlabel(f"{teacher} cosine")
        ax.set_ylabel("student cosine")
    fig.tight_layout()
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=120), "kd eval", "--plot")
    plt.close(fig)
    return path


def _bars(report: EvalReport, path: Path) -> Path:
    import matplotlib.pyplot as plt

    rows = [m for m in report.models if "sent_per_s_b256" in m.metrics]
    names = [m.name for m in rows]
    quality = next((c for c in report.columns if c.measure.value != "speed"
                    and any(m.metrics.get(c.key) is not None for m in rows)), None)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    if quality is not None:
        bars = ax1.bar(names, [m.metrics.get(quality.key) or 0 for m in rows], color="tab:blue")
        ax1.bar_label(bars, fmt="%.1f", fontsize=8)
        ax1.set_title(quality.header)
    speeds = [m.metrics["sent_per_s_b256"] for m in rows]
    bars = ax2.bar(names, speeds, color="tab:orange")
    ax2.bar_label(bars, fmt="%.0f", fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylim(bottom=1, top=max(speeds) * 3)  # from 1 sentence/s, so bar heights compare honestly
    ax2.set_title("sentences/s at batch 256 (log)")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=120), "kd eval", "--plot")
    plt.close(fig)
    return path
