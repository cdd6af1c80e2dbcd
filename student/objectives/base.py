"""What every objective shares: the `Objective` module, spec parsing, and the store context.

- An objective is an `nn.Module` that owns whatever it learns besides the student (projections,
  classifier heads, memory banks), so saving `nn.ModuleList(objectives).state_dict()` next to the
  student keeps everything needed to resume training.
- `forward(out, batch, progress)` returns the loss already multiplied by `weight`; `loss(...)` is the
  unweighted value. `out` is a `StudentOutput` for single-text stores, an `(a, b)` tuple for pair stores.
- `Context` answers, from the manifest alone, which store columns exist and how wide they are, so that
  a missing column is reported before any training step.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import Tensor, nn

from kd.common.errors import KdError
from kd.storage.int8 import is_scale_column
from kd.storage.manifest import Manifest, teacher_table
from kd.student.models import StudentConfig, StudentOutput
from kd.student.target import COLUMN, ENSEMBLE, Part, Target, column_key, key_parts, parse_target

Out = StudentOutput | tuple[StudentOutput, StudentOutput]
Batch = dict[str, Tensor]


class ObjectiveName(str, Enum):
    cosine = "cosine"
    mse = "mse"
    contrastive = "contrastive"
    logits = "logits"
    pair = "pair"
    multi_teacher = "multi-teacher"
    relational = "relational"
    label = "label"


class LabelKind(str, Enum):
    classes = "classes"  # int64 class index (string labels: the data loader maps them to indices)
    regression = "regression"  # float score


# --------------------------------------------------------------------------------------------------
# Specs: "name[:weight][:key=value]..."


@dataclass(frozen=True)
class ObjectiveSpec:
    name: ObjectiveName
    weight: float = 1.0
    options: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return ":".join([self.name.value, f"{self.weight:g}", *(f"{k}={v}" for k, v in self.options)])


def check_weight(weight: float, where: str) -> None:
    """A weight is a finite number >= 0: a NaN or Inf one makes the first loss non-finite, a negative one
    maximises its loss."""
    if not math.isfinite(weight) or weight < 0:
        what = "negative" if weight < 0 else "not finite"
        raise KdError(f"the weight {weight:g} is {what}", where, "use a finite weight >= 0, e.g. cosine:0.5")


def parse_objective(text: str) -> ObjectiveSpec:
    """"cosine", "cosine:0.5", "contrastive:0.1:tau=0.1:negatives=256" -> ObjectiveSpec."""
    name, *rest = text.strip().split(":")
    try:
        kind = ObjectiveName(name.strip())
    except ValueError:
        raise KdError(f"unknown objective {name!r}", f"objective spec {text!r}",
                      f"use one of {[n.value for n in ObjectiveName]}, optionally with :weight") from None
    weight = 1.0
    if rest and "=" not in rest[0]:
        try:
            weight = float(rest.pop(0))
        except ValueError:
            raise KdError("the weight is not a number", f"objective spec {text!r}", "write e.g. cosine:0.5") from None
        check_weight(weight, f"objective spec {text!r}")
    options = []
    for item in rest:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise KdError(f"option {item!r} is not key=value", f"objective spec {text!r}",
                          "write options as name:weight:key=value:key=value")
        options.append((key.strip(), value.strip()))
    return ObjectiveSpec(kind, weight, tuple(options))


# --------------------------------------------------------------------------------------------------
# The module


class Objective(nn.Module):
    """Base class; subclasses implement `loss` and a `build(ctx, weight, **options)` classmethod."""

    name: ObjectiveName

    def __init__(self, weight: float, columns: list[str]) -> None:
        super().__init__()
        self.weight = float(weight)
        self._columns = list(columns)
        self.spec = self.name.value  # set to the full spec string by build_objectives

    def columns(self) -> list[str]:
        """Store columns this objective reads, as "<teacher>.<column>" or "label"."""
        return list(self._columns)

    def loss(self, out: Out, batch: Batch, progress: float) -> Tensor:
        raise NotImplementedError

    def forward(self, out: Out, batch: Batch, progress: float = 0.0) -> Tensor:
        return self.weight * self.loss(out, batch, progress)

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}"


def sides(out: Out) -> tuple[StudentOutput, ...]:
    return tuple(out) if isinstance(out, tuple) else (out,)


def pair_features(u: Tensor, v: Tensor, product: bool = True) -> Tensor:
    """[u, v, u*v, |u-v|] (SRA, DSE) or, with product=False, [u, v, |u-v|] (SBERT, DvBERT)."""
    parts = [u, v, u * v, (u - v).abs()] if product else [u, v, (u - v).abs()]
    return torch.cat(parts, -1)


def head_input(out: Out, product: bool = True) -> Tensor:
    """What a classifier head sees: the embedding, or the pair features of both embeddings."""
    if isinstance(out, tuple):
        return pair_features(out[0].embedding, out[1].embedding, product)
    return out.embedding


def head_width(dim: int, pairs: bool, product: bool = True) -> int:
    return (4 if product else 3) * dim if pairs else dim


# --------------------------------------------------------------------------------------------------
# What the store holds


_VECTOR_COLUMNS = ("sentence", "mean", "cls", "layers", "logits")
_EMBEDDING_COLUMNS = ("sentence", "mean", "cls")


def type_shape(arrow_type: str) -> tuple[int, ...]:
    """Per-row shape of a vector column from its Arrow type string (the manifest's `columns`).

    "fixed_size_list<item: fixed_size_list<item: float>[384]>[7]" -> (7, 384): the innermost list is
    written first, so the sizes read right to left. Scalars give ().
    """
    return tuple(int(n) for n in reversed(re.findall(r"\[(\d+)\]", arrow_type)))


@dataclass
class Context:
    """The store's teachers, their vector columns and shapes, labels, and the user's target choice."""

    student: StudentConfig
    pairs: bool
    num_rows: int
    shapes: dict[str, dict[str, tuple[int, ...]]]  # teacher -> column -> per-row shape
    meta: dict[str, dict[str, Any]]
    label: LabelKind | None
    target_teacher: str | None = None
    target_column: str | None = None
    where: str = field(default="build_objectives")
    # a combined target (student.target): its batch key -> the part keys it is built from, with their shares
    ensemble: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)

    @classmethod
    def from_manifest(cls, manifest: Manifest, student: StudentConfig, target: str | None) -> Context:
        shapes, meta = {}, {}
        for name in manifest.teachers():
            rec = manifest.tables[teacher_table(name)]
            shapes[name] = {c: type_shape(t) for c, t in rec.columns.items()
                            if type_shape(t) and not is_scale_column(c)}  # a scale is part of its column
            meta[name] = dict(rec.meta)
        texts = manifest.tables.get("texts")
        label_type = texts.columns.get("label") if texts else None
        label = None
        if label_type is not None:
            label = LabelKind.regression if re.search(r"float|double", label_type) else LabelKind.classes
        ctx = cls(student, manifest.pairs, int(manifest.inputs.get("num_rows", 0)), shapes, meta, label)
        spec = parse_target(target)
        if spec is None:
            return ctx
        if spec.combined:
            return ctx.with_ensemble(spec)
        return ctx.with_target(spec.parts[0])

    def with_ensemble(self, spec: Target) -> Context:
        """This context aiming at several teachers' vectors as one (student.target): a pseudo-teacher ENSEMBLE whose
        column is as wide as the parts together; each part is checked as a single target would be."""
        parts = [self.with_target(p).embedding_target() for p in spec.parts]
        sides = [f"{COLUMN}_a", f"{COLUMN}_b"] if self.pairs else [COLUMN]
        width = sum(self.shape(keys[0])[0] for keys in parts)
        ensemble = {column_key(ENSEMBLE, side): tuple((keys[i], share) for keys, share in zip(parts, spec.shares()))
                    for i, side in enumerate(sides)}
        return dataclasses.replace(self, shapes=self.shapes | {ENSEMBLE: {side: (width,) for side in sides}},
                                   meta=self.meta | {ENSEMBLE: {}}, target_teacher=ENSEMBLE, target_column=COLUMN,
                                   ensemble=ensemble)

    def part_teacher(self, key: str) -> str:
        """The stored teacher behind a batch key: its own, or a combined target's first part's."""
        parts = self.ensemble.get(key)
        return key_parts(parts[0][0] if parts else key)[0]

    def with_target(self, part: Part) -> Context:
        """This context aiming at one teacher's output (--target's, or an objective's own `target=` option)."""
        if part.teacher not in self.shapes or part.teacher == ENSEMBLE:
            stored = sorted(set(self.shapes) - {ENSEMBLE})
            raise KdError(f"teacher {part.teacher!r} is not in the store", f"target {part.ref!r}",
                          f"teachers in the store: {stored or 'none (run kd precompute)'}")
        return dataclasses.replace(self, target_teacher=part.teacher, target_column=part.column)

    # -- columns -----------------------------------------------------------------------------------

    def keys(self, teacher: str, column: str, per_side: bool) -> list[str] | None:
        """Batch keys for `column` of `teacher` ([_a, _b] in pair stores when per_side), None if absent."""
        names = [f"{column}_a", f"{column}_b"] if self.pairs and per_side else [column]
        if all(n in self.shapes.get(teacher, {}) for n in names):
            return [column_key(teacher, n) for n in names]
        return None

    def shape(self, key: str) -> tuple[int, ...]:
        teacher, column = key_parts(key)
        return self.shapes[teacher][column]

    def available(self) -> list[str]:
        return [column_key(t, c) for t, cols in self.shapes.items() for c in cols
                if c.split("_")[0] in _VECTOR_COLUMNS]

    def pick_teacher(self, column: str, per_side: bool, preferred: str | None, what: str) -> str:
        """`preferred` (an option) > the target's teacher if it has `column` > the first teacher that does."""
        if preferred is not None:
            if self.keys(preferred, column, per_side) is None:
                raise KdError(f"teacher {preferred!r} has no {column!r} column for {what}", self.where,
                              f"available columns: {self.available()}")
            return preferred
        order = ([self.target_teacher] if self.target_teacher else []) + list(self.shapes)
        for t in order:
            if self.keys(t, column, per_side) is not None:
                return t
        side = " per side (_a/_b)" if self.pairs and per_side else ""
        raise KdError(f"{what} needs a teacher column {column!r}{side}, and no teacher in the store has it",
                      self.where, f"available columns: {self.available()}; "
                      "re-run kd precompute with a teacher (and --outputs) that writes it")

    def embedding_target(self) -> list[str]:
        """Batch keys of the vector the student's embedding should match ([a, b] keys in pair stores)."""
        teacher = self.target_teacher
        if teacher is None:
            teacher = next((t for t in self.shapes if any(self.keys(t, c, True) for c in _EMBEDDING_COLUMNS)),
                           None)
            if teacher is None:
                raise KdError("no teacher in the store has an embedding column (sentence, mean, cls)", self.where,
                              f"available columns: {self.available()}")
        column = self.target_column
        if column is None:
            default = self.meta[teacher].get("default_target")
            candidates = [default] if default else []
            column = next((c for c in [*candidates, *_EMBEDDING_COLUMNS] if self.keys(teacher, c, True)), "sentence")
        keys = self.keys(teacher, column, True)
        if keys is None:
            raise KdError(f"target column {teacher}.{column} is not in the store", self.where,
                          f"pick --target from the available columns: {self.available()}")
        if len(self.shape(keys[0])) != 1:
            raise KdError(f"target column {teacher}.{column} is not one vector per text "
                          f"(shape {self.shape(keys[0])})", self.where,
                          "pick a sentence/mean/cls column as target; layers are for the contrastive objective")
        return keys

    def label_columns(self) -> list[str]:
        return ["label"] if self.label is not None else []


# --------------------------------------------------------------------------------------------------
# Labels


def labelled_rows(label: Tensor, kind: LabelKind) -> Tensor:
    """Rows that carry a label: class index >= 0, or a finite score (missing labels are -1 / NaN)."""
    return label >= 0 if kind is LabelKind.classes else torch.isfinite(label)


def label_loss(logits: Tensor, label: Tensor, kind: LabelKind) -> Tensor:
    """Cross-entropy on class labels, squared error of the first logit on scores; 0 if no row is labelled."""
    keep = labelled_rows(label, kind)
    if not bool(keep.any()):
        return logits.sum() * 0.0  # keeps the graph (and the device) without a branch in the caller
    if kind is LabelKind.classes:
        return nn.functional.cross_entropy(logits[keep], label[keep].long())
    return nn.functional.mse_loss(logits[keep, 0], label[keep].to(logits.dtype))
