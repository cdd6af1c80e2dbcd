"""Stage two: train small student encoders from a store's precomputed teacher outputs.

Never imports `pipeline` or any transformers model class: a student trains from Parquet shards alone.

    from kd import student
    model = student.load("runs/bilstm")       # a folder written by `kd train-student`
    vectors = model.encode(["a sentence", "another one"])
    st_model = student.load_exported("runs/bilstm-st")  # a `kd export --format sentence-transformers`
                                                        # folder, without trust_remote_code (student.st_load)

The names below load on first use (PEP 562): `kd --help` reads `kd.student.train_config`'s fields, which must not
pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"LoadedStudent": "kd.student.saved", "load": "kd.student.saved", "load_exported": "kd.student.st_load"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kd.student' has no attribute {name!r}")
