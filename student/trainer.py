"""`kd train-student`: train a student from a store's teacher outputs; the teacher is never loaded.

The loop, per step: batch (student.data) -> student forward (autocast on CUDA) -> weighted sum of the
objectives -> backward -> clip -> AdamW -> schedule. Around it:
- schedule: linear warm-up then cosine decay, ReduceLROnPlateau on validation loss, or constant;
- validation on the held-out id-hash slice every `eval_every` steps (default: each epoch end), always
  at the final progress (annealing lambda = 1), so every checkpoint is judged by the same loss;
- `init`: start from a trained student's config and weights (the two-stage recipe, docs/training.md);
  early stopping after `patience` evaluations without improvement, best weights kept and exported;
- checkpoints every `checkpoint_every` steps, at the last step and on a stop hold model, optimizer, scheduler,
  scaler, early-stopping state, every rank's RNG states and the data position (epoch, batches
  consumed). Resuming replays nothing: it continues with exactly the batch and the random numbers
  the uninterrupted run would have used, so the weights come out identical (student.checkpoint). Not at
  epoch ends: resuming needs no epoch boundary, and a small store's epochs of a few steps made it save every
  few steps (the dry run's 128-row sample: every 2nd step, each save as long as a MiniLM student's step);
- numbers: NaN/Inf in a target column the objectives read stops the run before the first step (the
  row id named, student.data.build_plan); a non-finite loss stops it before its backward pass, and
  weights are checked before every save (checkpoint, best, student): the last good files stay;
- SIGINT/SIGTERM (common.stop): the step in flight ends, a checkpoint is saved, the run exits 130/143;
  rerunning the command resumes there (a second signal stops at once, losing the steps since the last save);
- DDP under torchrun (gloo on CPU, nccl on CUDA): ranks read disjoint shards, equal step counts
  (student.distributed);
- metrics.jsonl (one record per log/eval), loss.png, a rich progress bar (rows, rows/s, ETA).

The options are student.train_config, the set-up from the store (each file read once, the student's
starting weights) student.setup. Read top to bottom: the model, optimisation, the output folder and its
records, then the loop (`train` -> `_start` -> `_run_epoch` -> `_train_step`, `_maybe_log`,
`_maybe_validate`, `_save_checkpoint` -> `_finish`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import math
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from kd.common.attention import varying_shape_attention
from kd.common.errors import InputError, KdError
from kd.common.finite import require_finite_weights
from kd.common.hardware import native_bf16
from kd.common.options import saved_defaults
from kd.common.outputs import STUDENT, TRAIN_LOCK, claim_output, kind_of
from kd.common.paths import as_given, local_path, recorded_files
from kd.common.progress import Bar, step
from kd.common.stop import Stopped, StopRequest
from kd.storage import fs
from kd.storage.store import Store
from kd.student import checkpoint
from kd.student import data as D
from kd.student.checkpoint import CHECKPOINT, Trainables, TrainState
from kd.student.distributed import Dist, all_sum, barrier, gather, init_dist, shutdown, wrap
from kd.student.head_fit import HeadFit, fit_head, wants_fit
from kd.student.metrics import CURVE, METRICS, Metrics, plot_curve
from kd.student.models import Student, StudentOutput
from kd.student.saved import save_student, weights_state, write_weights
from kd.student.setup import Setup, initial_student, read_ids, setup
from kd.student.train_config import Schedule, TrainConfig

BEST = "best.safetensors"  # the best validated weights so far (exported at the end)
# The options of a run that has not finished yet: a run killed before its first checkpoint starts again only on the
# same command (another command would delete metrics it did not write); dropped with the checkpoint at the end.
STARTED = ".kd-started.json"
# What a run writes before its first checkpoint: nothing there can be resumed (see killed_before_a_checkpoint)
BEFORE_A_CHECKPOINT = (METRICS, CURVE, BEST)
DIVERGED = "run kd validate on the store (it reports NaN/Inf vectors); otherwise lower --lr (with --overwrite)"


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
        # the encoder may run under autocast; the objectives compare with fp32 teacher vectors in fp32
        # (a bf16 cosine or softmax loses the small differences the loss is made of)
        with torch.autocast(next(self.student.parameters()).device.type, enabled=False):
            out = _fp32(out)
            parts = torch.stack([obj(out, batch, progress).float() for obj in self.objectives])
        return parts.sum(), parts


def _fp32(out: StudentOutput | tuple[StudentOutput, StudentOutput]) -> Any:
    if isinstance(out, tuple):
        return tuple(_fp32(o) for o in out)
    return dataclasses.replace(out, embedding=out.embedding.float(),
                               layers=None if out.layers is None else out.layers.float())


# --------------------------------------------------------------------------------------------------
# Optimisation


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases, norms and embedding tables (they are not 'weights' to shrink)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "embed" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused on a GPU: one kernel for every parameter's update instead of a dozen per group (the small students'
    # steps are bound by how fast the host queues kernels, not by the GPU's arithmetic)
    fused = all(p.is_cuda for p in decay + no_decay) or None
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=fused)


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


# Transformer students spend their step in matmuls, which oneDNN runs ~1.6x faster in bf16 on a CPU with
# native bf16 (2 of MiniLM's layers, batch 128 x 40 tokens: 136 vs 80 rows/s on 1 thread). Recurrent and
# static students are bound by other kernels (LSTM cells, EmbeddingBag): they stay fp32 on CPU.
CPU_BF16_ARCHS = ("transformer", "transformer-init")


def amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of this run, or None for plain fp32.

    - CUDA: bf16 where the GPU supports it, else fp16 (with loss scaling, see `make_amp`);
    - CPU: bf16 for Transformer students when the CPU has native bf16 (`common.hardware.native_bf16`);
    - `--no-amp`: None everywhere. Weights, optimizer state and the objectives stay fp32 (`Distiller`).
    """
    if not cfg.amp:
        return None
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cfg.arch in CPU_BF16_ARCHS and native_bf16():
        return torch.bfloat16
    return None


