"""Checkpoints for exact resume: the loop's position, every state_dict, and every rank's RNG state.

- what is saved: the options, the world size, the data position (epoch, batches of it consumed, steps,
  rows), model, optimizer, schedulers, grad scaler, early-stopping state, and each rank's torch, CUDA,
  numpy and python RNG states. The batches are a pure function of (seed, epoch, position) (see
  student.data), so position plus RNG states let a resumed run continue with exactly the batch and the
  random numbers (dropout, memory-bank sampling) the uninterrupted run would have used: nothing is
  replayed and the weights come out identical;
- `save` writes to a temporary file, then renames it: a kill at any moment leaves the previous
  checkpoint or the new one, never half of one;
- `load` refuses a checkpoint made with other options or another world size (only `resumable` options
  may differ), or on another store (its content fingerprint differs): resuming it would silently train
  some other model;
- `load` never runs code from the file: `torch.load(weights_only=True)` accepts tensors and plain
  containers only, which is why RNG states are saved as tensors and tuples, not numpy objects. A
  finished run deletes its checkpoint, so a student folder someone sends you holds no pickle at all.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from kd.common.errors import KdError
from kd.common.paths import named_files, recorded_files
from kd.storage import fs
from kd.storage.manifest import Manifest

CHECKPOINT = "checkpoint.pt"


@dataclass
class Early:
    """Early-stopping state (saved in checkpoints)."""

    best: float = math.inf
    best_step: int = 0
    bad: int = 0
    stop: bool = False


@dataclass
class TrainState:
    """Where the loop is: everything a checkpoint holds besides state_dicts and RNG states."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch_no: int = 0  # batches of `epoch` consumed (saved as "batch")
    rows_seen: int = 0  # training rows consumed by all ranks together (saved as "rows")
    early: Early = field(default_factory=Early)
    # the metrics record in progress: each step's objective losses and the (real, padded) token slots since the last
    # record. Saved, so a run resumed between two records logs the one it was in the middle of, not its last steps
    # alone (kd distill's stages checkpoint every 5 steps and log every 20: a kill changed loss.png, a probe)
    window: list[torch.Tensor] = field(default_factory=list)
    tokens: list[int] = field(default_factory=lambda: [0, 0])


@dataclass
class Trainables:
    """Everything with a state_dict that a checkpoint restores."""

    model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    plateau: torch.optim.lr_scheduler.ReduceLROnPlateau | None
    scaler: torch.amp.GradScaler


def store_identity(manifest: Manifest, tables: list[str]) -> str:
    """What a run trains on: the inputs' fingerprint and the checksum of every shard of the tables it reads.

    Tables the run does not read (a teacher or student table added later) do not count, so adding one
    does not block a resume; rebuilding or changing a read table does.
    """
    parts = {"fingerprint": manifest.fingerprint,
             "tables": {t: [r.sha256 for _, r in sorted(manifest.tables[t].shards.items())]
                        for t in sorted(tables) if t in manifest.tables}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def rows_left_out(ids: tuple[int, ...]) -> str | None:
    """The ids a run leaves out (--exclude-ids) as a digest: the file it read them from may be edited between a
    kill and the resume under the same path (a probe: the resumed run then trained on two row sets)."""
    return hashlib.sha256(np.asarray(sorted(set(ids)), np.int64).tobytes()).hexdigest() if ids else None


@dataclass(frozen=True)
class Reads:
    """What a run trains on, as a checkpoint records it: `store_identity` and `rows_left_out`."""

    store: str
    left_out: str | None


def rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors, strings and numbers (what `torch.load(weights_only=True)` accepts)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }


