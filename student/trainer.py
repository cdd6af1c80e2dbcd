"""`kd train-student`: train a student from a store's teacher outputs; the teacher is never loaded.

The loop, per step: batch (student.data) -> student forward (autocast on CUDA) -> weighted sum of the
objectives -> backward -> clip -> AdamW -> schedule. Around it:
- schedule: linear warm-up then cosine decay, ReduceLROnPlateau on validation loss, or constant;
- validation on the held-out id-hash slice every `eval_every` steps (default: each epoch end);
  early stopping after `patience` evaluations without improvement, best weights kept and exported;
- checkpoints every `checkpoint_every` steps and at epoch ends hold model, optimizer, scheduler,
  scaler, early-stopping state, every rank's RNG states and the data position (epoch, batches
  consumed). Resuming replays nothing: it continues with exactly the batch and the random numbers
  the uninterrupted run would have used, so the weights come out identical;
- DDP under torchrun (gloo on CPU, nccl on CUDA): ranks read disjoint shards, equal step counts;
- metrics.jsonl (one record per log/eval), loss.png, a rich progress bar (rows, rows/s, ETA).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from storage.errors import InputError, KdError
from storage.progress import Bar
from storage.store import Store
from student import data as D
from student.export import save_student, weights_state
from student.models import Student, StudentConfig, StudentOutput, build_student, pca_embeddings
from student.objectives import build_objectives, required_columns
from student.objectives.base import Context

CHECKPOINT, BEST, METRICS, CURVE = "checkpoint.pt", "best.safetensors", "metrics.jsonl", "loss.png"


class Schedule(str, Enum):
    cosine = "cosine"  # linear warm-up, then cosine decay to 0 at the last step
    plateau = "plateau"  # ReduceLROnPlateau on validation loss (warm-up still applies)
    constant = "constant"  # warm-up, then flat


class EmbeddingInit(str, Enum):
    auto = "auto"  # the teacher's input embeddings (PCA) when the store has them, else random
    teacher = "teacher"  # required: fail if the store has none
    random = "random"


@dataclass
class TrainConfig:
    """Every option of `kd train-student`; saved as training_args.json."""

    store: str
    out: str
    arch: str = "bilstm"
    objectives: list[str] = field(default_factory=lambda: ["cosine"])
    target: str | None = None  # "<teacher>.<column>"; default: the teacher's default_target
    embed_dim: int | None = None  # default: min(300, the teacher's input-embedding width)
    hidden_dim: int | None = None  # None: StudentConfig's default
    num_layers: int = 1
    pooling: str = "mean"
    dropout: float = 0.1
    max_length: int = 128
    student: dict[str, Any] = field(default_factory=dict)  # other StudentConfig fields
    epochs: int = 3
    max_steps: int | None = None  # overrides epochs
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.05  # < 1: fraction of the steps; >= 1: steps
    schedule: Schedule = Schedule.cosine
    clip: float = 1.0  # max gradient norm; 0 disables
    patience: int = 3  # evaluations without improvement before stopping; 0: never stop early
    eval_every: int | None = None  # steps; None: at each epoch end
    checkpoint_every: int = 500
    log_every: int = 20
    seed: int = 0
    num_workers: int = 0
    shuffle_buffer: int = 10_000
    val_percent: float = 2.0
    max_val_rows: int = 2_000
    device: str = "auto"
    amp: bool = True  # autocast on CUDA only (bf16 where supported, else fp16 + GradScaler)
    init_embeddings: EmbeddingInit = EmbeddingInit.auto
    resume: bool = True
    overwrite: bool = False
    progress: bool = True

    # options that may differ between a run and its resumption (the rest must match)
    RESUMABLE = ("epochs", "max_steps", "patience", "eval_every", "checkpoint_every", "log_every", "device",
                 "progress", "resume", "overwrite")

    def __post_init__(self) -> None:
        self.schedule = Schedule(self.schedule)
        self.init_embeddings = EmbeddingInit(self.init_embeddings)
        if self.batch_size < 1 or self.epochs < 1 or (self.max_steps is not None and self.max_steps < 1):
            raise InputError("batch size, epochs and max steps must be >= 1", "train-student options")
        if not self.objectives:
            raise InputError("no objective given", "--objective", "e.g. --objective cosine")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["schedule"], d["init_embeddings"] = self.schedule.value, self.init_embeddings.value
        return d


# --------------------------------------------------------------------------------------------------
# Model: the student plus its objectives, one module so DDP syncs the objectives' heads too


class Distiller(nn.Module):
    def __init__(self, student: Student, objectives: list[nn.Module], pairs: bool) -> None:
        super().__init__()
        self.student, self.objectives, self.pairs = student, nn.ModuleList(objectives), pairs

    def encode(self, batch: dict[str, Tensor]) -> StudentOutput | tuple[StudentOutput, StudentOutput]:
        if self.pairs:
            a = self.student(batch["a.input_ids"], batch["a.attention_mask"])
            b = self.student(batch["b.input_ids"], batch["b.attention_mask"])
            return a, b
        return self.student(batch["input_ids"], batch["attention_mask"])

    def forward(self, batch: dict[str, Tensor], progress: float) -> tuple[Tensor, Tensor]:
        """Total loss and the per-objective (weighted) losses."""
        out = self.encode(batch)
        parts = torch.stack([obj(out, batch, progress).float() for obj in self.objectives])
        return parts.sum(), parts


# --------------------------------------------------------------------------------------------------
# Set-up from the store


@dataclass
class Setup:
    store: Store
    student_cfg: StudentConfig
    objectives: list[nn.Module]
    target: list[str]  # batch keys of the embedding target
    tokenizer: str  # teacher whose tokenizer is used
    data: D.DataConfig


def _embeddings_matrix(store: Store, teacher: str) -> np.ndarray | None:
    rel = store.table(f"teachers/{teacher}").meta.get("input_embeddings")
    if not rel or not store.loc.is_local or not os.path.exists(store.local_dir(rel)):
        return None
    from safetensors.numpy import load_file

    return load_file(store.local_dir(rel))["weight"]


def _tokenizer_size(path: str) -> tuple[int, int]:
    from transformers import AutoTokenizer  # tokenizer only

    tok = AutoTokenizer.from_pretrained(path)
    return len(tok), tok.pad_token_id if tok.pad_token_id is not None else 0


def setup(cfg: TrainConfig) -> Setup:
    """Resolve target, tokenizer, student shape and objectives from the store; errors before any step."""
    store = Store.open(cfg.store)
    store.require_complete("texts")
    probe = StudentConfig()
    keys = Context.from_manifest(store.manifest, probe, cfg.target).embedding_target()
    teacher = keys[0].split(".", 1)[0]
    tok_dir = store.tokenizer_dir(teacher)
    if not os.path.isdir(tok_dir):
        raise KdError(f"the store has no tokenizer for teacher {teacher!r}", tok_dir,
                      "re-run kd precompute for this teacher (it saves the tokenizer files)")
    vocab, pad = _tokenizer_size(tok_dir)
    emb = _embeddings_matrix(store, teacher) if cfg.init_embeddings is not EmbeddingInit.random else None
    if emb is None and cfg.init_embeddings is EmbeddingInit.teacher:
        raise KdError(f"the store has no input embeddings for teacher {teacher!r}", store.root,
                      "use --init-embeddings random, or re-run kd precompute with this kd version")
    extra = dict(cfg.student)
    if cfg.hidden_dim is not None:
        extra["hidden_dim"] = cfg.hidden_dim
    embed_dim = cfg.embed_dim or min(probe.embed_dim, emb.shape[1] if emb is not None else probe.embed_dim)
    student_cfg = StudentConfig(
        arch=cfg.arch, vocab_size=max(vocab, emb.shape[0] if emb is not None else 0), pad_id=pad,
        embed_dim=embed_dim, num_layers=cfg.num_layers, pooling=cfg.pooling,
        out_dim=Context.from_manifest(store.manifest, probe, cfg.target).shape(keys[0])[0],
        dropout=cfg.dropout, max_length=cfg.max_length, **extra,
    )
    objectives = build_objectives(cfg.objectives, student_cfg, store.manifest, cfg.target)
    columns = required_columns(objectives)
    data = D.DataConfig(
        cfg.store, columns, teacher, batch_size=cfg.batch_size, max_length=cfg.max_length,
        shuffle_buffer=cfg.shuffle_buffer, val_percent=cfg.val_percent, max_val_rows=cfg.max_val_rows,
        seed=cfg.seed, num_workers=cfg.num_workers,
    )
    return Setup(store, student_cfg, objectives, keys, teacher, data)


def init_embeddings(student: Student, matrix: np.ndarray, seed: int) -> None:
    """PCA of the teacher's input embeddings to embed_dim; wider students get the rest random (small)."""
    cfg = student.config
    m = pca_embeddings(matrix, min(cfg.embed_dim, matrix.shape[1], matrix.shape[0]))
    out = np.random.default_rng(seed).normal(0, float(m.std()) * 0.1, (cfg.vocab_size, cfg.embed_dim))
    out[: m.shape[0], : m.shape[1]] = m
    out[cfg.pad_id] = 0.0
    student.init_embeddings(out.astype(np.float32))


