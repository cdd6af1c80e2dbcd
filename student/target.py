"""The embedding target: one teacher's stored vector, or several teachers' as one (issue 51).

A target is `TEACHER[.COLUMN][:WEIGHT]`, several joined by commas: `mpnet.sentence`, `mpnet:0.7,minilm:0.3`.
Several parts make one vector per row, built when the rows are read (student.data), never stored:

    target = concat_i( sqrt(w_i / sum w) * t_i / |t_i| )

Why this form and not one loss per teacher: the cosine of two such vectors is sum_i (w_i / sum w) cos_i, the
weighted mean of the teachers' cosines, which is the ensemble measured in issue 51 (mpnet 0.7 + MiniLM 0.3: STS-B
dev 88.40 against mpnet's 88.11); its squared distances are the weighted sum of the teachers' distances between
unit vectors. So every objective that reads a target (cosine, MSE, both relational forms) works on it unchanged,
and the student's own embedding is trained to be the ensemble's geometry, which is what is served. One loss per
teacher (`--objective cosine:0.3:target=minilm.sentence`, which kd has) trains a head per teacher instead and
leaves the served embedding's cosines untrained. The store keeps each teacher's own vectors, so new weights need
no new teacher pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kd.common.errors import InputError

# The pseudo-teacher whose batch keys ("ensemble.target", "_a"/"_b" per side in pair stores) hold the combined
# vector; no stored teacher may take the name.
ENSEMBLE = "ensemble"
COLUMN = "target"


@dataclass(frozen=True)
class Part:
    teacher: str
    column: str | None  # None: the teacher's default target
    weight: float

    @property
    def ref(self) -> str:
        """"teacher[.column]", as a single-teacher --target names it."""
        return self.teacher if self.column is None else f"{self.teacher}.{self.column}"


@dataclass(frozen=True)
class Target:
    parts: tuple[Part, ...]

    @property
    def combined(self) -> bool:
        return len(self.parts) > 1

    def shares(self) -> list[float]:
        """Each part's weight over their sum: what its squared norm is in the combined vector."""
        total = sum(p.weight for p in self.parts)
        return [p.weight / total for p in self.parts]

    def __str__(self) -> str:
        return ",".join(f"{p.ref}:{p.weight:g}" if self.combined else p.ref for p in self.parts)

    @classmethod
    def of(cls, teachers: list[str] | tuple[str, ...], column: str | None,
           weights: list[float] | tuple[float, ...] | None = None) -> Target:
        """The target of `teachers`' `column` at `weights` (None: one teacher, no weight): what `str()` of it
        passes to --target, the one place such a string is written."""
        ws = weights if weights is not None else (1.0,) * len(teachers)
        return cls(tuple(Part(t, column, float(w)) for t, w in zip(teachers, ws, strict=True)))


def column_key(teacher: str, column: str) -> str:
    """The batch key of a teacher's stored column, "mpnet.sentence": how batches, objectives and a saved student's
    config name it. Made here and read by `key_parts` only."""
    return f"{teacher}.{column}"


def key_parts(key: str) -> tuple[str, str]:
    """(teacher, column) of a batch key. A column has no '.', so the last one splits: a store whose teacher name
    holds one (kd refuses such names since; a store written before them still reads) is read right."""
    teacher, _, column = key.rpartition(".")
    return teacher, column


def parse_part(text: str, where: str = "--target", weight: float = 1.0) -> Part:
    """"mpnet" | "mpnet.sentence" -> Part: one teacher's output as a user names it (--target, an objective's
    `target=` option)."""
    teacher, _, column = text.strip().partition(".")
    if not teacher:
        raise InputError(f"the target {text!r} names no teacher", where,
                         "write TEACHER[.COLUMN][:WEIGHT], several joined by commas: mpnet:0.7,minilm:0.3")
    if teacher == ENSEMBLE:
        raise InputError(f"{ENSEMBLE!r} is kd's name for a combined target, not a teacher", where,
                         "name the stored teachers: mpnet:0.7,minilm:0.3")
    return Part(teacher, column or None, weight)


def parse_target(text: str | None, where: str = "--target") -> Target | None:
    """"mpnet.sentence" | "mpnet:0.7,minilm.sentence:0.3" -> Target (None: no target given)."""
    if text is None:
        return None
    parts = []
    for item in text.split(","):
        ref, sep, weight = item.strip().partition(":")
        if not ref.strip():
            raise InputError(f"the target {text!r} has an empty part", where,
                             "write TEACHER[.COLUMN][:WEIGHT], several joined by commas: mpnet:0.7,minilm:0.3")
        parts.append(parse_part(ref, where, _weight(weight, sep, item, where)))
    refs = [p.ref for p in parts]
    if len(set(refs)) < len(refs):
        raise InputError(f"the target {text!r} names a teacher output twice", where, "name each once, with its weight")
    if not sum(p.weight for p in parts) > 0:
        raise InputError(f"the weights of {text!r} sum to {sum(p.weight for p in parts):g}", where,
                         "give at least one teacher a positive weight, e.g. mpnet:0.7,minilm:0.3")
    # a teacher at weight 0 adds nothing but zero columns to the target (and the student's width): it is left out
    return Target(tuple(p for p in parts if p.weight > 0))


def _weight(text: str, given: str, item: str, where: str) -> float:
    if not given:
        return 1.0
    try:
        w = float(text)
    except ValueError:
        raise InputError(f"the weight {text!r} of {item.strip()!r} is not a number", where,
                         "write TEACHER:WEIGHT, e.g. mpnet:0.7") from None
    if not math.isfinite(w) or w < 0:
        raise InputError(f"the weight {text!r} of {item.strip()!r} is negative or not finite", where,
                         "use a finite weight >= 0")
    return w


def combine(vectors: list[np.ndarray], shares: list[float]) -> np.ndarray:
    """[rows, sum of widths] float32: each teacher's rows at unit length, scaled by sqrt(share), side by side."""
    out = []
    for v, share in zip(vectors, shares):
        v = np.asarray(v, dtype=np.float32)
        norm = np.linalg.norm(v, axis=1, keepdims=True)
        out.append(v * (math.sqrt(share) / np.maximum(norm, 1e-12)))
    return np.concatenate(out, axis=1).astype(np.float32, copy=False)
