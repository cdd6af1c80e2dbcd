"""`kd finetune`: fine-tune a trained student on a labelled task, as SRA does (sec. 3.2), optionally SRA+KD.

- Model: the student's sentence vector u (for pairs [u, v, |u-v|, u*v], both sides through the same
  student) -> MLP head (Linear, ReLU, dropout, Linear) -> one output per class, or one score. The
  head starts random; every weight, student included, is trained (SRA: "all parameters are optimized").
- Loss: cross-entropy on classes, squared error on scores. With `kd_store` (SRA+KD, Tang et al. 2019)
  plus `kd_weight` x MSE between the head's outputs and the task teacher's logits stored in that store
  (or, with `kd_alpha`, Tang et al.'s mix alpha x task loss + (1 - alpha) x MSE, which SRA+KD uses)
  (e.g. a cross-encoder from `kd finetune-teacher` run by `kd precompute` over the training file).
  Rows are joined on the store's ids, which `common.ids` computes from the text alone, so the store
  must hold every training row (precomputed from the same file and columns); the teacher's class
  names fix the label order.
- Adam(W), constant learning rate after a short warm-up (SRA picks lr from {2,3,5,10}e-4 on dev),
  gradient clipping; dev metrics after every epoch and the best epoch is kept. What `kd finetune-teacher`
  does the same (targets, task loss, the loop) is `common.finetune`'s.
- Numbers: NaN/Inf labels (named by file and row) and teacher logits (by row id) are refused before
  training, a non-finite loss stops the run before its backward pass, and weights are checked before
  they are saved; a failed run leaves no output folder (`common.finite`, `common.tasks.fresh_output`).
- Output: a student folder (`student.load` still encodes with the fine-tuned encoder) plus
  task.json and task_head.safetensors; `load_task_model(dir).predict(texts | pairs)` gives labels or
  scores.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from kd.common import finetune as ft
from kd.common.errors import InputError, KdError
from kd.common.fast_tokenizer import FastTokenizer
from kd.common.finite import non_finite_rows, require_finite_weights
from kd.common.hardware import resolve_device
from kd.common.ids import text_id, text_key
from kd.common.outputs import FINETUNE
from kd.common.padding import pad_rows
from kd.common.tasks import LabelSet, Task, TaskRows, fresh_output, task_metrics
from kd.storage.schema import arrow_to_vectors
from kd.storage.store import Store
from kd.student.finetune_config import FinetuneConfig
from kd.student.models import Student
from kd.student.saved import CONFIG, TOKENIZER, LoadedStudent, build_to_fit, load, save_student

TASK_FILE, HEAD_FILE, METRICS_FILE = "task.json", "task_head.safetensors", "dev_metrics.json"
DIVERGED = "the run diverged: lower --lr (or --kd-weight); check --train and --kd-store for extreme values"


@dataclass
class FinetuneSummary(ft.RunSummary):
    kd_teacher: str | None
    best_epoch: int | None
    dev_metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# The model


def pair_input(u: Tensor, v: Tensor) -> Tensor:
    """SRA's concatenate-compare vector [u, v, |u - v|, u * v]."""
    return torch.cat([u, v, (u - v).abs(), u * v], -1)


class TaskHead(nn.Module):
    """SRA's MLP classifier: Linear -> ReLU -> dropout -> Linear."""

    def __init__(self, in_dim: int, hidden: int, n_out: int, dropout: float) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, n_out))

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        return self.mlp(x if y is None else pair_input(x, y))


class TaskModel(nn.Module):
    """Student + head. Pair batches stack the a rows then the b rows into one student forward."""

    def __init__(self, student: Student, head: TaskHead, pairs: bool) -> None:
        super().__init__()
        self.student, self.head, self.pairs = student, head, pairs

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        emb = self.student(input_ids, attention_mask).embedding
        if self.pairs:
            u, v = emb.chunk(2)
            return self.head(u, v)
        return self.head(emb)


class Tokenized:
    """Rows tokenized once as the student was trained (common/fast_tokenizer.py); `batch(idx)` pads [a rows; b rows]
    for pairs, on the right like every student batch. A row's length is its longer side's."""

    def __init__(self, tokenizer, texts: list, max_length: int) -> None:
        fast = FastTokenizer.from_transformers(tokenizer, "the student's tokenizer")
        self.pad_id = fast.settings.pad_id
        self.sides = [fast.encode(s, max_length=max_length)["input_ids"] for s in ft.split_pairs(texts)]
        self.lengths = np.array([max(len(s[i]) for s in self.sides) for i in range(len(self))])

    def __len__(self) -> int:
        return len(self.sides[0])

    def batch(self, idx: np.ndarray, device: torch.device) -> tuple[Tensor, Tensor]:
        ids, mask = pad_rows([side[i] for side in self.sides for i in idx], self.pad_id)
        return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


