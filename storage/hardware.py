"""What this machine's CPU can do, shared by precompute (teacher precision) and training (student autocast)."""

from __future__ import annotations

import os


def native_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AMX or AVX512-BF16): there oneDNN runs MiniLM in bf16
    about 2x faster than fp32 with cosine >= 0.9998 to fp32 (docs/results.md); elsewhere bf16 is emulated
    and slower. KD_CPU_BF16=0/1 overrides the detection."""
    forced = os.environ.get("KD_CPU_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags
