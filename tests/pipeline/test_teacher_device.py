"""resolve_device (kd.common.hardware, the one device helper): torchrun ranks on one node each take their own
GPU; impossible devices are clear errors.

CUDA is simulated (torch.cuda.is_available / device_count monkeypatched): no GPU is needed.
"""

from __future__ import annotations

import pytest
import torch

from kd.common.errors import KdError
from kd.common.hardware import resolve_device


@pytest.fixture
def gpus(monkeypatch):
    """A node with 2 visible GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    return monkeypatch


def test_torchrun_ranks_spread_over_the_node_gpus(gpus):
    gpus.setenv("WORLD_SIZE", "4")
    seen = []
    for local in range(4):
        gpus.setenv("RANK", str(local))
        gpus.setenv("LOCAL_RANK", str(local))
        seen.append(str(resolve_device("cuda")))  # a plain "cuda" follows LOCAL_RANK too
    assert seen == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]


def test_an_explicit_gpu_index_wins_over_local_rank(gpus):
    gpus.setenv("LOCAL_RANK", "1")
    assert str(resolve_device("cuda:0")) == "cuda:0" and str(resolve_device("cpu")) == "cpu"


def test_without_local_rank_the_first_gpu(gpus):
    gpus.delenv("LOCAL_RANK", raising=False)
    assert str(resolve_device(None)) == "cuda:0"


def test_impossible_devices_are_clear_errors(gpus):
    with pytest.raises(KdError, match="not available"):
        resolve_device("cuda:5")
    with pytest.raises(KdError, match="unknown --device"):
        resolve_device("gpu0")


def test_no_cuda_falls_back_to_cpu_unless_cuda_is_asked_for(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert str(resolve_device(None)) == "cpu"
    with pytest.raises(KdError, match="no CUDA device") as e:
        resolve_device("cuda")
    assert "--device cpu" in str(e.value)


def test_every_stage_turns_a_device_into_torch_through_the_one_helper(gpus):
    """Training ranks, loaded students and the device spec all agree: auto/cuda follow LOCAL_RANK."""
    from kd.student.distributed import init_dist

    gpus.setattr(torch.cuda, "set_device", lambda dev: None)
    gpus.setenv("LOCAL_RANK", "3")
    assert str(init_dist("auto").device) == "cuda:1" and str(init_dist("cpu").device) == "cpu"
    assert resolve_device(torch.device("cuda:0")) == torch.device("cuda:0")


def test_training_ranks_sharing_a_gpu_are_refused_before_nccl(gpus):
    """NCCL cannot put two ranks on one GPU (an H200 with 2 ranks failed inside the first barrier): init_dist
    says so, with the fix, before any process group exists."""
    from kd.student.distributed import _check_one_gpu_per_rank, init_dist

    gpus.setattr(torch.cuda, "set_device", lambda dev: None)
    gpus.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus.setenv("WORLD_SIZE", "3")
    gpus.setenv("LOCAL_WORLD_SIZE", "3")
    gpus.setenv("LOCAL_RANK", "0")
    with pytest.raises(KdError, match="3 training ranks on this machine, which has 2 GPU") as e:
        init_dist("auto")
    assert e.value.exit_code == 2 and "--nproc-per-node 2" in e.value.fix
    gpus.setenv("WORLD_SIZE", "2")
    gpus.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(KdError, match="--device cuda:1 puts all 2 training ranks") as e:
        init_dist("cuda:1")
    assert "leave --device unset" in e.value.fix
    gpus.delenv("LOCAL_WORLD_SIZE")
    gpus.setenv("LOCAL_RANK", "2")  # a launcher that sets LOCAL_RANK only: rank 2 needs a third GPU
    with pytest.raises(KdError, match="3 training ranks"):
        init_dist("cuda")
    # a launcher that binds GPUs per rank sets CUDA_VISIBLE_DEVICES: each rank may see a GPU of its own there
    gpus.setenv("CUDA_VISIBLE_DEVICES", "2")
    _check_one_gpu_per_rank("cuda")


def test_no_module_but_the_helper_decides_cuda_or_cpu():
    """`torch.cuda.is_available()` chooses a device in common/hardware.py only (checkpoint.py reads it to
    save and restore CUDA RNG states, which is no device choice)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = sorted(str(f.relative_to(root)) for pkg in ("common", "storage", "pipeline", "student", "dataset", "apps")
                   for f in (root / pkg).rglob("*.py") if "cuda.is_available()" in f.read_text(encoding="utf-8"))
    assert found == ["common/hardware.py", "student/checkpoint.py"]
