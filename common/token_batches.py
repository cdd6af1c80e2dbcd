"""Token-budget batches for a forward pass over texts of mixed lengths: pure, numpy only (used by precompute's
teacher pass and by a student's `encode`, CPU and GPU alike).

- Rows are sorted by token length and grouped greedily while rows * longest length <= batch_tokens (and rows <=
  max_batch): padding waste stays small and every batch costs about the same. The longest rows' batch runs first
  (an out-of-memory shows up at once), the others in a fixed shuffled order (a steady rate for progress bars).
- The budget, when not given, depends on where the forward pass runs (`default_batch_tokens`): small on a CPU,
  where activations that stay in cache beat big matrix products, large on a GPU.
- `scatter_batches` runs the batches and writes each result back at its rows, so the output is in input order
  whatever the batching (`run_batches`: one output, no batch in flight); `run_sorted` is the whole loop (sort,
  cut, run, scatter). Every forward pass over rows of mixed lengths runs through them: the teacher pass
  (pipeline/teacher/batches), a student's `encode` (student/saved), the ONNX encoder (student/exporters/onnx_graph) and
  the fine-tuned models' predictions (common/finetune).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

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
    """Index arrays of batches cut from the rows sorted longest first, padded cost per batch <= batch_tokens; the
    batch of the longest rows runs first, the others in a fixed shuffled order (`_spread`)."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = int(lengths[order[start]])
        size = max(1, min(max_batch, batch_tokens // max(longest, 1)))
        batches.append(order[start : start + size])
        start += size
    return _spread(batches)


def _spread(batches: list[np.ndarray]) -> list[np.ndarray]:
    """The longest rows' batch first (an out-of-memory shows up at once, and the allocator's largest blocks are
    made first), then the others in an order shuffled with a fixed seed. Rows per second then hold about steady
    through a pass, so its bar's rate and ETA are right from its first minutes: run longest first, mpnet over news
    articles and their sentences did 1.8 rows/s for the first minutes of each shard (the articles) and tens later
    (the sentences), and said ETA 64 h. Each batch is the same rows either way, so the outputs are too."""
    if len(batches) <= 2:
        return batches
    rest = np.random.default_rng(0).permutation(len(batches) - 1) + 1
    return [batches[0], *(batches[i] for i in rest)]


def scatter_batches(rows: int, batches: list[np.ndarray],
                    launch: Callable[[np.ndarray], Callable[[], Mapping[str, np.ndarray]]], in_flight: int = 1,
                    on_batch: Callable[[np.ndarray], None] | None = None) -> dict[str, np.ndarray]:
    """float32 [rows, ...] per output name, in input order: `launch(idx)` starts batch `idx` and returns what fetches
    its outputs. Up to `in_flight` batches are started before the oldest is fetched (a GPU runs the next while the
    host scatters the last); `on_batch(idx)` follows each fetch."""
    out: dict[str, np.ndarray] = {}
    pending: deque = deque()

    def collect(idx: np.ndarray, fetch: Callable[[], Mapping[str, np.ndarray]]) -> None:
        for name, v in fetch().items():
            if name not in out:
                out[name] = np.empty((rows, *v.shape[1:]), dtype=np.float32)
            out[name][idx] = v
        if on_batch:
            on_batch(idx)

    for idx in batches:
        pending.append((idx, launch(idx)))
        if len(pending) >= in_flight:
            collect(*pending.popleft())
    while pending:
        collect(*pending.popleft())
    return out


def run_batches(rows: int, batches: list[np.ndarray], run: Callable[[np.ndarray], np.ndarray],
                width: int) -> np.ndarray:
    """float32 [rows, run's width]: `run(idx)` of each batch written at its rows (`width`: an empty result's)."""
    out = scatter_batches(rows, batches, lambda idx: lambda: {"": run(idx)})
    return out.get("", np.zeros((0, width), dtype=np.float32))


def run_sorted(lengths: np.ndarray, batch_tokens: int, run: Callable[[np.ndarray], np.ndarray], width: int,
               max_batch: int = 1024) -> np.ndarray:
    """float32 [len(lengths), run's width]: `run(idx)` over token-budget batches (`plan_batches`), in input order
    (`width`: an empty result's)."""
    return run_batches(len(lengths), plan_batches(lengths, batch_tokens, max_batch), run, width)