# --------------------------------------------------------------------------------------------------
# SRA+KD: the task teacher's logits from a store


def teacher_with_logits(store: Store, name: str | None) -> str:
    have = store.manifest.teachers(column="logits")
    if name is not None:
        if name not in have:
            raise KdError(f"teacher {name!r} has no logits in the store (teachers with logits: {have or 'none'})",
                          store.root, "pick one of those with --kd-teacher")
        return name
    if len(have) != 1:
        raise KdError(f"--kd-store needs exactly one teacher with logits, or --kd-teacher; found {have or 'none'}",
                      store.root, "precompute the store with a task teacher (kd finetune-teacher), or name "
                      "one with --kd-teacher" if not have else f"pass --kd-teacher with one of {have}")
    return have[0]


def kd_targets(store_path: str, teacher: str | None, rows: TaskRows, task: Task,
               ) -> tuple[np.ndarray, str, list[str] | None]:
    """The teacher's logits for every training row ([n, K] float32), the teacher, and its class names.

    - the store must hold this task's kind of rows (pairs or single texts);
    - a row's id is the id precompute gave it; in a deduplicated store later copies of a text are
      stored once, so an id that is missing is retried as the text's first occurrence;
    - NaN/Inf logits are refused, naming the first row id.
    """
    store = Store.open(store_path)
    if store.manifest.pairs != task.pairs:
        kind = "sentence pairs" if store.manifest.pairs else "single texts"
        raise KdError(f"the --kd-store holds {kind}, task {task.value} does not", store.root,
                      "precompute the store from the training file with the same --pair-columns / --text-column")
    name = teacher_with_logits(store, teacher)
    table = store.read_table(f"teachers/{name}", ["id", "logits"])
    logits = arrow_to_vectors(table.column("logits")).astype(np.float32)
    want = 1 if task.regression else None
    if want is not None and logits.shape[1] != want:
        raise KdError(f"teacher {name!r} has {logits.shape[1]} logits, pair-regression needs a 1-logit teacher",
                      store.root, "fine-tune the teacher with --task pair-regression")
    ids = table.column("id").to_numpy()
    rows_at = _store_rows(ids, rows, store.root)
    bad = non_finite_rows(logits[rows_at])
    if len(bad):
        row = rows_at[bad[0]]
        raise KdError(f"teacher {name!r} has NaN/Inf logits for {len(bad)} training row(s), the first: row id "
                      f"{int(ids[row])} of table 'teachers/{name}' (training row {rows.doc_ids[bad[0]]})",
                      store.root, "recompute that teacher's logits (kd precompute ... --overwrite), or drop the rows")
    names = store.table(f"teachers/{name}").meta.get("label_names")
    return logits[rows_at], name, names


def _store_rows(ids: np.ndarray, rows: TaskRows, where: str) -> np.ndarray:
    """The position in the store's `ids` of every training row; a missing one is an error."""
    pos = {int(i): k for k, i in enumerate(ids)}
    rows_at = np.array([pos.get(int(i), pos.get(text_id(text_key(t), 0), -1)) for i, t in zip(rows.ids, rows.texts)])
    missing = np.nonzero(rows_at < 0)[0]
    if len(missing):
        raise KdError(f"{len(missing)} of {len(rows)} training rows are not in the --kd-store "
                      f"(first: {rows.doc_ids[missing[0]]})", where,
                      "precompute the store from the same --train file(s) with the same column options")
    return rows_at


# --------------------------------------------------------------------------------------------------
# Training


def predict_outputs(model: TaskModel, data: Tokenized, device: torch.device, batch_size: int) -> np.ndarray:
    """Head outputs in row order (length-sorted batches for less padding)."""
    return ft.predict_in_order(model, data.lengths, batch_size, lambda idx: model(*data.batch(idx, device)))


def _mixed_loss(z: Tensor, y: Tensor, kd: Tensor | None, task: Task, cfg: FinetuneConfig) -> Tensor:
    """Task loss, plus the logit MSE to the teacher: weighted by kd_weight, or mixed by kd_alpha (Tang et al.)."""
    loss = ft.task_loss(z, y, task)
    if kd is None:
        return loss
    mse = nn.functional.mse_loss(z.float(), kd)
    if cfg.kd_alpha is not None:
        return cfg.kd_alpha * loss + (1.0 - cfg.kd_alpha) * mse
    return loss + cfg.kd_weight * mse if cfg.kd_weight > 0 else loss


def finetune(cfg: FinetuneConfig) -> FinetuneSummary:
    """Fine-tune `cfg.student` on `cfg.train` (+ SRA+KD from `cfg.kd_store`); see the module docstring.

    Labels, teacher logits and every step's loss must be finite, and so must the weights before they are
    saved; otherwise the run stops with an error and leaves no output folder.
    """
    t0 = time.perf_counter()
    train_rows, dev_rows = ft.read_task_splits(cfg)
    if Path(cfg.out).resolve() == Path(cfg.student).resolve():
        raise InputError("--out is the student being fine-tuned", cfg.out, "write the fine-tuned student elsewhere")
    kd, kd_name, labels = _teacher_and_labels(cfg, train_rows)
    y, y_dev = ft.encode_targets(labels, train_rows, dev_rows)
    device = resolve_device(cfg.device)
    src = load(cfg.student, device="cpu")
    with fresh_output(cfg.out, cfg.overwrite, FINETUNE, [cfg.student, cfg.kd_store, cfg.train, cfg.dev]) as out:
        model = _task_model(cfg, src, labels, y).to(device).train()
        train = Tokenized(src.tokenizer, train_rows.texts, src.config.max_length)
        dev = Tokenized(src.tokenizer, dev_rows.texts, src.config.max_length) if dev_rows is not None else None
        step, history, best = _fit(cfg, model, train, dev, (y, y_dev, kd), device)
        best_epoch, metrics = ft.keep_best(model, history, best)
        summary = FinetuneSummary(str(out), cfg.task.value, list(labels.names) if labels else None, len(train_rows),
                                  len(dev_rows) if dev_rows is not None else 0, step, time.perf_counter() - t0,
                                  kd_name, best_epoch, metrics, history)
        _save(out, cfg, src, model, labels, summary)
    return summary


def _teacher_and_labels(cfg: FinetuneConfig, rows: TaskRows,
                        ) -> tuple[np.ndarray | None, str | None, LabelSet | None]:
    """The KD teacher's logits and name (None, None without --kd-store) and the class names: the
    teacher's when it stores them (their order is its logits'), else the training labels'."""
    kd, kd_name, names = (None, None, None)
    if cfg.kd_store is not None:
        kd, kd_name, names = kd_targets(cfg.kd_store, cfg.kd_teacher, rows, cfg.task)
    labels = ft.task_labels(cfg.task, rows, names)
    if labels is not None and kd is not None and kd.shape[1] != len(labels):
        raise KdError(f"teacher {kd_name!r} has {kd.shape[1]} logits for {len(labels)} classes", cfg.kd_store,
                      "use a teacher fine-tuned on this task's labels")
    return kd, kd_name, labels


def _task_model(cfg: FinetuneConfig, src: LoadedStudent, labels: LabelSet | None, y: np.ndarray) -> TaskModel:
    """The student with a new head (seeded); a score head starts at the mean score, not at 0."""
    torch.manual_seed(cfg.seed)
    n_out = 1 if labels is None else len(labels)
    head = TaskHead((4 if cfg.task.pairs else 1) * src.dim, cfg.hidden, n_out, cfg.dropout)
    if labels is None:
        ft.start_at_mean(head, float(np.mean(y)))
    return TaskModel(src.model, head, cfg.task.pairs)


def _fit(cfg: FinetuneConfig, model: TaskModel, train: Tokenized, dev: Tokenized | None,
         targets: tuple[np.ndarray, np.ndarray | None, np.ndarray | None], device: torch.device,
         ) -> tuple[int, list[dict], tuple[float, int, dict] | None]:
    """`common.finetune.fit` with shuffled batches, AdamW, warm-up then a constant rate, clipping at
    `cfg.clip` and the loss `_mixed_loss`; the dev metrics after every epoch."""
    y, y_dev, kd = targets
    y_t = torch.as_tensor(y)
    kd_t = torch.as_tensor(kd) if kd is not None else None

    def loss(idx: np.ndarray) -> Tensor:
        z = model(*train.batch(idx, device))
        return _mixed_loss(z, y_t[idx].to(device), None if kd_t is None else kd_t[idx].to(device), cfg.task, cfg)

    def evaluate() -> dict[str, float]:
        return task_metrics(cfg.task, predict_outputs(model, dev, device, cfg.eval_batch_size), y_dev)

    total = ft.total_steps(len(train), cfg.batch_size, cfg.epochs, cfg.max_steps)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = ft.warmup_schedule(opt, cfg.warmup, total, decay=False)
    rng = np.random.default_rng(cfg.seed)
    plan = ft.FitPlan("finetune", total, lambda: _shuffled(len(train), cfg.batch_size, rng), loss,
                   evaluate if dev is not None else None, cfg.task.main_metric, ", ".join(cfg.train), DIVERGED,
                   clip=cfg.clip, progress=cfg.progress)
    return ft.fit(model, opt, sched, plan)