def make_amp(cfg: TrainConfig, d: Dist) -> tuple[Callable[[], contextlib.AbstractContextManager], torch.amp.GradScaler]:
    """(autocast context factory, grad scaler) for the loop: see `amp_dtype`. Loss scaling for fp16 only,
    whose small gradients underflow to zero without it; bf16 has fp32's range."""
    dtype = amp_dtype(cfg, d.device)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    if dtype is None:
        return contextlib.nullcontext, scaler
    return functools.partial(torch.autocast, d.device.type, dtype=dtype), scaler


# --------------------------------------------------------------------------------------------------
# Output folder (its records: student.metrics)


_HELD_LOCKS: list = []  # output-folder locks of runs in this process (released when it exits)


def _remove_temps(out: Path) -> None:
    """Delete the temporary files of interrupted atomic writes (`NAME.tmp` / `NAME.tmp-XXXX`)."""
    for tmp in out.glob("*.tmp*") if out.is_dir() else []:
        tmp.unlink(missing_ok=True)


def _kd_trained(out: Path) -> bool:
    """Whether the folder's config.json is a kd student's (it records the student's arch and kd's training args)."""
    try:
        info = json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and isinstance(info.get("student"), dict) and "arch" in info["student"] \
        and (out / "training_args.json").is_file()


def _prepare_out(cfg: TrainConfig, d: Dist, reads: checkpoint.Reads) -> tuple[Path, dict | None]:
    """Create/clean the output folder; return a checkpoint to resume from (or None)."""
    out = local_path(cfg.out)
    ckpt = out / CHECKPOINT
    if out.exists() and not out.is_dir():
        raise KdError("--out is an existing file, not a folder", str(out), "pass a folder path for the student")
    made_lock = d.main and not (out / TRAIN_LOCK).exists()
    try:
        return _claim_out(cfg, d, out, ckpt, reads)
    except KdError:
        if made_lock and not (out / CHECKPOINT).exists() and not (out / METRICS).exists():
            (out / TRAIN_LOCK).unlink(missing_ok=True)  # refused before any work: leave the folder as it was
        raise


def killed_before_a_checkpoint(out: Path) -> bool:
    """`out` holds only what a training run writes before its first checkpoint (kill -9 during the head fit or the
    first steps leaves metrics and no checkpoint): nothing to resume from and nothing of a user's, so a rerun of
    the same command starts again rather than asking for --overwrite (kd distill's resume depends on it). Anything
    else beside them (a user's file) keeps the refusal. An empty folder counts."""
    return out.is_dir() and all(p.name in BEFORE_A_CHECKPOINT or p.name.startswith(".kd-") for p in out.iterdir())


