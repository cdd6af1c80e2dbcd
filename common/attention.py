"""The attention kernels a forward pass over token-budget batches runs on a GPU.

- PyTorch on an H100 (2.11) sends a masked `scaled_dot_product_attention` call to cuDNN's attention, which
  builds an execution plan for each new (batch, length) shape. Token-budget batches are nearly all new shapes,
  so a teacher pass paid that build on most batches: a MiniLM-shaped teacher's forward over 40,000 texts ran
  8,513 rows/s the first time its batch shapes were seen and 47,000-62,000 once cuDNN had them cached; with
  cuDNN left out, 55,648 rows/s on first sight (`bench/gpu_attention.py`, docs/results.md).
- So inference over such batches leaves cuDNN out (flash, memory-efficient and math kernels stay, in PyTorch's
  own order of preference); on other devices the context changes nothing.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager


def varying_shape_attention(device_type: str) -> AbstractContextManager:
    """A context for forward passes whose batch shapes vary (token-budget batches) on `device_type`."""
    if device_type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
