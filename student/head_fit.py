"""Start a student's linear head at the least-squares map from its own pooled vectors to the target.

Why: a transformer-init student with a wider target (MiniLM's 384-d layers, mpnet's 768-d `sentence`)
has a random head. At a BERT fine-tuning rate the body follows the random head's gradients first and
loses the teacher's sentence structure before the head has learned anything (measured: STS-B 82.0 ->
76.6 after 0.7 epoch). A closed-form start costs seconds and begins where a linear map of the start
model's own vectors already is (validation 1-cos 0.294 MiniLM -> mpnet, against 0.310 reached by
training a random head for 0.7 epoch).

- run the untrained student (eval mode, no grad) over the first `rows` training rows: pooled vectors X;
- the target rows Y: the objective's stored vectors, as stored (`sentence` vectors are unit length);
- ridge regression with an intercept when the head has a bias: centre X and Y, solve
  (XᵀX + λ·tr(XᵀX)/d·I) W = XᵀY in float64 (scipy), bias = ȳ - x̄W; λ is relative, so the same value
  suits any width or scale;
- copy W (and the bias) into the head. Heads that are not one `nn.Linear` (SRA's linear + tanh) or that
  map to another width than the target's are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kd.common.errors import InputError, KdError
from kd.student.models import Student
from kd.student.train_config import HeadInit

# the archs whose fresh students start from the teacher's own vectors (kept layers, the vocab output), so that a
# least-squares map of their pooled vectors is already close to the target (see student/static.py for static)
FITTED_ARCHS = ("transformer-init", "static")


@dataclass(frozen=True)
class HeadFit:
    """What the fit used and how well the map fits (1 - cosine on the rows it was fitted on)."""

    rows: int
    before: float  # mean 1 - cos(head(x), y) with the random head
    after: float  # the same with the fitted head


def wants_fit(mode: HeadInit, student: Student, from_student: bool, has_target: bool, own_width: bool = False
              ) -> bool:
    """Whether to fit the head: `auto` for a fresh student of FITTED_ARCHS (`from_student` False: not --init, or
    --init shrunk by --init-layers) with one linear head onto an embedding target, unless --out-dim chose another
    width (`own_width`); `lstsq` wherever that head exists (refused where it does not)."""
    linear = isinstance(student.head, nn.Linear)
    if mode is HeadInit.auto:
        return linear and has_target and not from_student and not own_width \
            and student.config.arch.value in FITTED_ARCHS
    if mode is HeadInit.lstsq and not (linear and has_target):
        why = "no embedding target" if not has_target else "its head is not one linear layer onto a wider target"
        raise InputError(f"--head-init lstsq cannot fit this student's head ({why})", "--head-init",
                         "use --head-init random, or a student whose width differs from the target's")
    return mode is HeadInit.lstsq


@torch.no_grad()
def fit_head(student: Student, batches: Iterable[dict], target_key: str, rows: int = 8192,
             ridge: float = 1e-3) -> HeadFit:
    """Fit `student.head` (an nn.Linear) by ridge least squares on up to `rows` rows of `batches`."""
    xs, ys = _collect(student, batches, target_key, rows)
    x, y = np.concatenate(xs).astype(np.float64), np.concatenate(ys).astype(np.float64)
    head = student.head
    before = _one_minus_cos(x, y, head.weight.double().cpu().numpy().T, _bias(head))
    w, b = _ridge(x, y, ridge, head.bias is not None)
    head.weight.copy_(torch.as_tensor(w.T, dtype=head.weight.dtype))
    if head.bias is not None:
        head.bias.copy_(torch.as_tensor(b, dtype=head.bias.dtype))
    return HeadFit(len(x), before, _one_minus_cos(x, y, w, b))


def _collect(student: Student, batches: Iterable[dict], key: str, rows: int) -> tuple[list, list]:
    """Pooled vectors and target rows of the first `rows` rows (pair stores: side a's)."""
    device = next(student.parameters()).device
    was_training = student.training
    student.eval()
    xs, ys, n = [], [], 0
    for batch in batches:
        if not ys and batch[key].shape[1] != student.head.out_features:  # refused before any forward pass
            raise InputError(f"the head maps to {student.head.out_features} dims, the target {key} has "
                             f"{batch[key].shape[1]}", "--head-init lstsq", "drop --out-dim, or use --head-init random")
        side = "" if "input_ids" in batch else "a."
        x = student.pooled(batch[side + "input_ids"].to(device), batch[side + "attention_mask"].to(device))
        xs.append(x.float().cpu().numpy())
        ys.append(np.asarray(batch[key], dtype=np.float32))
        n += len(x)
        if n >= rows:
            break
    student.train(was_training)
    if not xs:
        raise KdError("no training rows to fit the head on", "--head-init lstsq", "use --head-init random")
    return xs, ys


def _ridge(x: np.ndarray, y: np.ndarray, ridge: float, intercept: bool) -> tuple[np.ndarray, np.ndarray]:
    from scipy.linalg import solve

    mx, my = (x.mean(0), y.mean(0)) if intercept else (np.zeros(x.shape[1]), np.zeros(y.shape[1]))
    xc, yc = x - mx, y - my
    gram = xc.T @ xc
    gram[np.diag_indices_from(gram)] += ridge * np.trace(gram) / len(gram)
    w = solve(gram, xc.T @ yc, assume_a="pos")
    return w, my - mx @ w


def _bias(head: nn.Linear) -> np.ndarray:
    return np.zeros(head.out_features) if head.bias is None else head.bias.double().cpu().numpy()


def _one_minus_cos(x: np.ndarray, y: np.ndarray, w: np.ndarray, b: np.ndarray) -> float:
    p = x @ w + b
    cos = (p * y).sum(1) / np.maximum(np.linalg.norm(p, axis=1) * np.linalg.norm(y, axis=1), 1e-12)
    return float(1.0 - cos.mean())