def set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
    name, keys, pos, has_gauss, cached = s["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(s["python"])


def save(out: Path, config: dict[str, Any], world: int, st: TrainState, tr: Trainables, rng: list[dict],
         reads: Reads) -> None:
    """Write out/checkpoint.pt; `rng` holds every rank's `rng_state()`, in rank order."""
    state = {
        "config": config, "world": world, "store": reads.store, "left_out": reads.left_out, "step": st.step,
        "epoch": st.epoch, "batch": st.batch_no, "rows": st.rows_seen, "model": tr.model.state_dict(),
        "optimizer": tr.opt.state_dict(), "scheduler": tr.sched.state_dict(),
        "plateau": tr.plateau.state_dict() if tr.plateau else None, "scaler": tr.scaler.state_dict(),
        "early": asdict(st.early), "rng": rng,
        "window": torch.stack(st.window).cpu() if st.window else None, "tokens": list(st.tokens),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    # Written by Python (torch's zip writer reports a full disk as an opaque RuntimeError); atomic, so
    # a kill or a full disk never leaves a half-written checkpoint.
    fs.atomic_write_bytes(fs.resolve(str(out)), buf.getvalue(), CHECKPOINT)


def _read(path: Path) -> dict[str, Any]:
    """torch.load restricted to tensors and plain containers; anything else is refused, never run."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise KdError("the checkpoint holds Python objects other than tensors; refusing to load it (loading "
                      "could run code)", str(path), "delete it (a run from someone else cannot be resumed), or "
                      "pass --overwrite") from e
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise KdError(f"the checkpoint cannot be read ({str(e).splitlines()[0][:120]}): truncated or not a kd "
                      "checkpoint", str(path), "delete it to start over, or pass --overwrite") from e
    if not isinstance(state, dict) or not {"config", "world", "model", "rng"} <= set(state):
        raise KdError("the checkpoint is not a kd training checkpoint", str(path), "delete it, or pass --overwrite")
    return state


def load(path: Path, config: dict[str, Any], resumable: tuple[str, ...], world: int, reads: Reads,
         defaults: dict[str, Any] | None = None, paths: tuple[str, ...] = (), out: Path | None = None
         ) -> dict[str, Any]:
    """The checkpoint at `path`, if it was made with these options (bar `resumable`), world size, store and rows
    left out (`rows_left_out`; an older kd's checkpoint recorded none: not compared); an option its config lacks is
    compared at its value in `defaults` (one kd added after the checkpoint was made), the options in `paths` as the
    files they name (`out`: the run's folder as given, where an old record's relative paths are read from; default
    the checkpoint's folder)."""
    state = _read(path)
    if state.get("store") != reads.store:
        raise KdError("the checkpoint was made on another store (the store at --shards was rebuilt or changed "
                      "since); resuming would continue the old run on new data", str(path),
                      "use a new --out, or pass --overwrite to start over on this store")
    if "left_out" in state and state["left_out"] != reads.left_out:
        raise KdError("the checkpoint was made leaving out other rows (the file --exclude-ids names holds other ids "
                      "than when the run started); resuming would continue the run on another row set", str(path),
                      "put the file's ids back as they were, use a new --out, or pass --overwrite to start over")
    saved = recorded_files((defaults or {}) | state["config"], paths, out or path.parent, path)
    named = named_files(config, paths)
    diff = [k for k in config if k not in resumable and saved.get(k) != named[k]]
    if diff or state["world"] != world:
        what = ", ".join(f"{k}: {saved.get(k)!r} -> {named[k]!r}" for k in diff) or \
            f"world size {state['world']} -> {world}"
        raise KdError(f"the checkpoint in the output folder was made with other options ({what})",
                      str(path), "repeat the original options, use a new --out, or pass --overwrite")
    return state


def restore(state: dict[str, Any], tr: Trainables, rank: int) -> TrainState:
    """Load every state_dict and this rank's RNG states; returns the loop position to continue from."""
    tr.model.load_state_dict(state["model"])
    tr.opt.load_state_dict(state["optimizer"])
    tr.sched.load_state_dict(state["scheduler"])
    if tr.plateau is not None:
        tr.plateau.load_state_dict(state["plateau"])
    tr.scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"][rank])
    device = next(tr.model.parameters()).device
    # (a checkpoint of an older kd holds no window: its resume logs as it did then)
    window = [] if state.get("window") is None else [w.to(device) for w in state["window"].unbind(0)]
    return TrainState(state["step"], state["epoch"], state["batch"], state["rows"], Early(**state["early"]), window,
                      [int(t) for t in state.get("tokens") or (0, 0)])
