"""pick_device: torchrun ranks on one node each take their own GPU; impossible devices are clear errors.

CUDA is simulated (torch.cuda.is_available / device_count monkeypatched): no GPU is needed.
"""

from __future__ import annotations

import pytest
import torch

from kd.common.errors import KdError
from kd.pipeline.teacher import pick_device


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
        seen.append(str(pick_device("cuda")))  # a plain "cuda" follows LOCAL_RANK too
    assert seen == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]


def test_an_explicit_gpu_index_wins_over_local_rank(gpus):
    gpus.setenv("LOCAL_RANK", "1")
    assert str(pick_device("cuda:0")) == "cuda:0" and str(pick_device("cpu")) == "cpu"


def test_without_local_rank_the_first_gpu(gpus):
    gpus.delenv("LOCAL_RANK", raising=False)
    assert str(pick_device(None)) == "cuda:0"


def test_impossible_devices_are_clear_errors(gpus):
    with pytest.raises(KdError, match="not available"):
        pick_device("cuda:5")
    with pytest.raises(KdError, match="unknown --device"):
        pick_device("gpu0")


def test_no_cuda_falls_back_to_cpu_unless_cuda_is_asked_for(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert str(pick_device(None)) == "cpu"
    with pytest.raises(KdError, match="no CUDA device") as e:
        pick_device("cuda")
    assert "--device cpu" in str(e.value)