# --------------------------------------------------------------------------------------------------
# Distributed, devices, RNG


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_dist(device: str) -> Dist:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; gloo on CPU, nccl on CUDA."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and device in ("auto", "cuda")
    dev = torch.device(f"cuda:{local}" if cuda else ("cpu" if device == "auto" else device))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        return Dist(dist.get_rank(), dist.get_world_size(), dev)
    return Dist(0, 1, dev)


def rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])


def _gather(obj: Any, d: Dist) -> list[Any]:
    if d.world == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def _all_sum(values: list[float], d: Dist) -> list[float]:
    if d.world == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)  # gloo and nccl (values are tiny; CPU tensors are fine for gloo)
    return t.tolist()


# --------------------------------------------------------------------------------------------------
# Optimisation


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases, norms and embedding tables (they are not 'weights' to shrink)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "embed" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr)


def make_schedule(opt: torch.optim.Optimizer, cfg: TrainConfig, total: int):
    """Returns (per-step LambdaLR: warm-up [+ cosine], plateau scheduler or None, warm-up steps).

    With a plateau schedule the LambdaLR is stepped during warm-up only; afterwards ReduceLROnPlateau
    owns the learning rate (a LambdaLR step would reset it to base_lr * factor).
    """
    warm = int(cfg.warmup * total) if cfg.warmup < 1 else int(cfg.warmup)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / (warm + 1)
        if cfg.schedule is Schedule.cosine:
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
        return 1.0

    step_sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    plateau = (torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)
               if cfg.schedule is Schedule.plateau else None)
    return step_sched, plateau, warm


