"""What both fine-tuning commands share: `kd finetune-teacher` (pipeline) and `kd finetune` (student).

pipeline and student never import each other, so the parts that are the same for both live here; each
command keeps its own model, batches, optimizer and output files.

- `task_options`, `read_task_splits`, `task_labels`, `encode_targets`: a config's task files -> rows,
  class names (from the training labels, or given: a KD teacher's) and targets (class indices or scores);
- `task_loss` (cross-entropy on classes, squared error on scores), `start_at_mean` (a score head's bias
  starts at the mean training score), `warmup_schedule`, `split_pairs`, `predict_in_order`;
- `fit`: the loop (epochs of shuffled batches, each loss checked before its backward pass, clipping, the
  dev metrics after every epoch and the best epoch's weights kept), `keep_best` restores those weights.

This module imports torch: only the fine-tuning modules import it, never `kd.common`'s __init__.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from kd.common.finite import check_loss
from kd.common.progress import Bar
from kd.common.tasks import LabelSet, Task, TaskRows, parse_task, read_splits
from kd.common.token_batches import run_batches

Best = tuple[float, int, dict]  # (main dev metric, epoch, CPU state dict)


@dataclass
class RunSummary:
    """The first fields of both commands' summaries (and so of their dev_metrics.json); each adds its own."""

    out: str
    task: str
    label_names: list[str] | None
    train_rows: int
    dev_rows: int
    steps: int
    seconds: float


class TaskOptions(Protocol):
    """The options both fine-tuning configs have for their task files."""

    task: Task
    train: list[str]
    dev: list[str] | None
    text_column: str | None
    pair_columns: str | None
    label_column: str | None
    delimiter: str | None


# --------------------------------------------------------------------------------------------------
# Task files -> rows, classes, targets


def task_options(cfg: TaskOptions) -> None:
    """Normalise a config in place: --task parsed, --train and --dev as lists (one path may be a str)."""
    cfg.task = parse_task(cfg.task)
    cfg.train = [cfg.train] if isinstance(cfg.train, str) else list(cfg.train)
    cfg.dev = [cfg.dev] if isinstance(cfg.dev, str) else (list(cfg.dev) if cfg.dev else None)


def read_task_splits(cfg: TaskOptions) -> tuple[TaskRows, TaskRows | None]:
    """The training rows and the dev rows (None without --dev), read with the config's columns."""
    return read_splits(cfg.train, cfg.dev, cfg.task, cfg.text_column, cfg.pair_columns, cfg.label_column,
                       cfg.delimiter)


def task_labels(task: Task, rows: TaskRows, names: list[str] | None = None) -> LabelSet | None:
    """The class names: None for scores; else `names` when given (a KD teacher's), else the training labels'."""
    if task.regression:
        return None
    return LabelSet(tuple(names)) if names else LabelSet.fit(rows.labels)


def encode_targets(labels: LabelSet | None, train: TaskRows, dev: TaskRows | None,
                   ) -> tuple[np.ndarray, np.ndarray | None]:
    """Training and dev targets: scores (no labels) or class indices; an unknown label names --train/--dev."""

    def encode(rows: TaskRows, where: str) -> np.ndarray:
        return rows.scores() if labels is None else labels.encode(rows.labels, where)

    return encode(train, "--train"), (encode(dev, "--dev") if dev is not None else None)


def split_pairs(texts: list) -> tuple[list, ...]:
    """(a sides, b sides) of (a, b) pairs; (texts,) of single texts."""
    if texts and not isinstance(texts[0], str):
        return [t[0] for t in texts], [t[1] for t in texts]
    return (texts,)


# --------------------------------------------------------------------------------------------------
# Model pieces


def task_loss(logits: Tensor, target: Tensor, task: Task) -> Tensor:
    """Cross-entropy on classes; squared error of the first output on scores (in float32)."""
    logits = logits.float()
    if task.regression:
        return nn.functional.mse_loss(logits[:, 0], target.float())
    return nn.functional.cross_entropy(logits, target.long())


def start_at_mean(model: nn.Module, mean: float) -> None:
    """Set the bias of the (last) one-output layer to the mean training score.

    A new head predicts ~0 while scores are around their mean (2.7 for STS-B); a small learning rate
    needs hundreds of steps just to move that bias, and the logits a student later distils would
    carry the offset.
    """
    outs = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == 1 and m.bias is not None]
    if outs:
        with torch.no_grad():
            outs[-1].bias.fill_(mean)


