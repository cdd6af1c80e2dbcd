"""One table of the numeric ranges and the choices of every option, shared by the CLI and the library configs.

- the CLI bounds each number where it declares it (cli._in: typer's min/max, a callback for an open end) and
  annotates each enum-like option with one of the Literal types below, so a bad value exits 2 at parse time
  naming the option (and listing the choices);
- the library configs call `check(where, (flag, value, RANGE), ...)`, so Python callers get the same bounds as a
  KdError and the two never drift;
- upper bounds cap the values that size an allocation (batches, rows, widths, k) far above any real use, so a
  typo such as 10**12 is refused instead of allocating.

Only the standard library is imported here: `kd --help` reads this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, get_args

from kd.common.errors import InputError


@dataclass(frozen=True)
class Range:
    """A closed (or half-open) interval of allowed values; None: unbounded on that side."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    what: str = ""  # what the value is, for the message

    def __contains__(self, v: float) -> bool:
        low = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
        return low and (self.hi is None or (v < self.hi if self.hi_open else v <= self.hi))

    def __str__(self) -> str:
        lo = "-inf" if self.lo is None else f"{self.lo:g}"
        hi = "inf" if self.hi is None else f"{self.hi:g}"
        return f"{'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"


def check(where: str, *values: tuple[str, float | None, Range]) -> None:
    """Raise InputError for the first (flag, value, range) whose value (when not None) is outside its range."""
    for flag, value, allowed in values:
        if value is not None and value not in allowed:
            what = f" ({allowed.what})" if allowed.what else ""
            raise InputError(f"{flag} {value} must be in {allowed}{what}", where, f"pass {flag} in {allowed}")


# Sizes: values that size an allocation or a loop; 0 never means "default".
BATCH = Range(1, 65_536)  # texts per batch
BATCH_TOKENS = Range(1, 1 << 24)  # padded tokens per teacher batch
TOKENS = Range(1, 65_536)  # tokens per text (--max-length)
TEACHER_TOKENS = Range(8, 65_536)  # a fine-tuned teacher needs room for [CLS] a [SEP] b [SEP]
ROWS = Range(1, 10_000_000)  # rows held in memory at once (shards, shuffle buffer, eval rows)
AGREEMENT_ROWS = Range(2, 10_000_000)  # neighbours need a second text
EXACT_ROWS = Range(1, 100_000)  # exact clustering holds an n x n distance matrix
WIDTH = Range(1, 16_384)  # embedding / hidden / output widths
LAYERS = Range(1, 128)
K = Range(1, 10_000)  # neighbours or results per query
EPOCHS = Range(1, 100_000)
STEPS = Range(1, 1_000_000_000)  # --max-steps, --eval-every, --checkpoint-every, --log-every
SHARDS = Range(1, 65_536)  # writers splitting one store
SHARD_INDEX = Range(0, 65_535)  # 0-based, < --num-shards
THREADS = Range(1, 4096)
RAY_WORKERS = Range(1, 4096)
LOADER_WORKERS = Range(0, 256)  # 0: read in the training process

# Rates and fractions.
SEED = Range(0, 2**32 - 1)  # numpy's seed range
LR = Range(0, 10, lo_open=True)
STUDENT_LR = Range(0, 10)  # train-student: 0 keeps the weights as initialised (a no-training baseline)
WEIGHT_DECAY = Range(0, 1)
DROPOUT = Range(0, 1, hi_open=True)
WARMUP = Range(0, 1_000_000_000)  # < 1: a fraction of the steps; >= 1: steps; 0: none
CLIP = Range(0, 10_000)  # 0: off
PATIENCE = Range(0, 1_000_000)  # 0: never stop early
PERCENT = Range(0, 100, hi_open=True)  # 0: no held-out rows
UNIT = Range(0, 1)
SAMPLE = Range(0, 1, lo_open=True, what="the fraction of rows kept")
GPU_SHARE = Range(0, 1, lo_open=True, what="a worker runs its teacher on one GPU; 0.5: two workers per GPU")
LOSS_WEIGHT = Range(0, 10_000)  # 0: the term is off
COSINE_DISTANCE = Range(0, 2, lo_open=True, what="a cosine distance: 1 - cosine similarity")

# Choices of the enum-like options, as the Literal types the CLI annotates its options with (typer turns a
# Literal into a choice: a bad value exits 2 listing the allowed ones). The library enums live in modules that
# import torch, which `kd --help` must not; tests/student/test_options.py checks each Literal against its enum.
Segment = Literal["none", "sentences", "sentences+documents"]
SEGMENT_HELP = ("none (each text as it is) | sentences (spaCy) | sentences+documents (the sentences and each whole "
                "document: students then learn documents too)")
VectorDType = Literal["float32", "float16", "int8"]  # storage.schema.VectorDType
Precision = Literal["auto", "fp32", "bf16", "fp16"]  # pipeline.teacher.model.Precision
Backend = Literal["auto", "torch", "onnx", "openvino"]  # pipeline.backends.runtime.Backend
Quantize = Literal["none", "int8"]  # pipeline.backends.runtime.Quantize
Engine = Literal["local", "ray"]
Arch = Literal["bilstm", "bigru", "cnn", "ffn", "transformer", "static", "transformer-init"]  # student.models.Arch
Pooling = Literal["mean", "max", "attentive", "cls"]  # student.pooling.Pooling
Schedule = Literal["cosine", "plateau", "constant"]  # student.train_config.Schedule
EmbeddingInit = Literal["auto", "teacher", "vocab", "random"]  # student.train_config.EmbeddingInit
HeadInit = Literal["auto", "lstsq", "random"]  # student.train_config.HeadInit
TokenWeights = Literal["sif", "none"]
ExportFormat = Literal["sentence-transformers", "onnx"]
StsSplit = Literal["train", "dev", "test"]
ClusterSet = Literal["news-articles", "brown-genres", "brown-documents"]  # apps.eval.tasks.ClusterSet
QueryFormat = Literal["table", "csv", "json", "parquet"]  # dataset.query.Format
IndexKind = Literal["flat", "ivf", "hnsw"]  # dataset.index.IndexKind
ClusterMethod = Literal["auto", "exact", "knn"]  # dataset.cluster.Method
Task = Literal["classification", "pair-classification", "pair-regression"]  # common.tasks.Task
# apps.eval.run.Measure; an Enum because typer takes no list of Literals (kd eval --task is repeatable)
Measure = Enum("Measure", {m: m for m in ("sts", "probe", "cluster", "agreement", "neighbours", "speed", "mrpc",
                                          "lee", "retrieval", "documents", "suite")}, type=str)

# --device: these names, or cuda:N
DEVICES = ("auto", "cpu", "cuda", "cuda:N")
DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def choices(kind: Any) -> tuple[str, ...]:
    """The allowed values of a Literal (or str Enum) above."""
    return tuple(m.value for m in kind) if isinstance(kind, type) and issubclass(kind, Enum) else get_args(kind)


def check_choice(flag: str, value: str, kind: Any, what: str) -> None:
    """Refuse a value outside a Literal's (or str Enum's) choices, naming them: for callers typer does not parse
    for (the Python API), before any file is looked for."""
    if value not in choices(kind):
        raise InputError(f"unknown {what} {value!r}", flag, f"use one of {', '.join(choices(kind))}")