@dataclass
class Early:
    """Early-stopping state (saved in checkpoints)."""

    best: float = math.inf
    best_step: int = 0
    bad: int = 0
    stop: bool = False


# --------------------------------------------------------------------------------------------------
# Output folder


def _prepare_out(cfg: TrainConfig, d: Dist) -> tuple[Path, dict | None]:
    """Create/clean the output folder; return a checkpoint to resume from (or None)."""
    out = Path(cfg.out)
    ckpt = out / CHECKPOINT
    if d.main and cfg.overwrite and out.exists():
        for name in (CHECKPOINT, BEST, METRICS, CURVE, "config.json", "model.safetensors", "training_args.json"):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "tokenizer", ignore_errors=True)
    if d.world > 1:
        import torch.distributed as dist

        dist.barrier()
    if ckpt.exists() and cfg.resume:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        saved = state["config"]
        now = cfg.to_json()
        diff = [k for k in now if k not in TrainConfig.RESUMABLE and saved.get(k) != now[k]]
        if diff or state["world"] != d.world:
            what = ", ".join(f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in diff) or \
                f"world size {state['world']} -> {d.world}"
            raise KdError(f"the checkpoint in the output folder was made with other options ({what})",
                          str(ckpt), "repeat the original options, use a new --out, or pass --overwrite")
        return out, state
    if out.exists() and any(out.iterdir()) and not cfg.overwrite and d.main:
        if (out / "config.json").exists() or (out / METRICS).exists():
            raise KdError("the output folder holds a student (and no checkpoint to resume)", str(out),
                          "use a new --out, or pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    return out, None


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


# --------------------------------------------------------------------------------------------------
# The loop


def _to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[dict], d: Dist, progress: float, autocast) -> float | None:
    """Mean validation loss over all ranks' held-out rows (row-weighted); None when there are none."""
    model.eval()
    total = n = 0.0
    for b in batches:
        with autocast():
            loss, _ = model(_to(b, d.device), progress)
        rows = len(b["id"])
        total, n = total + float(loss) * rows, n + rows
    model.train()
    total, n = _all_sum([total, n], d)
    return total / n if n else None