def total_steps(rows: int, batch_size: int, epochs: int, max_steps: int | None) -> int:
    """--max-steps, else every epoch's batches."""
    return max_steps or math.ceil(rows / batch_size) * epochs


def warmup_schedule(opt: torch.optim.Optimizer, warmup: float, total: int,
                    decay: bool) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `warmup` steps (< 1: that fraction of `total`), then a linear decay to 0 at
    `total` (`decay`: BERT fine-tuning) or the constant rate."""
    warm = int(warmup * total) if warmup < 1 else int(warmup)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / (warm + 1)
        return max(0.0, (total - step) / max(1, total - warm)) if decay else 1.0

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


@torch.inference_mode()
def predict_in_order(model: nn.Module, lengths: np.ndarray, batch_size: int,
                     forward: Callable[[np.ndarray], Tensor]) -> np.ndarray:
    """`forward(rows)` over every row, as float32 [n, K] in row order.

    Rows go in length-sorted batches (little padding); the model runs in eval mode and is put back in
    the mode it was in.
    """
    was_training = model.training
    model.eval()
    order = np.argsort(lengths, kind="stable")
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    out = run_batches(len(order), batches, lambda idx: forward(idx).float().cpu().numpy(), 1)
    model.train(was_training)
    return out


# --------------------------------------------------------------------------------------------------
# The loop


@dataclass
class FitPlan:
    """What `fit` needs of one fine-tuning run."""

    label: str  # the progress bar's
    total: int  # optimizer steps
    batches: Callable[[], list[np.ndarray]]  # one epoch's row batches, a new order each call
    loss: Callable[[np.ndarray], Tensor]  # a batch's loss
    evaluate: Callable[[], dict[str, float]] | None  # the dev metrics; None without dev rows
    main_metric: str  # the dev metric that picks the best epoch
    where: str  # the training files, named when the loss is not finite
    diverged: str  # the fix suggested then
    clip: float = 1.0  # gradient norm; 0: not clipped
    progress: bool = True


def fit(model: nn.Module, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler,
        plan: FitPlan) -> tuple[int, list[dict], Best | None]:
    """The training loop: (steps taken, per-epoch records, (best dev metric, epoch, CPU state) or None).

    - epochs of `plan.batches()` until `plan.total` steps are taken (the last epoch may stop early);
    - each step's loss is checked before its backward pass (a NaN/Inf one stops the run);
    - with dev rows, the dev metrics after every epoch; the best epoch's weights are kept (ties: the later).
    """
    history: list[dict] = []
    best: Best | None = None
    step, epoch = 0, 0
    with Bar(plan.label, total=plan.total, unit="steps", enabled=plan.progress) as bar:
        while step < plan.total:
            epoch += 1
            losses: list[float] = []
            for idx in plan.batches():
                if step >= plan.total:
                    break
                losses.append(_step(model, opt, sched, plan, idx, step + 1))
                step += 1
                bar.update(step, epoch=epoch, loss=float(np.mean(losses[-20:])))
            record: dict[str, Any] = {"epoch": epoch, "step": step,
                                      "train_loss": float(np.mean(losses)) if losses else None}
            best = _score_epoch(model, plan, record, best)
            history.append(record)
    return step, history, best


def _step(model: nn.Module, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler,
          plan: FitPlan, idx: np.ndarray, number: int) -> float:
    """One optimizer step on the rows `idx`; its loss, refused before the backward pass when not finite."""
    loss = plan.loss(idx)
    value = float(loss.detach())
    check_loss(value, number, plan.where, plan.diverged)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if plan.clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.clip)
    opt.step()
    sched.step()
    return value


def _score_epoch(model: nn.Module, plan: FitPlan, record: dict[str, Any], best: Best | None) -> Best | None:
    """Add the dev metrics to the epoch's record; this epoch's weights (on the CPU) when it is the best so far."""
    if plan.evaluate is None:
        return best
    record |= plan.evaluate()
    score = record[plan.main_metric]
    if best is None or score >= best[0]:  # ties: the later, longer-trained epoch
        return score, record["epoch"], {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    return best


def keep_best(model: nn.Module, history: list[dict], best: Best | None) -> tuple[int | None, dict[str, float]]:
    """Load the best epoch's weights back into `model`; that epoch and its dev metrics (None, {} without dev)."""
    if best is None:
        return None, {}
    model.load_state_dict(best[2])
    chosen = next((h for h in history if h["epoch"] == best[1]), {})
    return best[1], {k: v for k, v in chosen.items() if k not in ("epoch", "step", "train_loss")}
