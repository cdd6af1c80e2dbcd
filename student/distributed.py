"""Data-parallel plumbing for the trainer under torchrun: which rank and device this process is, and the
few collectives the loop needs.

- torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; without them this is one process (world 1) and every
  collective below is a no-op, so the single-process path never touches torch.distributed;
- gloo on CPU, nccl on CUDA (one GPU per local rank: NCCL refuses two ranks on one GPU, so more local
  ranks than GPUs, or one --device cuda:N for every rank, is refused before the process group exists);
- the values exchanged are tiny (RNG states, two floats), so object collectives and CPU tensors are fine.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from kd.common.errors import InputError
from kd.common.hardware import resolve_device


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
    dev = resolve_device(device)
    if world > 1 and dev.type == "cuda":
        _check_one_gpu_per_rank(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1:
        if not dist.is_initialized():
            dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        return Dist(dist.get_rank(), dist.get_world_size(), dev)
    return Dist(0, 1, dev)


def _check_one_gpu_per_rank(device: str) -> None:
    """NCCL fails two ranks on one GPU only inside the first collective ("Duplicate GPU detected", seen on an
    H200 with 2 ranks); the rule and its fix are known before that. torchrun sets LOCAL_WORLD_SIZE; LOCAL_RANK
    bounds it from below where a launcher sets only that. Only where every rank sees the same GPUs (no
    CUDA_VISIBLE_DEVICES, torchrun's default): a launcher that sets it may give each rank a GPU of its own
    (Slurm's --gpus-per-task), which one rank cannot tell from a shared one, so NCCL's own check stays there."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return
    here = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", "0")) + 1)
    gpus = torch.cuda.device_count()
    if device not in (None, "auto", "cuda") and here > 1:
        raise InputError(f"--device {device} puts all {here} training ranks of this machine on one GPU, and NCCL "
                         "needs a GPU per rank", "--device",
                         "leave --device unset (rank N takes cuda:N), or --device cpu to train on the CPUs (gloo)")
    if here > gpus:
        raise InputError(f"{here} training ranks on this machine, which has {gpus} GPU(s): NCCL needs a GPU per "
                         "rank", "torchrun --nproc-per-node",
                         f"--nproc-per-node {gpus}, or --device cpu to train on the CPUs (gloo)")


def shutdown(d: Dist) -> None:
    """Destroy the process group (if this process made one); safe after a failure."""
    if d.world > 1:
        if dist.is_initialized():
            dist.destroy_process_group()


def wrap(model: nn.Module, d: Dist) -> nn.Module:
    """The model for the training forward: itself, or under DDP its DistributedDataParallel wrapper."""
    if d.world == 1:
        return model
    # No buffer broadcast: the only changing buffers are memory banks, which every rank updates from
    # the same gathered rows (`gather_rows`), so they stay equal and rank 0's checkpoint restores every
    # rank exactly; broadcasting a bank of all N rows each step would cost N x m floats per step, and
    # would overwrite the other ranks' updates if a bank were ever updated from one rank's rows only.
    # Every student and objective parameter takes part in every loss: no search for unused parameters.
    no_sync = ({"forward_sync_buffers": False}  # torch >= 2.13 name (still syncs once at init: banks start equal)
               if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
               else {"broadcast_buffers": False})
    return DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None, **no_sync)


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def gather(obj: Any, d: Dist) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if d.world == 1:
        return [obj]

    out: list[Any] = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def all_sum(values: list[float], d: Dist) -> list[float]:
    """Element-wise sum over ranks."""
    if d.world == 1:
        return values

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)  # gloo and nccl (values are tiny; CPU tensors are fine for gloo)
    return t.tolist()


def gather_rows(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's rows from every rank, concatenated in rank order (the tensors themselves outside DDP).

    - Ranks may hold different row counts (a last partial batch): the counts are exchanged first,
      every tensor is zero-padded to the largest, gathered with all_gather, and cut back.
    - No gradient flows through the result (it feeds memory-bank updates only).
    """
    if not tensors or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensors
    world, dev = dist.get_world_size(), tensors[0].device
    count = torch.tensor([tensors[0].shape[0]], dtype=torch.long, device=dev)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    sizes = [int(c) for c in counts]
    out = []
    for x in tensors:
        padded = x.new_zeros((max(sizes), *x.shape[1:]))
        padded[: x.shape[0]] = x.detach()
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        out.append(torch.cat([p[:n] for p, n in zip(parts, sizes)]))
    return out
