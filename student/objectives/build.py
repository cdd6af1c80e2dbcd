"""Turn objective specs into modules, and sum their losses.

- `build_objectives(["cosine", "contrastive:0.1:tau=0.1"], cfg, manifest, target)`: each spec names an
  objective, its weight and options; options are the keyword arguments of that objective's `build`
  and are converted to their annotated types (unknown ones are an error that lists the valid ones).
- `target` ("<teacher>.<column>", "<teacher>" or None) picks the vector the embedding objectives
  match and the teacher the others prefer; None means the first teacher's default target.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Sequence
from enum import Enum
from types import UnionType
from typing import Any

from torch import Tensor

from kd.common.errors import KdError
from kd.storage.manifest import Manifest
from kd.student.models import StudentConfig
from kd.student.objectives.base import (
    Batch,
    Context,
    Objective,
    ObjectiveName,
    ObjectiveSpec,
    Out,
    check_weight,
    parse_objective,
)
from kd.student.objectives.contrastive import Contrastive
from kd.student.objectives.embedding import Cosine, Mse
from kd.student.objectives.logits import Label, Logits, MultiTeacher, Pair
from kd.student.objectives.relational import Relational

REGISTRY: dict[ObjectiveName, type[Objective]] = {
    cls.name: cls for cls in (Cosine, Mse, Contrastive, Logits, Pair, MultiTeacher, Relational, Label)
}


def _coerce(value: str, annotation: Any, where: str) -> Any:
    if isinstance(annotation, UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    try:
        if annotation is bool:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if isinstance(annotation, type) and issubclass(annotation, Enum):
            return annotation(value)
        return annotation(value)
    except ValueError:
        raise KdError(f"option value {value!r} is not a valid {getattr(annotation, '__name__', annotation)}",
                      where) from None


def _options(cls: type[Objective], spec: ObjectiveSpec) -> dict[str, Any]:
    build = cls.build  # type: ignore[attr-defined]
    hints = typing.get_type_hints(build)
    valid = [p for p in inspect.signature(build).parameters if p not in ("ctx", "weight")]
    out = {}
    for key, value in spec.options:
        if key not in valid:
            raise KdError(f"{spec.name.value} has no option {key!r}", f"objective spec {str(spec)!r}",
                          f"options of {spec.name.value}: {valid or 'none'}")
        out[key] = _coerce(value, hints[key], f"objective spec {str(spec)!r}")
    return out


def build_objectives(specs: Sequence[str | ObjectiveSpec], student_cfg: StudentConfig, manifest: Manifest,
                     target: str | None = None) -> list[Objective]:
    """Parse, check against the store's manifest and build every objective (in spec order)."""
    if not specs:
        raise KdError("no objective given", "build_objectives", "e.g. --objective cosine")
    ctx = Context.from_manifest(manifest, student_cfg, target)
    parsed = [s if isinstance(s, ObjectiveSpec) else parse_objective(s) for s in specs]
    for spec in parsed:  # (an ObjectiveSpec built in Python skipped the parser's check)
        check_weight(spec.weight, f"objective spec {str(spec)!r}")
    if not any(spec.weight > 0 for spec in parsed):
        raise KdError("every objective has weight 0, so training would change nothing",
                      f"--objective {' --objective '.join(map(str, parsed))}",
                      "give at least one objective a positive weight, e.g. --objective cosine")
    objectives = []
    for spec in parsed:
        cls = REGISTRY[spec.name]
        obj = cls.build(ctx, spec.weight, **_options(cls, spec))  # type: ignore[attr-defined]
        obj.spec = str(spec)
        objectives.append(obj)
    return objectives


def required_columns(objectives: Sequence[Objective]) -> list[str]:
    """Union of the store columns the objectives read, in first-use order."""
    return list(dict.fromkeys(c for o in objectives for c in o.columns()))


def total_loss(objectives: Sequence[Objective], out: Out, batch: Batch,
               progress: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Sum of the weighted losses, and each weighted loss (detached) keyed by its spec for logging."""
    parts = {o.spec: o(out, batch, progress) for o in objectives}
    total = sum(parts.values())
    assert isinstance(total, Tensor)
    return total, {k: v.detach() for k, v in parts.items()}
