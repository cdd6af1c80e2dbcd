"""int8 vector columns: symmetric per-vector quantisation with a float32 scale column beside each.

- Write (`quantize`): for every innermost vector x (a row of a 1-d column, each layer of `layers`),
  s = max|x| / 127 and q = clip(round(x / s), -127, 127) as int8; a zero vector gets s = 0 and q = 0.
  The error per element is at most s / 2 (round to nearest), i.e. max|x| / 254.
- Layout: column `<name>` is `int8[dim]` (`int8[dim][L]` for per-layer states) and `<name>__scale`
  is float32 with the outer shape (`float` per row, `float[L]` for per-layer states).
- Read (`dequantize`): x = q * s, float32. The scale must be present, finite and >= 0, else the
  shard is refused (a missing or NaN scale would turn every target into NaN or garbage silently).
"""

from __future__ import annotations

import numpy as np

from kd.common.errors import StoreError

SCALE_SUFFIX = "__scale"
QMAX = 127  # symmetric: -128 is never written, so negating a vector never overflows
# The one fix for a damaged shard: --repair sets it aside and forgets it, so the rerun writes exactly it again
# (a deleted file alone would leave its record, and precompute would call the store complete).
DAMAGED = "run kd validate STORE --repair, then re-run the kd precompute command that wrote the store"


def scale_column(column: str) -> str:
    """Name of the float32 scale column stored beside int8 column `column`."""
    return column + SCALE_SUFFIX


def is_scale_column(column: str) -> bool:
    return column.endswith(SCALE_SUFFIX)


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, *shape) floats -> (int8 codes of the same shape, float32 scales of shape (rows, *shape[:-1]))."""
    x = np.asarray(x, dtype=np.float32)
    scale = np.abs(x).max(axis=-1) / np.float32(QMAX)
    safe = np.where(scale > 0, scale, np.float32(1))[..., None]  # s = 0: x is all zeros, so q = 0
    q = np.clip(np.rint(x / safe), -QMAX, QMAX).astype(np.int8)
    return q, scale.astype(np.float32)


def dequantize(q: np.ndarray, scale: np.ndarray | None, column: str, where: str | None) -> np.ndarray:
    """int8 codes times their per-vector scale, float32; refuses a missing, non-finite or negative scale."""
    if scale is None:
        raise StoreError(f"int8 column {column!r} has no scale column {scale_column(column)!r}", where,
                         DAMAGED)
    scale = np.asarray(scale, dtype=np.float32)
    if scale.shape != q.shape[:-1]:
        raise StoreError(f"scale column {scale_column(column)!r} has shape {scale.shape[1:]}, "
                         f"int8 column {column!r} needs {q.shape[1:-1]}", where,
                         DAMAGED)
    bad = ~np.isfinite(scale) | (scale < 0)
    if bad.any():
        row = int(np.nonzero(bad.reshape(len(bad), -1).any(axis=1))[0][0])
        raise StoreError(f"scale column {scale_column(column)!r} holds a non-finite or negative scale "
                         f"(first at row {row} of the shard)", where,
                         DAMAGED)
    return q.astype(np.float32) * scale[..., None]
