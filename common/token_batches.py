"""Token-budget batches for a forward pass over texts of mixed lengths: pure, numpy only (used by precompute's
teacher pass and by a student's `encode`, CPU and GPU alike).

- Rows are sorted by token length (longest first, so an out-of-memory shows up on the first batch) and grouped
  greedily while rows * longest length <= batch_tokens (and rows <= max_batch): padding waste stays small and
  every batch costs about the same.
- The budget, when not given, depends on where the forward pass runs (`default_batch_tokens`): small on a CPU,
  where activations that stay in cache beat big matrix products, large on a GPU.
"""

from __future__ import annotations

import numpy as np

# Token budgets when --batch-tokens is not given. CPU: every elementwise op of the forward pass (GELU,
# LayerNorm, residual adds, softmax) streams the whole batch's activations, which stay in L2/L3 at a few
# thousand tokens and spill to DRAM at 16k (`python -m bench.batch_tokens`, docs/results.md: 4096 runs
# MiniLM ~1.2x faster than 16384 on 2 cores). GPU: large batches keep the device busy; on an H200 (mpnet shape)
# 65,536 and 262,144 were no faster than 16,384 at up to 9x its memory (bench/gpu_batch_tokens.sh).
CPU_BATCH_TOKENS = 4096
GPU_BATCH_TOKENS = 16384


def default_batch_tokens(device_type: str) -> int:
    """The token budget per batch for a forward pass on `device_type` ("cpu", "cuda", ...)."""
    return CPU_BATCH_TOKENS if device_type == "cpu" else GPU_BATCH_TOKENS


def plan_batches(lengths: np.ndarray, batch_tokens: int, max_batch: int = 1024) -> list[np.ndarray]:
    """Index arrays of batches: longest rows first, padded cost per batch <= batch_tokens."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = int(lengths[order[start]])
        size = max(1, min(max_batch, batch_tokens // max(longest, 1)))
        batches.append(order[start : start + size])
        start += size
    return batches