def _shuffled(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch's batches: the rows in a new random order, cut."""
    order = rng.permutation(n)
    return [order[s : s + batch_size] for s in range(0, n, batch_size)]


def _save(out: Path, cfg: FinetuneConfig, src: LoadedStudent, model: TaskModel, labels: LabelSet | None,
          summary: FinetuneSummary) -> None:
    """Task files first, then the student folder (whose config.json, written last, marks it complete);
    nothing is written unless every weight is finite."""
    model.cpu().eval()
    require_finite_weights(model.state_dict(), ", ".join(cfg.train), DIVERGED)
    save_file({k: v.contiguous() for k, v in model.head.state_dict().items()}, str(out / HEAD_FILE))
    first, last = model.head.mlp[0], model.head.mlp[-1]
    task_info = {"task": cfg.task.value, "label_names": list(labels.names) if labels else None,
                 "features": "[u, v, |u-v|, u*v]" if cfg.task.pairs else "u", "in_dim": first.in_features,
                 "hidden": cfg.hidden, "n_out": last.out_features, "dropout": cfg.dropout,
                 "kd_teacher": summary.kd_teacher}
    (out / TASK_FILE).write_text(json.dumps(task_info, indent=1))
    (out / METRICS_FILE).write_text(json.dumps(asdict(summary), indent=1))
    args = asdict(cfg) | {"task": cfg.task.value}
    info = {"task": cfg.task.value, "finetuned_from": str(Path(cfg.student).resolve()), "objectives": [],
            "target": src.info.get("target"), "tokenizer": src.info.get("tokenizer")}
    save_student(out, model.student, [], str(src.path / TOKENIZER), args, src.info.get("store_fingerprint", ""), info)


# --------------------------------------------------------------------------------------------------
# Prediction


class TaskPredictor:
    """A fine-tuned student: `predict(texts | pairs)` -> labels (classes) or float scores."""

    def __init__(self, encoder: LoadedStudent, head: TaskHead, task: Task, labels: LabelSet | None) -> None:
        self.encoder, self.head, self.task, self.labels = encoder, head.eval(), task, labels

    @torch.inference_mode()
    def outputs(self, inputs: Sequence, batch_size: int = 256) -> np.ndarray:
        """Raw head outputs [n, K] (class logits, or one score column)."""
        inputs = list(inputs)
        if self.task.pairs:
            if inputs and isinstance(inputs[0], str):
                raise InputError("this model scores sentence pairs; pass (a, b) tuples", "TaskPredictor.predict")
            # the head was trained on the encoder's own vectors, not unit ones
            u = self.encoder.encode([a for a, _ in inputs], batch_size, normalize_embeddings=False)
            v = self.encoder.encode([b for _, b in inputs], batch_size, normalize_embeddings=False)
            z = self.head(torch.from_numpy(u).to(self.encoder.device), torch.from_numpy(v).to(self.encoder.device))
        else:
            if inputs and not isinstance(inputs[0], str):
                raise InputError("this model classifies single texts; pass strings", "TaskPredictor.predict")
            raw = self.encoder.encode(inputs, batch_size, normalize_embeddings=False)
            z = self.head(torch.from_numpy(raw).to(self.encoder.device))
        return z.float().cpu().numpy()

    def predict(self, inputs: Sequence, batch_size: int = 256) -> np.ndarray:
        z = self.outputs(inputs, batch_size)
        if self.labels is None:
            return z[:, 0]
        return self.labels.decode(z.argmax(-1))

    def evaluate(self, inputs: Sequence, labels: Sequence) -> dict[str, float]:
        gold = np.asarray(labels, dtype=np.float64) if self.labels is None else self.labels.encode(labels)
        return task_metrics(self.task, self.outputs(inputs), gold)


def load_task_model(path: str | os.PathLike, device: str = "cpu") -> TaskPredictor:
    """Load a folder written by `kd finetune`."""
    p = Path(path)
    if not (p / TASK_FILE).exists() or not (p / CONFIG).exists():
        raise InputError("no fine-tuned task model here (task.json and config.json)", str(p),
                         "point at the --out folder of a finished kd finetune run")
    info = json.loads((p / TASK_FILE).read_text())
    encoder = load(p, device=device)
    try:  # the head's sizes in task.json are checked against its weights before it is allocated
        head = build_to_fit(lambda: TaskHead(info["in_dim"], info["hidden"], info["n_out"], info["dropout"]),
                            load_file(str(p / HEAD_FILE)))
    except (KeyError, TypeError, ValueError, RuntimeError, OSError) as e:
        raise InputError(f"the task head does not fit task.json ({str(e)[:300]})", str(p / TASK_FILE),
                         "copy the whole fine-tuned folder again, or re-run kd finetune") from e
    labels = LabelSet(tuple(info["label_names"])) if info["label_names"] else None
    return TaskPredictor(encoder, head.to(encoder.device), Task(info["task"]), labels)