def _claim_out(cfg: TrainConfig, d: Dist, out: Path, ckpt: Path, reads: checkpoint.Reads) -> tuple[Path, dict | None]:
    if d.main:
        # Two runs into one folder would interleave metrics and race on every rename: the second stops.
        lock = fs.exclusive_lock(str(out / TRAIN_LOCK))
        if lock is None:
            raise KdError("another kd train-student is writing this output folder", str(out),
                          "wait for it to finish, or use a different --out")
        _HELD_LOCKS.append(lock)
        _remove_temps(out)  # left by a run that died mid-write (disk full, kill -9): never read
    if d.main and cfg.overwrite and out.exists():
        if (out / "config.json").exists() and not _kd_trained(out):  # a checkpoint or a user's folder, not kd's
            raise KdError("--overwrite replaces only a student kd train-student wrote; this folder's config.json is "
                          "not one", str(out), "use a new --out (nothing was changed)")
        for name in (CHECKPOINT, BEST, METRICS, CURVE, STARTED, "config.json", "model.safetensors",
                     "training_args.json"):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "tokenizer", ignore_errors=True)
    barrier(d)  # no rank looks for a checkpoint that rank 0 is deleting
    if ckpt.exists() and cfg.resume:
        return out, checkpoint.load(ckpt, cfg.to_json(), TrainConfig.RESUMABLE, d.world, reads,
                                    saved_defaults(TrainConfig), TrainConfig.PATHS, as_given(cfg.out))
    if out.exists() and any(out.iterdir()) and not cfg.overwrite and d.main:
        if (out / "config.json").exists():
            other = _other_options(_finished_with(out), cfg, out / "training_args.json")[:3]
            raise KdError("the output folder holds a finished student" + (f" trained with other options ("
                          f"{'; '.join(other)})" if other else ""), str(out),
                          "use a new --out, or pass --overwrite to train it again with these options")
        if (out / METRICS).exists():  # a run that stopped before its first checkpoint (or lost it)
            _restart_killed_run(out, cfg, reads)
    out.mkdir(parents=True, exist_ok=True)
    if d.main:
        # what the run trains on, too: a store rebuilt at the same path, or other ids in the same --exclude-ids file,
        # is another run (a probe: the dead run's metrics were deleted and the new data trained on, exit 0)
        record = cfg.record() | {"reads": dataclasses.asdict(reads)}
        fs.atomic_write_bytes(fs.resolve(out), json.dumps(record, sort_keys=True).encode(), STARTED)
    return out, None


def _restart_killed_run(out: Path, cfg: TrainConfig, reads: checkpoint.Reads) -> None:
    """Start again in a folder a run left before its first checkpoint, if this is the command that started it."""
    if not (cfg.resume and killed_before_a_checkpoint(out)):
        raise KdError("the output folder holds the metrics of an unfinished run, with no checkpoint to "
                      "resume and no student", str(out), "pass --overwrite to start again, or use a new --out")
    record = out / STARTED
    started = _options_in(record) if record.exists() else None  # kd before 2026-11-30 wrote none: the same command
    if started is not None and "store" not in started:  # (every record kd writes holds --shards)
        raise KdError(f"the output folder holds the metrics of an unfinished run and a {STARTED} that is not the "
                      "record kd train-student writes, so which command started the run is unknown", str(record),
                      "pass --overwrite to start again, or use a new --out")
    other = _other_options(started, cfg, record, guess_here=False)[:3] if started else []  # (a wrong match deletes)
    if other:
        raise KdError(f"the output folder holds the metrics of an unfinished run started with other options "
                      f"({'; '.join(other)}), with no checkpoint to resume", str(out),
                      "repeat its options to start it again, pass --overwrite to replace it, or use a new --out")
    if started and isinstance(started.get("reads"), dict) and started["reads"] != dataclasses.asdict(reads):
        raise KdError("the output folder holds the metrics of an unfinished run on other data (the store at --shards "
                      "was rebuilt or changed since it started, or the --exclude-ids file names other rows), with no "
                      "checkpoint to resume", str(out), "pass --overwrite to start again on this data, or use a new "
                      "--out")
    for name in BEFORE_A_CHECKPOINT:  # nothing to resume from: the same command starts it again
        (out / name).unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------
# The loop. `_Run` holds what is fixed once training starts, `TrainState` (student.checkpoint) what a
# checkpoint saves; the functions below take both, in the order one step uses them.


