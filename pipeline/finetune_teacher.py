"""`kd finetune-teacher`: fine-tune a Hugging Face encoder into a task teacher with a classification head.

What comes out is an ordinary checkpoint directory (`save_pretrained` model + tokenizer, `id2label`
holding the class names) that `kd precompute --teacher DIR` loads as a teacher with `logits`; for
pair tasks it is a cross-encoder: both sentences go through the model together, tokenizer(a, b).

Algorithm:
- rows come from `common.tasks.read_task` (the reader of `kd precompute`); class names from the
  training labels (`LabelSet`), one output for pair-regression;
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
import math
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from kd.common import bounds as B
from kd.common.errors import KdError
from kd.common.finite import check_loss, require_finite_weights
from kd.common.hardware import check_device
from kd.common.outputs import TEACHER
from kd.common.progress import Bar
from kd.common.tasks import LabelSet, Task, TaskRows, fresh_output, parse_task, read_splits, task_metrics
from kd.pipeline.resolve import resolve_teacher
from kd.pipeline.teacher import pick_device

METRICS_FILE, ARGS_FILE = "dev_metrics.json", "finetune_args.json"
DIVERGED = "the run diverged: lower --lr; check --train for extreme scores"


@dataclass
class TeacherFinetuneConfig:
    """Every option of `kd finetune-teacher`; saved as finetune_args.json."""

    base: str  # minilm | mpnet | bert-base | DIR | HF cache name
    task: Task
    train: list[str]
    out: str
    dev: list[str] | None = None
    epochs: int = 3
    lr: float = 2e-5
    batch_size: int = 16
    max_steps: int | None = None  # stop after this many steps (overrides epochs)
    warmup: float = 0.1  # < 1: fraction of the steps; >= 1: steps
    weight_decay: float = 0.01
    max_length: int = 128
    text_column: str | None = None
    pair_columns: str | None = None
    label_column: str | None = None
    delimiter: str | None = None
    seed: int = 0
    device: str | None = None
    eval_batch_size: int = 64
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        self.task = parse_task(self.task)
        self.train = [self.train] if isinstance(self.train, str) else list(self.train)
        self.dev = [self.dev] if isinstance(self.dev, str) else (list(self.dev) if self.dev else None)
        B.check("finetune-teacher options", ("--epochs", self.epochs, B.EPOCHS),
                ("--max-steps", self.max_steps, B.STEPS), ("--batch-size", self.batch_size, B.BATCH),
                ("--lr", self.lr, B.LR), ("--warmup", self.warmup, B.WARMUP),
                ("--max-length", self.max_length, B.TEACHER_TOKENS), ("--seed", self.seed, B.SEED),
                ("weight_decay", self.weight_decay, B.WEIGHT_DECAY), ("eval_batch_size", self.eval_batch_size, B.BATCH))
        check_device(self.device)


@dataclass
class TeacherFinetuneSummary:
    out: str
    task: str
    label_names: list[str] | None
    train_rows: int
    dev_rows: int
    steps: int
    seconds: float
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
        args = ([t[0] for t in texts], [t[1] for t in texts]) if texts and not isinstance(texts[0], str) else (texts,)
        self.enc = dict(tokenizer(*args, truncation=True, max_length=max_length, verbose=False))
        self.lengths = np.array([len(x) for x in self.enc["input_ids"]], dtype=np.int64)

    def batch(self, idx: np.ndarray, device: torch.device) -> dict[str, torch.Tensor]:
        feats = [{k: v[i] for k, v in self.enc.items()} for i in idx]
        return {k: v.to(device) for k, v in self.tok.pad(feats, return_tensors="pt").items()}


# --------------------------------------------------------------------------------------------------
# Model


def _load(cfg: TeacherFinetuneConfig, labels: LabelSet | None):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "newly initialized classifier" is the point, not a warning
    hf_logging.disable_progress_bar()
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


def _schedule(opt: torch.optim.Optimizer, warmup: float, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    warm = int(warmup * total) if warmup < 1 else int(warmup)

    def factor(step: int) -> float:  # linear warm-up, then linear decay to 0 (BERT fine-tuning)
        if step < warm:
            return (step + 1) / (warm + 1)
        return max(0.0, (total - step) / max(1, total - warm))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def start_at_mean(model: nn.Module, mean: float) -> None:
    """Set the bias of the one-output layer to the mean training score.

    A new head predicts ~0 while scores are around their mean (2.7 for STS-B); a small learning rate
    needs hundreds of steps just to move that bias, and the logits a student later distils would
    carry the offset.
    """
    outs = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == 1 and m.bias is not None]
    if outs:
        with torch.no_grad():
            outs[-1].bias.fill_(mean)


def task_loss(logits: torch.Tensor, target: torch.Tensor, task: Task) -> torch.Tensor:
    logits = logits.float()
    if task.regression:
        return nn.functional.mse_loss(logits[:, 0], target.float())
    return nn.functional.cross_entropy(logits, target.long())


@torch.inference_mode()
def predict_logits(model: nn.Module, data: Encoded, device: torch.device, batch_size: int, autocast) -> np.ndarray:
    """Logits in row order (length-sorted batches)."""
    was_training = model.training
    model.eval()
    order = np.argsort(data.lengths, kind="stable")
    out = None
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        with autocast():
            z = model(**data.batch(idx, device)).logits.float().cpu().numpy()
        if out is None:
            out = np.zeros((len(order), z.shape[1]), dtype=np.float32)
        out[idx] = z
    model.train(was_training)
    return out


# --------------------------------------------------------------------------------------------------
# The run


def _targets(rows: TaskRows, task: Task, labels: LabelSet | None, where: str) -> np.ndarray:
    return rows.scores() if labels is None else labels.encode(rows.labels, where)


def finetune_teacher(cfg: TeacherFinetuneConfig) -> TeacherFinetuneSummary:
    """Fine-tune `cfg.base` on `cfg.train` and save a teacher checkpoint to `cfg.out` (see module docstring)."""
    t0 = time.perf_counter()
    task = cfg.task
    train_rows, dev_rows = read_splits(cfg.train, cfg.dev, task, cfg.text_column, cfg.pair_columns,
                                       cfg.label_column, cfg.delimiter)
    labels = None if task.regression else LabelSet.fit(train_rows.labels)
    y_train = _targets(train_rows, task, labels, "--train")
    y_dev = _targets(dev_rows, task, labels, "--dev") if dev_rows is not None else None
    inputs = [cfg.train, cfg.dev, cfg.base if os.path.isdir(cfg.base) else None]
    with fresh_output(cfg.out, cfg.overwrite, TEACHER, inputs) as out:
        ref, tok, model, max_length = _load(cfg, labels)
        if task.regression:
            start_at_mean(model, float(np.mean(y_train)))
        args = asdict(cfg) | {"task": task.value, "base_path": ref.path, "max_length": max_length}
        (out / ARGS_FILE).write_text(json.dumps(args, indent=1))  # first: marks the folder as this command's
        device = pick_device(cfg.device)
        model.to(device).train()
        train = Encoded(tok, train_rows.texts, max_length)
        dev = Encoded(tok, dev_rows.texts, max_length) if dev_rows is not None else None
        step, history, best = _fit(cfg, model, train, dev, y_train, y_dev, device)
        if best is not None:
            model.load_state_dict(best[2])
        require_finite_weights(model.state_dict(), ", ".join(cfg.train), DIVERGED)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        best_epoch = best[1] if best is not None else None
        chosen = next((h for h in history if h["epoch"] == best_epoch), {}) if best_epoch else {}
        metrics = {k: v for k, v in chosen.items() if k not in ("epoch", "step", "train_loss")}
        summary = TeacherFinetuneSummary(str(out), task.value, list(labels.names) if labels else None,
                                         len(train_rows), len(dev_rows) if dev_rows is not None else 0, step, 0.0,
                                         best_epoch, metrics, history)
        summary.seconds = time.perf_counter() - t0
        (out / METRICS_FILE).write_text(json.dumps(asdict(summary), indent=1))
    return summary


def _fit(cfg: TeacherFinetuneConfig, model: nn.Module, train: Encoded, dev: Encoded | None, y_train: np.ndarray,
         y_dev: np.ndarray | None, device: torch.device) -> tuple[int, list[dict], tuple[float, int, dict] | None]:
    """The training loop: (steps taken, per-epoch dev records, (best dev metric, epoch, CPU state) or None).

    - length-grouped shuffled batches, AdamW, warm-up then linear decay, clipping at 1, bf16 autocast on CUDA;
    - each step's loss is checked before its backward pass (a NaN/Inf one stops the run);
    - with dev rows, the dev metrics after every epoch; the best epoch's weights are kept (ties: the later).
    """
    task = cfg.task
    use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()

    per_epoch = math.ceil(len(train.lengths) / cfg.batch_size)
    total = cfg.max_steps or per_epoch * cfg.epochs
    epochs = math.ceil(total / per_epoch)
    opt = _optimizer(model, cfg)
    sched = _schedule(opt, cfg.warmup, total)
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)  # dropout masks
    history: list[dict] = []
    best: tuple[float, int, dict] | None = None  # (main metric, epoch, CPU state dict)
    step = 0
    with Bar("finetune-teacher", total=total, unit="steps", enabled=cfg.progress) as bar:
        for epoch in range(1, epochs + 1):
            losses = []
            for idx in length_grouped_batches(train.lengths, cfg.batch_size, rng):
                if step >= total:
                    break
                with autocast():
                    logits = model(**train.batch(idx, device)).logits
                loss = task_loss(logits, torch.as_tensor(y_train[idx], device=device), task)
                losses.append(float(loss.detach()))
                check_loss(losses[-1], step + 1, ", ".join(cfg.train), DIVERGED)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                step += 1
                bar.advance(1, epoch=epoch, loss=float(np.mean(losses[-20:])))
            record = {"epoch": epoch, "step": step, "train_loss": float(np.mean(losses)) if losses else None}
            if dev is not None:
                record |= task_metrics(task, predict_logits(model, dev, device, cfg.eval_batch_size, autocast), y_dev)
                score = record[task.main_metric]
                if best is None or score >= best[0]:  # ties: the later, longer-trained epoch
                    best = (score, epoch, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
            history.append(record)
    return step, history, best
