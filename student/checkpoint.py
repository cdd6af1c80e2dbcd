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
  may differ): resuming it would silently train some other model.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from storage.errors import KdError

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


@dataclass
class Trainables:
    """Everything with a state_dict that a checkpoint restores."""

    model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    plateau: torch.optim.lr_scheduler.ReduceLROnPlateau | None
    scaler: torch.amp.GradScaler


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


def save(out: Path, config: dict[str, Any], world: int, st: TrainState, tr: Trainables, rng: list[dict]) -> None:
    """Write out/checkpoint.pt; `rng` holds every rank's `rng_state()`, in rank order."""
    state = {
        "config": config, "world": world, "step": st.step, "epoch": st.epoch, "batch": st.batch_no,
        "rows": st.rows_seen, "model": tr.model.state_dict(), "optimizer": tr.opt.state_dict(),
        "scheduler": tr.sched.state_dict(), "plateau": tr.plateau.state_dict() if tr.plateau else None,
        "scaler": tr.scaler.state_dict(), "early": asdict(st.early), "rng": rng,
    }
    tmp = out / (CHECKPOINT + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, out / CHECKPOINT)  # a kill never leaves a half-written checkpoint


def load(path: Path, config: dict[str, Any], resumable: tuple[str, ...], world: int) -> dict[str, Any]:
    """The checkpoint at `path`, if it was made with these options (bar `resumable`) and world size."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    saved = state["config"]
    diff = [k for k in config if k not in resumable and saved.get(k) != config[k]]
    if diff or state["world"] != world:
        what = ", ".join(f"{k}: {saved.get(k)!r} -> {config[k]!r}" for k in diff) or \
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
    return TrainState(state["step"], state["epoch"], state["batch"], state["rows"], Early(**state["early"]))