@dataclass
class _Run:
    """What the loop reads and never reassigns (the optimisation objects change state, not identity)."""

    cfg: TrainConfig
    d: Dist
    s: Setup
    plan: D.Plan
    tr: Trainables  # tr.model is the Distiller (unwrapped)
    ddp: nn.Module  # the model for the training forward: tr.model, or its DDP wrapper
    warm: int  # warm-up steps
    total: int  # steps of the whole run
    autocast: Callable[[], contextlib.AbstractContextManager]
    out: Path
    metrics: Metrics
    val: list[dict]  # this rank's validation batches (may be none, even when other ranks have some)
    has_val: bool  # the same on every rank
    reads: checkpoint.Reads  # what this run trains on, as its checkpoints record it


@dataclass
class _Report:
    """Between two log records: the progress bar, the throughput origin (the losses and token counts since the last
    record are the TrainState's: a checkpoint holds them); and the run's stop request (checked after every step)."""

    bar: Bar
    t0: float
    rows0: int
    stop: StopRequest


def _to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[dict], d: Dist, progress: float, autocast) -> float | None:
    """Mean validation loss over all ranks' held-out rows (row-weighted); None when there are none."""
    model.eval()
    total = n = 0.0
    for b in batches:
        with autocast(), varying_shape_attention(d.device.type):
            loss, _ = model(_to(b, d.device), progress)
        rows = len(b["id"])
        total, n = total + float(loss) * rows, n + rows
    model.train()
    total, n = all_sum([total, n], d)
    return total / n if n else None


# What a rerun may change and still be the same run (how it is shown, where it runs, how it may resume; `out` is the
# folder we are reading, however it is spelt). Not num_workers: its readers deal the rows, so another count trains
# other weights (a finished --workers 0 student said "nothing to do" to --workers 2).
_SAME_RUN_IGNORES = ("out", "progress", "overwrite", "resume", "device", "log_every")


def _finished_by_the_same_command(cfg: TrainConfig) -> bool:
    """Whether `out` holds the finished student this very config trains: the same command run again (a script
    rerun after a kill that came too late) then has nothing to do, as a complete store has for precompute."""
    out = local_path(cfg.out)
    if cfg.overwrite or (out / CHECKPOINT).exists() or not _kd_trained(out):
        return False
    done = _finished_with(out)
    return bool(done) and not _other_options(done, cfg, out / "training_args.json")


def _other_options(done: dict, cfg: TrainConfig, record: Path, guess_here: bool = True) -> list[str]:
    """The options in which `cfg` differs from those a run recorded in `record` (training_args.json,
    .kd-started.json), as 'name: there, here'; an option the record lacks at its default, paths as the files they
    name (both sides: "'storeA' there, 'storeA' here" told nothing)."""
    there = recorded_files(saved_defaults(TrainConfig) | done, TrainConfig.PATHS, as_given(cfg.out), record,
                           guess_here=guess_here)
    here = cfg.record()
    other = [f"{k}: {there.get(k)!r} there, {v!r} here" for k, v in here.items()
             if k not in _SAME_RUN_IGNORES and there.get(k) != v]
    resolved = done.get("resolved")  # a finished student's
    return other + _other_data(resolved.get("reads") if isinstance(resolved, dict) else None, cfg)


