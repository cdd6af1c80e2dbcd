"""What this machine can do (CPU features, the --device asked for), shared by precompute and training."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from kd.common.bounds import DEVICE
from kd.common.errors import InputError

if TYPE_CHECKING:
    import torch


def native_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AMX or AVX512-BF16): there oneDNN runs MiniLM in bf16
    about 2x faster than fp32 with cosine >= 0.9998 to fp32 (docs/results.md); elsewhere bf16 is emulated
    and slower. KD_CPU_BF16=0/1 overrides the detection."""
    return _cpu_has("KD_CPU_BF16", ("amx_bf16", "avx512_bf16"))


def native_int8() -> bool:
    """True when the CPU has int8 dot products (AVX512-VNNI, AVX-VNNI or AMX-INT8): there int8 x int8 matmuls
    run ~4x fp32's rate and a fully int8 (static) teacher graph is ~2.7x the fp32 one; without them int8
    widens to int16 and only int8 weights (less memory traffic) pay (docs/design.md). KD_CPU_INT8=0/1
    overrides the detection."""
    return _cpu_has("KD_CPU_INT8", ("avx512_vnni", "avx_vnni", "amx_int8"))


def cpu_signature() -> str:
    """What identifies this CPU for a cached measurement (pipeline/backends/fidelity_cache.py): a hash of the machine
    type, the model name and the sorted feature flags of /proc/cpuinfo, and the KD_CPU_* overrides; another
    CPU model, flag set or override gives another signature (numerics of oneDNN/OpenVINO kernels follow them)."""
    import hashlib
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().split("\n\n")[0].splitlines()  # the first processor's block
    except OSError:
        lines = [platform.processor()]
    info = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    parts = [platform.machine(), info.get("model name", ""), " ".join(sorted(info.get("flags", "").split())),
             os.environ.get("KD_CPU_BF16", ""), os.environ.get("KD_CPU_INT8", "")]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _cpu_has(override: str, flags: tuple[str, ...]) -> bool:
    """Any of `flags` in /proc/cpuinfo (False where it cannot be read), unless `override` is set to 0 or 1."""
    forced = os.environ.get(override)
    if forced in ("0", "1"):
        return forced == "1"
    try:
        with open("/proc/cpuinfo") as f:
            found = set(f.read().split())
    except OSError:
        return False
    return any(flag in found for flag in flags)


def available_memory() -> int | None:
    """Bytes of host memory a new allocation can take without swapping: MemAvailable of /proc/meminfo (which
    counts reclaimable page cache, unlike MemFree), or less where this process's cgroup (a container) is
    limited, since the kernel kills at that limit; None where neither can be read (not Linux)."""
    found = [n for n in (_meminfo_available(), _cgroup_headroom()) if n is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    """memory.max - memory.current of the cgroup v2 root this process sees; None without a limit."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return max(0, int(limit) - used) if limit.isdigit() else None


def gpu_free_memory(device: str | None) -> int | None:
    """Free bytes on the CUDA device `device` resolves to (torch's view: other processes' use subtracted);
    None off CUDA."""
    import torch

    d = resolve_device(device)
    return torch.cuda.mem_get_info(d)[0] if d.type == "cuda" else None


# Linux device nodes without which neither CUDA (nvidia), WSL's GPU (dxg) nor ROCm (kfd) can be present
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")


def device_kind(device: str | None) -> str:
    """`cpu` or `cuda`: where `resolve_device(device)` runs, without importing torch (~1 s of a small job's start)
    where the answer cannot be CUDA: --device cpu, or no device given on a Linux machine with no GPU device node."""
    unset = device in (None, "auto")
    if device == "cpu" or (unset and sys.platform == "linux" and not any(map(os.path.exists, GPU_DEVICE_NODES))):
        return "cpu"
    return resolve_device(device).type


def default_threads() -> int:
    """The intra-op thread count torch uses, without importing it: torch's own when it is loaded, else
    OMP_NUM_THREADS, else the CPUs this process may run on (what torch picks on Linux: 2, and 1 under taskset -c 1)."""
    if "torch" in sys.modules:
        return sys.modules["torch"].get_num_threads()
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The one place a --device becomes a torch.device (teacher, training, fine-tuning, embedding, loading).

    - checked first (`check_device`): an unknown or unavailable device is an InputError naming the fix;
    - None, auto and cuda: CUDA when present, else the CPU (a plain `cuda` without CUDA was refused above).
      Under torchrun each rank takes its own GPU, cuda:LOCAL_RANK modulo the visible devices, so N ranks
      on one node never share GPU 0;
    - cpu and cuda:N as given; a torch.device is taken as it is.
    torch is imported here, not at module import: `kd --help` imports this module.
    """
    import torch

    if isinstance(device, torch.device):
        return device
    check_device(device)
    if device not in (None, "auto", "cuda"):
        return torch.device(device)
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", 0))
    return torch.device(f"cuda:{local % max(1, torch.cuda.device_count())}")


def check_device(device: str | None) -> None:
    """Refuse a --device this machine cannot run, before anything is read or written.

    - None, auto and cpu always pass (auto and None fall back to the CPU);
    - anything but cpu, cuda or cuda:N is unknown;
    - cuda needs a CUDA device, cuda:N the N-th visible one (torch imported only then).
    """
    if device in (None, "auto", "cpu"):
        return
    if not DEVICE.fullmatch(device):
        raise InputError(f"unknown --device {device!r}", "--device", "use cpu, cuda or cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise InputError(f"--device {device} was asked for, but this machine has no CUDA device", "--device",
                         "use --device cpu (or leave --device unset)")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise InputError(f"--device {device} is not available: this machine has {torch.cuda.device_count()} CUDA "
                         "device(s)", "--device", "use cpu or a visible GPU, e.g. cuda:0")
