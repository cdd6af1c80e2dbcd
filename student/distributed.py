"""Data-parallel plumbing for the trainer under torchrun: which rank and device this process is, and the
few collectives the loop needs.

- torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; without them this is one process (world 1) and every
  collective below is a no-op, so the single-process path never touches torch.distributed;
- gloo on CPU, nccl on CUDA (one GPU per local rank);
- the values exchanged are tiny (RNG states, two floats), so object collectives and CPU tensors are fine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


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
    if device.startswith("cuda") and not torch.cuda.is_available():
        from storage.errors import KdError

        raise KdError(f"--device {device} was asked for, but this machine has no CUDA device", "--device",
                      "use --device cpu, or --device auto")
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


def shutdown(d: Dist) -> None:
    """Destroy the process group (if this process made one); safe after a failure."""
    if d.world > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def wrap(model: nn.Module, d: Dist) -> nn.Module:
    """The model for the training forward: itself, or under DDP its DistributedDataParallel wrapper."""
    if d.world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    # broadcast_buffers (default): every rank starts each step with rank 0's buffers (memory banks),
    # so the checkpoint, written by rank 0, restores all ranks exactly. Every student and objective
    # parameter takes part in every loss, so no search for unused parameters is needed.
    return DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def barrier(d: Dist) -> None:
    if d.world > 1:
        import torch.distributed as dist

        dist.barrier()


def gather(obj: Any, d: Dist) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if d.world == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def all_sum(values: list[float], d: Dist) -> list[float]:
    """Element-wise sum over ranks."""
    if d.world == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)  # gloo and nccl (values are tiny; CPU tensors are fine for gloo)
    return t.tolist()
