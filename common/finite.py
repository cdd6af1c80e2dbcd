"""Non-finite numbers (NaN, +-Inf): the checks every reader of labels and targets, every trainer and every
writer of weights or vectors shares.

One NaN in a label, a target or a weight spreads to every weight within a step or two; unchecked, a
trainer ends with an all-NaN model and exit 0, and every vector made with it is NaN. So:
- labels and targets are checked as they are read, before any step (`non_finite_rows`: one vectorised
  `isfinite` over the array, the rows named by the caller);
- the loss of every step is checked before its backward pass (`check_loss`);
- weights are checked before every save (`require_finite_weights`: one `isfinite().all()` per tensor),
  so what is on disk is always the last good state;
- a store's vectors are also held to `MAX_ABS` (`unusable_rows`) wherever they are read: a finite 3e38 passes
  `isfinite`, and then overflows the first norm or dot product (numpy warns and an index stores a zero vector).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from kd.common.errors import KdError


def non_finite_rows(values: np.ndarray) -> np.ndarray:
    """Indices (along the first axis) of the rows holding any NaN or Inf; none for non-float arrays."""
    a = np.asarray(values)
    if a.dtype.kind not in "fc" or a.size == 0:
        return np.zeros(0, dtype=np.int64)
    ok = np.isfinite(a).reshape(len(a), -1).all(1)
    return np.nonzero(~ok)[0]


# The largest |component| a stored vector may hold. Far above what an encoder pools (hidden states and logits stay
# within a few hundred; the "massive activations" of large decoders reach ~1e4), far below where float32 arithmetic
# breaks: a squared norm over 100,000 components of 1e6 is 1e17, against float32's 3.4e38. Anything past it is a
# damaged or forged value, not a measurement.
MAX_ABS = 1e6
OUT_OF_RANGE = f"non-finite (NaN/Inf) or out-of-range (|value| > {MAX_ABS:g}) values"  # what `unusable_rows` finds


def unusable_rows(values: np.ndarray) -> np.ndarray:
    """Indices (along the first axis) of the rows holding NaN, Inf or a component beyond +-MAX_ABS."""
    a = np.asarray(values)
    if a.dtype.kind not in "fc" or a.size == 0:
        return np.zeros(0, dtype=np.int64)
    with np.errstate(invalid="ignore"):
        ok = (np.abs(a) <= MAX_ABS).reshape(len(a), -1).all(1)  # NaN compares False: refused with the rest
    return np.nonzero(~ok)[0]


def first_non_finite(tensors: Mapping[str, Any]) -> str | None:
    """Name of the first floating-point torch tensor that holds a NaN or Inf, or None."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(t.isfinite().all()):
            return name
    return None


def require_finite_weights(tensors: Mapping[str, Any], where: str, fix: str) -> None:
    """Refuse to save weights holding NaN/Inf (a diverged run): nothing is written, the last save stays."""
    bad = first_non_finite(tensors)
    if bad is not None:
        raise KdError(f"the weights hold NaN/Inf values ({bad}); refusing to save them (the last saved files "
                      "are kept as they were)", where, fix)


def check_loss(loss: float, step: int, where: str, fix: str) -> None:
    """Stop before a non-finite loss is back-propagated: one such step makes every weight NaN."""
    if not math.isfinite(loss):
        raise KdError(f"the training loss is not finite ({loss}) at step {step}; training stopped before it "
                      "reached the weights", where, fix)