def train(cfg: TrainConfig) -> Path:
    """Train a student as configured; returns the output folder (a loadable student)."""
    d = init_dist(cfg.device)
    try:
        return _train(cfg, d)
    finally:
        if d.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _train(cfg: TrainConfig, d: Dist) -> Path:
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    s = setup(cfg)
    store = s.store
    plan = D.build_plan(store, s.data, d.world)
    pairs = store.manifest.pairs
    student = build_student(s.student_cfg)
    if cfg.init_embeddings is not EmbeddingInit.random:
        matrix = _embeddings_matrix(store, s.tokenizer)
        if matrix is not None:
            init_embeddings(student, matrix, cfg.seed)
    model = Distiller(student, s.objectives, pairs).to(d.device)
    opt = make_optimizer(model, cfg)
    steps_per_epoch = [plan.steps(e) for e in range(cfg.epochs)]
    total = cfg.max_steps or sum(steps_per_epoch)
    if total == 0 or plan.train_rows() == 0:
        raise InputError("the store has no training rows", store.root, "add inputs, or lower --val-percent")
    sched, plateau, warm = make_schedule(opt, cfg, total)
    if plateau is not None and plan.num_val == 0:
        raise InputError("--schedule plateau needs validation rows, and the held-out slice is empty",
                         store.root, "raise --val-percent or use --schedule cosine")
    use_amp = cfg.amp and d.device.type == "cuda"
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)

    def autocast():
        return torch.autocast("cuda", dtype=amp_dtype) if use_amp else contextlib.nullcontext()

    out, ckpt = _prepare_out(cfg, d)
    early, step, epoch, start, rows_seen = Early(), 0, 0, 0, 0
    torch.manual_seed(cfg.seed + d.rank)  # dropout masks differ per rank
    np.random.seed(cfg.seed + d.rank)
    random.seed(cfg.seed + d.rank)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        if plateau is not None:
            plateau.load_state_dict(ckpt["plateau"])
        scaler.load_state_dict(ckpt["scaler"])
        early = Early(**ckpt["early"])
        step, epoch, start, rows_seen = ckpt["step"], ckpt["epoch"], ckpt["batch"], ckpt["rows"]
        set_rng_state(ckpt["rng"][d.rank])
    ddp = model
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        # broadcast_buffers (default): every rank starts each step with rank 0's buffers (memory banks),
        # so the checkpoint, written by rank 0, restores all ranks exactly. Every student and objective
        # parameter takes part in every loss, so no search for unused parameters is needed.
        ddp = DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    val = D.validation_batches(store, plan, d.rank, d.world)
    has_val = plan.num_val > 0 and cfg.max_val_rows > 0  # the same on every rank (a rank may hold no batch)
    metrics = Metrics(out / METRICS, d.main, step if ckpt is not None else None)
    info = {"target": s.target, "tokenizer": s.tokenizer, "objectives": [o.spec for o in s.objectives],
            "total_steps": total, "world_size": d.world, "train_rows": plan.train_rows(), "val_rows": plan.num_val}

    def save_checkpoint() -> None:
        rng = _gather(rng_state(), d)
        if not d.main:
            return
        state = {
            "config": cfg.to_json(), "world": d.world, "step": step, "epoch": epoch, "batch": batch_no,
            "rows": rows_seen, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "plateau": plateau.state_dict() if plateau else None,
            "scaler": scaler.state_dict(), "early": asdict(early), "rng": rng,
        }
        tmp = out / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, out / CHECKPOINT)  # a kill never leaves a half-written checkpoint

    def validate() -> None:
        # the unwrapped model: ranks may hold different numbers of validation batches, and a DDP forward
        # would start a collective (buffer broadcast) per batch that the other rank never joins
        loss = evaluate(model, val, d, step / total, autocast)
        if loss is None:
            return
        metrics.log({"step": step, "epoch": epoch, "val_loss": loss})
        if plateau is not None:
            plateau.step(loss)
        if loss < early.best - 1e-6:
            early.best, early.best_step, early.bad = loss, step, 0
            if d.main:
                from safetensors.torch import save_file

                save_file(weights_state(model.student, list(model.objectives)), str(out / BEST))
        else:
            early.bad += 1
            early.stop = cfg.patience > 0 and early.bad >= cfg.patience

    model.train()
    window: list[Tensor] = []
    t0, rows0 = time.perf_counter(), rows_seen
    batch_no, first_epoch = start, epoch
    with Bar("train", total, "steps", cfg.progress and d.main, completed=step) as bar:
        for epoch in itertools.count(first_epoch):  # noqa: B020 - `epoch` is also read by save_checkpoint
            if step >= total or early.stop or (cfg.max_steps is None and epoch >= cfg.epochs):
                break
            n_batches, batch_no = plan.steps(epoch), start
            for batch in D.train_batches(store, plan, epoch, batch_no, d.rank):
                batch = _to(batch, d.device)
                with autocast():
                    loss, parts = ddp(batch, step / total)
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if cfg.clip > 0:
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
                scaler.step(opt)
                scaler.update()
                if plateau is None or step < warm:
                    sched.step()
                step, batch_no = step + 1, batch_no + 1
                rows_seen += len(batch["id"]) * d.world
                window.append(parts.detach())
                epoch_end = batch_no >= n_batches
                if step % cfg.log_every == 0 or epoch_end or step >= total:
                    mean = torch.stack(window).mean(0).cpu()
                    window.clear()
                    rps = (rows_seen - rows0) / max(1e-9, time.perf_counter() - t0)
                    rec = {"step": step, "epoch": epoch, "loss": float(mean.sum()), "lr": opt.param_groups[0]["lr"],
                           "rows": rows_seen, "rows_per_s": rps}
                    rec |= {o.spec: float(v) for o, v in zip(model.objectives, mean)}
                    metrics.log(rec)
                    bar.update(step, rows=rows_seen, rows_per_s=round(rps), loss=rec["loss"])
                else:
                    bar.update(step, rows=rows_seen)
                if has_val and ((cfg.eval_every and step % cfg.eval_every == 0)
                            or (not cfg.eval_every and epoch_end) or step >= total):
                    validate()
                if step % cfg.checkpoint_every == 0 or epoch_end or step >= total or early.stop:
                    save_checkpoint()
                if step >= total or early.stop:
                    break
            start = 0
    if d.main:
        if early.best_step and (out / BEST).exists():
            from safetensors.torch import load_file

            best = load_file(str(out / BEST))
            model.student.load_state_dict({k[8:]: v for k, v in best.items() if k.startswith("student.")})
            for i, obj in enumerate(model.objectives):
                p = f"objectives.{i}."
                obj.load_state_dict({k[len(p):]: v for k, v in best.items() if k.startswith(p)})
        info |= {"steps": step, "best_step": early.best_step or step,
                 "best_val_loss": None if math.isinf(early.best) else early.best, "stopped_early": early.stop}
        save_student(out, model.student, list(model.objectives), store.tokenizer_dir(s.tokenizer),
                     cfg.to_json() | {"resolved": info}, store.manifest.fingerprint, info)
        plot_curve(out / METRICS, out / CURVE)
    if d.world > 1:
        import torch.distributed as dist

        dist.barrier()
    return out


__all__ = ["EmbeddingInit", "Schedule", "TrainConfig", "evaluate", "setup", "train"]