def _other_data(recorded: Any, cfg: TrainConfig) -> list[str]:
    """How the data a finished student was trained on (its record's `reads`) differs from what `cfg` reads now: a
    store rebuilt at its path, or other ids in its --exclude-ids file, said "nothing to do" (a probe). An older kd
    recorded none: not compared."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("tables"), list):
        return []
    store = checkpoint.store_identity(Store.open(cfg.store).manifest, recorded["tables"])
    left_out = checkpoint.rows_left_out(read_ids(cfg.exclude_ids) if cfg.exclude_ids else ())
    return [what for what, same in (
        ("the store at --shards: rebuilt or changed since the student was trained", recorded.get("store") == store),
        ("exclude_ids: the file names other rows than the student was trained without",
         recorded.get("left_out") == left_out)) if not same]


def _finished_with(out: Path) -> dict:
    return _options_in(out / "training_args.json")


def _options_in(path: Path) -> dict:
    """The options a run wrote to `path` ({} when absent or unreadable: nothing to compare with)."""
    if not path.is_file():  # (a FIFO there would block the read forever: probe)
        return {}
    try:
        done = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return done if isinstance(done, dict) else {}


def train(cfg: TrainConfig) -> Path:
    """Train a student as configured; returns the output folder (a loadable student)."""
    if _finished_by_the_same_command(cfg):
        print(f"{cfg.out} already holds the student this command trains: nothing to do", file=sys.stderr)
        return local_path(cfg.out)
    d = init_dist(cfg.device)
    fresh = not local_path(cfg.out).exists()
    try:
        return _train(cfg, d)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        out = local_path(cfg.out)
        if d.main and _HELD_LOCKS:  # only what this run wrote under its lock: never another run's files
            _clean_after_a_full_disk(out)
        raise KdError(f"the disk is full: {e.strerror} while writing {e.filename or 'the output'}", str(cfg.out),
                      "free some space (or use --out on another disk) and " + _rerun_after_a_full_disk(out, cfg)
                      ) from e
    finally:
        if fresh and d.main and _HELD_LOCKS:  # only a run that held the folder's lock: a refused second run
            _remove_if_nothing_kept(local_path(cfg.out))  # must never remove the folder the first one is writing
        while _HELD_LOCKS:
            _HELD_LOCKS.pop().close()
        shutdown(d)


def _clean_after_a_full_disk(out: Path) -> None:
    """Temp files go; before the first checkpoint this run's metrics and best weights go too: nothing there can be
    resumed, and alone they made the rerun ask for --overwrite (issue 48's probe). Called under the folder's lock,
    past the claim, which refuses a folder holding another run's metrics."""
    _remove_temps(out)
    if not (out / CHECKPOINT).exists() and not (out / "config.json").exists():
        for name in (*BEFORE_A_CHECKPOINT, STARTED):
            (out / name).unlink(missing_ok=True)


def _rerun_after_a_full_disk(out: Path, cfg: TrainConfig) -> str:
    """What the same command does once there is space (the fix of the full-disk error)."""
    if (out / "config.json").exists():  # the disk filled after the student (its curve or card)
        return "rerun: the student itself was written (config.json); only its loss curve or model card may be missing"
    if (out / CHECKPOINT).exists() and cfg.resume and not cfg.overwrite:
        return "rerun: training resumes from the last checkpoint; no student was written"
    return "rerun: training starts again (it stopped before its first checkpoint); no student was written"


def _remove_if_nothing_kept(out: Path) -> None:
    """A run that failed before its first checkpoint, into a folder it created, leaves no folder: its lock and
    first metrics alone would make the rerun ask for --overwrite (the error already said what went wrong)."""
    if out.is_dir() and {p.name for p in out.iterdir()} <= {TRAIN_LOCK, METRICS, STARTED}:
        shutil.rmtree(out, ignore_errors=True)


def _train(cfg: TrainConfig, d: Dist) -> Path:
    # the store's check, the start weights (PCA, SIF counts over every text), the head's fit: 5-15 s on the demo's
    # 6,000 sentences before the first step, silent before (issue 49)
    with step("preparing the training (the store, the student's start, its head)", cfg.progress and d.main):
        run, st = _start(cfg, d)
    run.tr.model.train()
    t0, rows0 = time.perf_counter(), st.rows_seen
    with Bar("train", run.total, "steps", cfg.progress and d.main, completed=st.step) as bar, StopRequest() as stop:
        rep = _Report(bar, t0, rows0, stop)
        while not (st.step >= run.total or st.early.stop or (cfg.max_steps is None and st.epoch >= cfg.epochs)):
            _run_epoch(run, st, rep)
            st.epoch, st.batch_no = st.epoch + 1, 0  # only a resumed run starts an epoch mid-way
    _finish(run, st)
    return run.out


def _start(cfg: TrainConfig, d: Dist) -> tuple[_Run, TrainState]:
    """Everything before the first step, in an order that fixes the random numbers each part draws."""
    # --out before any work: never the store, an --init student or a folder holding them; --overwrite only
    # replaces a student folder (its files: `_prepare_out`)
    out = claim_output(cfg.out, "kd train-student", (STUDENT,), [cfg.store, cfg.init, cfg.exclude_ids],
                       overwrite=cfg.overwrite)
    if out.is_dir() and any(out.iterdir()) and kind_of(out) is None:  # a checkpoint or the user's own files
        raise InputError("--out already holds files kd did not write (no kd student is in it)", str(out),
                         "pass a new --out: a student is never written among other files, --overwrite included")
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    s = setup(cfg)
    plan = D.build_plan(s.store, s.data, d.world)
    model = _build_model(cfg, s, d)
    opt = make_optimizer(model, cfg)
    total = cfg.max_steps or sum(plan.steps(e) for e in range(cfg.epochs))
    if total == 0 or plan.train_rows() == 0:
        raise InputError("the store has no training rows", s.store.root, "add inputs, or lower --val-percent")
    sched, plateau, warm = make_schedule(opt, cfg, total)
    if plateau is not None and plan.num_val == 0:
        raise InputError("--schedule plateau needs validation rows, and the held-out slice is empty",
                         s.store.root, "raise --val-percent or use --schedule cosine")
    autocast, scaler = make_amp(cfg, d)
    tr = Trainables(model, opt, sched, plateau, scaler)
    reads = checkpoint.Reads(checkpoint.store_identity(s.store.manifest, plan.columns.tables()),
                             checkpoint.rows_left_out(s.data.exclude))
    out, ckpt = _prepare_out(cfg, d, reads)
    # a fresh run only: a resumed one restores the fitted (and trained) head from its checkpoint
    fit = _fit_head(cfg, s, plan, model.student, d) if ckpt is None else None
    torch.manual_seed(cfg.seed + d.rank)  # dropout masks differ per rank
    np.random.seed(cfg.seed + d.rank)
    random.seed(cfg.seed + d.rank)
    # after the seeds: a resumed run replaces them with the RNG states saved at its checkpoint
    st = checkpoint.restore(ckpt, tr, d.rank) if ckpt is not None else TrainState()
    ddp = wrap(model, d)
    val = D.validation_batches(s.store, plan, d.rank, d.world, s.tok)
    has_val = plan.num_val > 0 and cfg.max_val_rows > 0  # the same on every rank (a rank may hold no batch)
    metrics = Metrics(out / METRICS, d.main, st.step if ckpt is not None else None)
    if fit is not None:
        metrics.log({"step": 0, "head_fit": dataclasses.asdict(fit)})
    return _Run(cfg, d, s, plan, tr, ddp, warm, total, autocast, out, metrics, val, has_val, reads), st


def _build_model(cfg: TrainConfig, s: Setup, d: Dist) -> Distiller:
    return Distiller(initial_student(cfg, s), s.objectives, s.store.manifest.pairs).to(d.device)


def _fit_head(cfg: TrainConfig, s: Setup, plan: D.Plan, student: Student, d: Dist) -> HeadFit | None:
    """The head's least-squares start (student.head_fit) where --head-init asks for one; DDP broadcasts
    rank 0's head, so each rank fitting on its own rows is harmless."""
    # a shrunk --init student (--init-layers) counts as fresh: its head was fitted to the layers it lost
    if not wants_fit(cfg.head_init, student, bool(cfg.init) and not s.kept_layers, bool(s.target),
                     cfg.out_dim is not None):
        return None
    return fit_head(student, D.train_batches(s.store, plan, 0, 0, d.rank, s.tok), s.target[0])


def _run_epoch(run: _Run, st: TrainState, rep: _Report) -> None:
    """The rest of epoch `st.epoch` from batch `st.batch_no`; stops early at the last step or on early stopping."""
    n_batches = run.plan.steps(st.epoch)
    pin = run.d.device.type == "cuda"
    for batch in D.train_batches(run.s.store, run.plan, st.epoch, st.batch_no, run.d.rank, run.s.tok, pin):
        # counted on the host copy: a sum of a GPU tensor would wait for the GPU every step
        for key in [k for k in batch if k.endswith("attention_mask")]:
            st.tokens[0] += int(batch[key].sum())
            st.tokens[1] += batch[key].numel()
        batch = _to(batch, run.d.device)
        parts = _train_step(run, st, batch)
        st.step, st.batch_no = st.step + 1, st.batch_no + 1
        st.rows_seen += len(batch["id"]) * run.d.world
        st.window.append(parts)
        epoch_end = st.batch_no >= n_batches
        _maybe_log(run, st, rep, epoch_end)
        _maybe_validate(run, st, epoch_end)
        last = st.step >= run.total or st.early.stop
        stopping = not last and _stop_agreed(run, rep.stop)
        if st.step % run.cfg.checkpoint_every == 0 or last or stopping:
            _require_finite_losses(run, st, st.window)  # the steps since the last record (GPU: not checked yet)
            _save_checkpoint(run, st)
        if stopping:
            raise Stopped(rep.stop.signum or signal.SIGTERM,
                          f"stopped by {rep.stop.name or 'a signal to another rank'} after step {st.step:,} of "
                          f"{run.total:,}: checkpoint saved, no student written yet", str(run.out),
                          "rerun the same command to resume from this step (--max-steps may change)")
        if last:
            return


def _stop_agreed(run: _Run, stop: StopRequest) -> bool:
    """Whether any rank was asked to stop: all ranks must take the same step (the checkpoint is a collective)."""
    asked = stop.signum is not None
    return asked if run.d.world == 1 else all_sum([float(asked)], run.d)[0] > 0


def _train_step(run: _Run, st: TrainState, batch: dict[str, Any]) -> Tensor:
    """Forward, backward, clip, AdamW, schedule; returns the (weighted) loss of each objective, detached."""
    tr = run.tr
    # bucketed batches vary in shape: cuDNN's attention would build a plan per new shape (common/attention.py)
    with run.autocast(), varying_shape_attention(run.d.device.type):
        loss, parts = run.ddp(batch, st.step / run.total)
    if _checks_every_step(run):
        _require_finite_losses(run, st, [parts.detach()], st.step + 1)
    tr.opt.zero_grad(set_to_none=True)
    tr.scaler.scale(loss).backward()
    if run.cfg.clip > 0:
        tr.scaler.unscale_(tr.opt)  # clip the true gradients, not the loss-scaled ones
        torch.nn.utils.clip_grad_norm_(tr.model.parameters(), run.cfg.clip)
    tr.scaler.step(tr.opt)
    tr.scaler.update()
    if tr.plateau is None or st.step < run.warm:  # past warm-up, ReduceLROnPlateau owns the rate
        tr.sched.step()
    return parts.detach()


def _checks_every_step(run: _Run) -> bool:
    """Whether each step's loss is checked before its update. On a GPU the check is a sync: the host waits for
    the forward before it may queue the backward, and the GPU idles while the host queues the next step. There
    the losses are checked where the host reads them anyway (each metrics record) and before every checkpoint:
    a NaN found then names its step, the weights may be NaN since, and no checkpoint after it is written."""
    return run.d.device.type != "cuda"


def _require_finite_losses(run: _Run, st: TrainState, window: list[Tensor], last_step: int | None = None) -> None:
    """NaN/Inf targets (a store written in fp16 that overflowed) or a diverged model: stop before a useless
    student is saved with exit 0, the last checkpoint kept. torchrun stops the other ranks. `window`: the per-step
    objective losses of the steps up to `last_step` (default: the current one)."""
    if not window:
        return
    parts = torch.stack(window).float().cpu()
    bad = (~torch.isfinite(parts).all(1)).nonzero()
    if len(bad) == 0:
        return
    first = int(bad[0, 0])
    step = (last_step if last_step is not None else st.step) - len(window) + 1 + first
    losses = ", ".join(f"{o.spec} {v:.3g}" for o, v in zip(run.s.objectives, parts[first].tolist()))
    raise KdError(f"the training loss is not finite at step {step} ({losses}); training stopped, the "
                  "last checkpoint is kept", run.cfg.store, DIVERGED)


def _maybe_log(run: _Run, st: TrainState, rep: _Report, epoch_end: bool) -> None:
    """Every `log_every` steps, at epoch ends and at the last step: a metrics record of the mean losses."""
    if not (st.step % run.cfg.log_every == 0 or epoch_end or st.step >= run.total):
        rep.bar.update(st.step, rows=st.rows_seen)
        return
    _require_finite_losses(run, st, st.window)
    mean = torch.stack(st.window).mean(0).cpu()
    st.window.clear()
    rps = (st.rows_seen - rep.rows0) / max(1e-9, time.perf_counter() - rep.t0)
    # padding: the share of the student's token slots that are padding (what bucketing cuts)
    padding = 1.0 - st.tokens[0] / max(1, st.tokens[1])
    st.tokens[:] = [0, 0]
    rec = {"step": st.step, "epoch": st.epoch, "loss": float(mean.sum()), "lr": run.tr.opt.param_groups[0]["lr"],
           "rows": st.rows_seen, "rows_per_s": rps, "padding": round(padding, 4),
           "autocast": str(amp_dtype(run.cfg, run.d.device) or "off").removeprefix("torch.")}
    rec |= {o.spec: float(v) for o, v in zip(run.tr.model.objectives, mean)}
    run.metrics.log(rec)
    rep.bar.update(st.step, rows=st.rows_seen, rows_per_s=round(rps), loss=rec["loss"], padding=f"{padding:.0%}")


def _maybe_validate(run: _Run, st: TrainState, epoch_end: bool) -> None:
    """Every `eval_every` steps (default: epoch ends) and at the last step: plateau, early stopping, best."""
    cfg = run.cfg
    if not run.has_val or not ((cfg.eval_every and st.step % cfg.eval_every == 0)
                               or (not cfg.eval_every and epoch_end) or st.step >= run.total):
        return
    # the unwrapped model: ranks may hold different numbers of validation batches, and a DDP forward
    # would start a collective (buffer broadcast) per batch that the other rank never joins
    # at the final progress (lambda = 1 for annealed objectives), whatever the step: every checkpoint is
    # judged by one loss, so early stopping and the best checkpoint compare like with like
    loss = evaluate(run.tr.model, run.val, run.d, 1.0, run.autocast)
    if loss is None:
        return
    run.metrics.log({"step": st.step, "epoch": st.epoch, "val_loss": loss})
    if run.tr.plateau is not None:
        run.tr.plateau.step(loss)
    early = st.early
    if loss < early.best - 1e-6:
        early.best, early.best_step, early.bad = loss, st.step, 0
        if run.d.main:
            write_weights(run.out / BEST, weights_state(run.tr.model.student, list(run.tr.model.objectives)))
    else:
        early.bad += 1
        early.stop = cfg.patience > 0 and early.bad >= cfg.patience


def _save_checkpoint(run: _Run, st: TrainState) -> None:
    # on every rank (DDP keeps their weights equal): all stop, and the last good checkpoint stays on disk
    require_finite_weights(run.tr.model.state_dict(), str(run.out / CHECKPOINT), DIVERGED)
    rng = gather(checkpoint.rng_state(), run.d)  # a collective: every rank sends its RNG states, rank 0 writes
    if run.d.main:
        checkpoint.save(run.out, run.cfg.record(), run.d.world, st, run.tr, rng, run.reads)


def _finish(run: _Run, st: TrainState) -> None:
    """Rank 0 exports the student (the best validated weights, if validation ran) and plots loss.png."""
    model, s, early = run.tr.model, run.s, st.early
    if run.d.main:
        if early.best_step and (run.out / BEST).exists():
            _load_best(model, run.out / BEST)
        info = {"target": s.target, "tokenizer": s.tokenizer, "objectives": [o.spec for o in s.objectives],
                "total_steps": run.total, "world_size": run.d.world, "train_rows": run.plan.train_rows(),
                "val_rows": run.plan.num_val, "excluded_rows": run.plan.excluded,
                "reads": dataclasses.asdict(run.reads) | {"tables": sorted(run.plan.columns.tables())},
                "steps": st.step, "best_step": early.best_step or st.step,
                "best_val_loss": None if math.isinf(early.best) else early.best, "stopped_early": early.stop}
        save_student(run.out, model.student, list(model.objectives), s.data.tokenizer_path(s.store),
                     run.cfg.record() | {"resolved": info}, s.store.manifest.fingerprint, info)
        plot_curve(run.out / METRICS, run.out / CURVE)
        # The run is complete: its checkpoint (torch's pickle-based format, even if loaded weights-only)
        # is dropped so a student folder that travels holds safetensors and JSON only.
        (run.out / STARTED).unlink(missing_ok=True)  # (first: a kill between the two leaves a checkpoint to resume)
        (run.out / CHECKPOINT).unlink(missing_ok=True)
    barrier(run.d)


def _load_best(model: Distiller, path: Path) -> None:
    best = load_file(str(path))
    model.student.load_state_dict({k[8:]: v for k, v in best.items() if k.startswith("student.")})
    for i, obj in enumerate(model.objectives):
        p = f"objectives.{i}."
        obj.load_state_dict({k[len(p):]: v for k, v in best.items() if k.startswith(p)})


__all__ = ["Distiller", "TrainConfig", "evaluate", "setup", "train"]
