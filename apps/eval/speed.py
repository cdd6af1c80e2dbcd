"""Speed and size of an encoder, measured the same way for teachers, students and baselines.

- Speed: sentences per second at batch size 1 and 256 on the same input texts, and the
  per-document latency (median milliseconds of one batch-1 call). Batches are formed here, so
  every model pays for its own tokenisation and nothing else.
- Size: parameters, with the input embedding table counted separately (as in SRA: the table is
  cheap to run, a lookup, but dominates small students' size), and megabytes on disk.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open

EncodeFn = Callable[[list[str]], np.ndarray]


def pick_threads(requested: int | None) -> int:
    """Torch intra-op threads: as requested, else torch's default unless the CPUs are already busy.

    When the 1-minute load average is at or above the core count, intra-op threads mostly wait on
    each other: on a shared 2-core machine one thread trained a BiLSTM student 7x faster than two,
    and encoded 45x faster at batch 1.
    """
    import torch

    if requested:
        return requested
    busy = hasattr(os, "getloadavg") and os.getloadavg()[0] >= (os.cpu_count() or 1)
    return 1 if busy else torch.get_num_threads()


@contextlib.contextmanager
def picked_threads(requested: int | None) -> Iterator[int]:
    """torch's threads at pick_threads(requested) inside, the caller's again after: the count is part of what a
    run's results depend on (a stage's key holds it: apps.distill.shared_stages), so a job must not leave it changed for
    the rest of the process (under load, an in-process `kd demo` once left it at 1, and a `kd distill` after it
    keyed its stages at 1 thread and found none of those a 2-thread run had trained to copy)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(pick_threads(requested))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class SpeedResult:
    sent_per_s_b1: float
    sent_per_s_b256: float
    latency_ms: float  # median of batch-1 calls
    n_b1: int
    n_b256: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def speed_texts(texts: Sequence[str], n_b1: int = 128, n_b256: int = 1024, big_batch: int = 256) -> int:
    """How many texts `measure_speed` encodes, warm-up calls included (a progress bar's total)."""
    one, many = min(n_b1, len(texts)), min(n_b256, len(texts))
    return min(one, 1) + min(many, big_batch) + one + many


def measure_speed(encode: EncodeFn, texts: Sequence[str], n_b1: int = 128, n_b256: int = 1024,
                  big_batch: int = 256, progress: Callable[[int], None] | None = None) -> SpeedResult:
    """Time `encode` on the first `n_b1` texts one at a time and the first `n_b256` in batches.

    - one warm-up call of each shape first (lazy init, allocator, thread pools);
    - wall-clock time with time.perf_counter; throughput = texts / total seconds;
    - `progress(n)` after every call, outside the timed spans (timing mpnet takes minutes on a CPU: not silent).
    """
    texts = list(texts)
    tick = progress or (lambda n: None)
    one, many = texts[: min(n_b1, len(texts))], texts[: min(n_b256, len(texts))]
    for warm in (one[:1], many[:big_batch]):
        encode(warm)
        tick(len(warm))
    per_call = []
    for t in one:
        start = time.perf_counter()
        encode([t])
        per_call.append(time.perf_counter() - start)
        tick(1)
    big = 0.0
    for i in range(0, len(many), big_batch):
        start = time.perf_counter()
        encode(many[i : i + big_batch])
        big += time.perf_counter() - start
        tick(len(many[i : i + big_batch]))
    return SpeedResult(
        sent_per_s_b1=len(one) / max(sum(per_call), 1e-9),
        sent_per_s_b256=len(many) / max(big, 1e-9),
        latency_ms=float(np.median(per_call)) * 1000.0,
        n_b1=len(one),
        n_b256=len(many),
    )


@dataclass(frozen=True)
class SizeResult:
    params: int  # all parameters, embedding table included
    embedding_params: int  # the input token embedding table alone
    disk_mb: float  # what inference needs on disk: weights, config, tokenizer (no checkpoints, logs)

    @property
    def non_embedding_params(self) -> int:
        return self.params - self.embedding_params

    def to_dict(self) -> dict[str, float]:
        d: dict[str, float] = asdict(self)
        d["non_embedding_params"] = self.non_embedding_params
        return d


def torch_param_counts(module: object) -> tuple[int, int]:
    """(all parameters, parameters of the token embedding table) of a torch module.

    The token table is the nn.Embedding with the most rows, so BERT's position and
    token-type tables count as ordinary parameters, as in SRA.
    """
    from torch import nn

    assert isinstance(module, nn.Module)
    total = sum(p.numel() for p in module.parameters())
    tables = [m for m in module.modules() if isinstance(m, nn.Embedding)]
    emb = max(tables, key=lambda m: m.num_embeddings).weight.numel() if tables else 0
    return int(total), int(emb)


def safetensors_param_counts(folder: str | Path) -> tuple[int, int]:
    """(all parameters, token-table parameters) from the *.safetensors headers of a folder.

    The token table is the 2-D tensor with "embed" in its name that has the most rows.
    """
    total, emb_rows, emb = 0, -1, 0
    for f in sorted(Path(folder).rglob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            for key in st.keys():
                shape = st.get_slice(key).get_shape()
                n = int(np.prod(shape)) if shape else 1
                total += n
                if "embed" in key and len(shape) == 2 and shape[0] > emb_rows:
                    emb_rows, emb = shape[0], n
    return total, emb


def disk_mb(paths: list[Path]) -> float:
    """Megabytes (10^6 bytes) of the given files and of every file under the given folders."""
    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    return sum(f.stat().st_size for f in files) / 1e6


def model_size(paths: list[Path], module: object | None = None) -> SizeResult | None:
    """Size of a model: parameters from its torch module when given, else from the safetensors
    among `paths`; megabytes of `paths` (what inference needs: weights, config, tokenizer)."""
    if module is not None:
        total, emb = torch_param_counts(module)
    else:
        folders = [p for p in paths if p.is_dir()]
        if not any(any(f.rglob("*.safetensors")) for f in folders):
            return None
        counts = [safetensors_param_counts(f) for f in folders]
        total, emb = sum(c[0] for c in counts), max((c[1] for c in counts), default=0)
    return SizeResult(total, emb, disk_mb(paths) if paths else float("nan"))
