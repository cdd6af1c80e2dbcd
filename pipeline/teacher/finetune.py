"""`kd finetune-teacher`: fine-tune a Hugging Face encoder into a task teacher with a classification head.

What comes out is an ordinary checkpoint directory (`save_pretrained` model + tokenizer, `id2label`
holding the class names) that `kd precompute --teacher DIR` loads as a teacher with `logits`; for
pair tasks it is a cross-encoder: both sentences go through the model together, tokenizer(a, b).

Algorithm:
- rows come from `common.tasks.read_task` (the reader of `kd precompute`); class names from the
  training labels (`LabelSet`), one output for pair-regression; what `kd finetune` does the same
  (targets, loss, the loop) is `common.finetune`'s;
- AutoModelForSequenceClassification on the base (alias, directory or HF cache name), a new head;
- plain torch loop: length-grouped shuffled batches (little padding), AdamW without decay on biases
  and LayerNorms, linear warm-up then linear decay, gradient clipping at 1, bf16 autocast on CUDA;
  loss = cross-entropy on classes, squared error of the single logit on scores (whose bias starts at
  the mean training score);
- the dev set is scored after every epoch; the best epoch (Spearman, or accuracy) is the one saved,
  and its metrics go to DIR/dev_metrics.json;
- numbers: NaN/Inf labels are refused before the model is loaded (file and row named), a non-finite
  loss stops the run before its backward pass, the weights are checked before they are saved, and a
  failed run leaves no output folder (`common.finite`, `common.tasks.fresh_output`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from kd.common import finetune as ft
from kd.common.errors import KdError
from kd.common.finetune import task_loss  # by name: the tests replace this module's loss
from kd.common.finite import require_finite_weights
from kd.common.hardware import resolve_device
from kd.common.outputs import TEACHER
from kd.common.quiet import hush_libraries
from kd.common.tasks import LabelSet, fresh_output, task_metrics
from kd.pipeline.teacher.finetune_config import TeacherFinetuneConfig
from kd.pipeline.teacher.resolve import resolve_teacher

METRICS_FILE, ARGS_FILE = "dev_metrics.json", "finetune_args.json"
DIVERGED = "the run diverged: lower --lr; check --train for extreme scores"


@dataclass
class TeacherFinetuneSummary(ft.RunSummary):
    best_epoch: int | None
    dev_metrics: dict[str, float] = field(default_factory=dict)  # of the saved (best) epoch
    history: list[dict] = field(default_factory=list)  # dev metrics per epoch


# --------------------------------------------------------------------------------------------------
# Batching


def length_grouped_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                           group: int = 50) -> list[np.ndarray]:
    """Shuffle, sort by length within windows of `group` batches, cut, shuffle the batches.

    Rows of similar length share a batch (little padding) while each epoch still sees a new order.
    """
    order = rng.permutation(len(lengths))
    window = batch_size * group
    batches = []
    for s in range(0, len(order), window):
        w = order[s : s + window]
        w = w[np.argsort(lengths[w], kind="stable")]
        batches += [w[i : i + batch_size] for i in range(0, len(w), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


class Encoded:
    """Rows tokenized once (pairs jointly: the cross-encoder input), padded per batch."""

    def __init__(self, tokenizer, texts: list, max_length: int) -> None:
        self.tok = tokenizer
        self.enc = dict(tokenizer(*ft.split_pairs(texts), truncation=True, max_length=max_length, verbose=False))
        self.lengths = np.array([len(x) for x in self.enc["input_ids"]], dtype=np.int64)

    def batch(self, idx: np.ndarray, device: torch.device) -> dict[str, torch.Tensor]:
        feats = [{k: v[i] for k, v in self.enc.items()} for i in idx]
        return {k: v.to(device) for k, v in self.tok.pad(feats, return_tensors="pt").items()}


# --------------------------------------------------------------------------------------------------
# Model


def _load(cfg: TeacherFinetuneConfig, labels: LabelSet | None):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hush_libraries()  # "newly initialized classifier" is the point, not a warning
    ref = resolve_teacher(cfg.base)
    n = 1 if labels is None else len(labels)
    id2label = {0: "score"} if labels is None else dict(enumerate(labels.names))
    torch.manual_seed(cfg.seed)  # the new head's initial weights
    try:
        tok = AutoTokenizer.from_pretrained(ref.path)
        model = AutoModelForSequenceClassification.from_pretrained(
            ref.path, num_labels=n, id2label=id2label, label2id={v: k for k, v in id2label.items()},
            problem_type="regression" if labels is None else "single_label_classification",
            ignore_mismatched_sizes=True,  # a base that already has a head of another size gets a new one
        )
    except (OSError, ValueError) as e:
        raise KdError(f"cannot load the base model ({e})", ref.path,
                      "the directory must hold a Hugging Face encoder and its tokenizer files") from e
    limit = min(x for x in (cfg.max_length, tok.model_max_length, getattr(model.config, "max_position_embeddings",
                                                                           cfg.max_length)) if x)
    tok.model_max_length = limit  # precompute truncates where training did
    return ref, tok, model, limit


def _optimizer(model: nn.Module, cfg: TeacherFinetuneConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name or "norm" in name.lower() else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)


def predict_logits(model: nn.Module, data: Encoded, device: torch.device, batch_size: int, autocast) -> np.ndarray:
    """Logits in row order (length-sorted batches)."""

    def forward(idx: np.ndarray) -> torch.Tensor:
        with autocast():
            return model(**data.batch(idx, device)).logits

    return ft.predict_in_order(model, data.lengths, batch_size, forward)


# --------------------------------------------------------------------------------------------------
# The run


def finetune_teacher(cfg: TeacherFinetuneConfig) -> TeacherFinetuneSummary:
    """Fine-tune `cfg.base` on `cfg.train` and save a teacher checkpoint to `cfg.out` (see module docstring)."""
    t0 = time.perf_counter()
    task = cfg.task
    train_rows, dev_rows = ft.read_task_splits(cfg)
    labels = ft.task_labels(task, train_rows)
    y_train, y_dev = ft.encode_targets(labels, train_rows, dev_rows)
    inputs = [cfg.train, cfg.dev, cfg.base if os.path.isdir(cfg.base) else None]
    with fresh_output(cfg.out, cfg.overwrite, TEACHER, inputs) as out:
        tok, model, max_length = _start(cfg, out, labels, y_train)
        device = resolve_device(cfg.device)
        model.to(device).train()
        train = Encoded(tok, train_rows.texts, max_length)
        dev = Encoded(tok, dev_rows.texts, max_length) if dev_rows is not None else None
        step, history, best = _fit(cfg, model, train, dev, y_train, y_dev, device)
        best_epoch, metrics = ft.keep_best(model, history, best)
        require_finite_weights(model.state_dict(), ", ".join(cfg.train), DIVERGED)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        summary = TeacherFinetuneSummary(str(out), task.value, list(labels.names) if labels else None,
                                         len(train_rows), len(dev_rows) if dev_rows is not None else 0, step,
                                         time.perf_counter() - t0, best_epoch, metrics, history)
        (out / METRICS_FILE).write_text(json.dumps(asdict(summary), indent=1))
    return summary


def _start(cfg: TeacherFinetuneConfig, out: Path, labels: LabelSet | None, y_train: np.ndarray):
    """The base with its new head (a score head starting at the mean score), and finetune_args.json written."""
    ref, tok, model, max_length = _load(cfg, labels)
    if labels is None:
        ft.start_at_mean(model, float(np.mean(y_train)))
    args = asdict(cfg) | {"task": cfg.task.value, "base_path": ref.path, "max_length": max_length}
    (out / ARGS_FILE).write_text(json.dumps(args, indent=1))  # first: marks the folder as this command's
    return tok, model, max_length


def _fit(cfg: TeacherFinetuneConfig, model: nn.Module, train: Encoded, dev: Encoded | None, y_train: np.ndarray,
         y_dev: np.ndarray | None, device: torch.device) -> tuple[int, list[dict], tuple[float, int, dict] | None]:
    """`common.finetune.fit` with length-grouped shuffled batches, AdamW without decay on biases and norms,
    warm-up then linear decay, clipping at 1 and bf16 autocast on CUDA; the dev metrics after every epoch."""
    use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()

    def loss(idx: np.ndarray) -> torch.Tensor:
        with autocast():
            logits = model(**train.batch(idx, device)).logits
        return task_loss(logits, torch.as_tensor(y_train[idx], device=device), cfg.task)

    def evaluate() -> dict[str, float]:
        return task_metrics(cfg.task, predict_logits(model, dev, device, cfg.eval_batch_size, autocast), y_dev)

    total = ft.total_steps(len(train.lengths), cfg.batch_size, cfg.epochs, cfg.max_steps)
    opt = _optimizer(model, cfg)
    sched = ft.warmup_schedule(opt, cfg.warmup, total, decay=True)
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)  # dropout masks
    plan = ft.FitPlan("finetune-teacher", total, lambda: length_grouped_batches(train.lengths, cfg.batch_size, rng),
                   loss, evaluate if dev is not None else None, cfg.task.main_metric, ", ".join(cfg.train), DIVERGED,
                   clip=1.0, progress=cfg.progress)
    return ft.fit(model, opt, sched, plan)
