"""The training run's records in its output folder: metrics.jsonl and the loss curve loss.png.

- metrics.jsonl: one JSON object per line, appended as training goes (training records carry "loss",
  validation records "val_loss", both "step"), so a killed run keeps everything up to the kill;
- on resume the records after the checkpoint's step are dropped: the resumed run writes them again,
  and the file reads as if the run had never stopped;
- only rank 0 writes (`enabled`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS, CURVE = "metrics.jsonl", "loss.png"


class Metrics:
    """metrics.jsonl: append per record; on resume, records after the checkpoint are dropped."""

    def __init__(self, path: Path, enabled: bool, resume_step: int | None) -> None:
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        if resume_step is None:
            path.unlink(missing_ok=True)
        elif path.exists():
            keep = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= resume_step]
            path.write_text("".join(ln + "\n" for ln in keep))

    def log(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def plot_curve(metrics: Path, png: Path) -> None:
    """Training and validation loss against steps (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln] if metrics.exists() else []
    train = [(r["step"], r["loss"]) for r in recs if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    if train:
        ax.plot(*zip(*train), label="train")
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)

