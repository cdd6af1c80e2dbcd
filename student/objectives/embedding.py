"""Match the student's embedding to a stored teacher vector: cosine (SRA, news paper) or MSE (news paper).

- cosine: mean over rows of 1 - cos(S_x, T_x) (news paper eq. 3). SRA's eq. 1 halves it:
  "cosine:0.5" reproduces it exactly.
- mse: mean over rows and dimensions of (T_x - S_x)^2 (news paper eq. 2).
- In pair stores both sides are matched (sentence_a with a, sentence_b with b) and averaged.
- If the student's `out_dim` differs from the target's width, a bias-free linear map (owned here,
  saved with the student) carries the embedding to the target's space first.
- `target=<teacher>.<column>` points one objective at another teacher's vector: several weighted
  objectives distil several teachers (e.g. mpnet's 768-d and MiniLM's 384-d sentence vectors) at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kd.student.objectives.base import Batch, Context, Objective, ObjectiveName, Out, sides
from kd.student.target import parse_part


def cosine_loss(s: Tensor, t: Tensor) -> Tensor:
    return (1.0 - F.cosine_similarity(s, t, dim=-1, eps=1e-8)).mean()


def mse_loss(s: Tensor, t: Tensor) -> Tensor:
    return F.mse_loss(s, t)


class _Match(Objective):
    def __init__(self, weight: float, columns: list[str], student_dim: int, target_dim: int) -> None:
        super().__init__(weight, columns)
        self.proj = nn.Linear(student_dim, target_dim, bias=False) if student_dim != target_dim else None

    @classmethod
    def build(cls, ctx: Context, weight: float, target: str | None = None) -> _Match:
        """`target` ("<teacher>[.<column>]") overrides --target for this objective alone, so one student can
        match several teachers at once: `--objective cosine --objective cosine:0.5:target=minilm.sentence`."""
        keys = (ctx.with_target(parse_part(target, f"the objective option target={target}")) if target
                else ctx).embedding_target()
        return cls(weight, keys, ctx.student.out_dim, ctx.shape(keys[0])[0])

    def distance(self, s: Tensor, t: Tensor) -> Tensor:
        raise NotImplementedError

    def loss(self, out: Out, batch: Batch, progress: float) -> Tensor:
        per_side = []
        for o, key in zip(sides(out), self._columns):
            s = o.embedding if self.proj is None else self.proj(o.embedding)
            per_side.append(self.distance(s, batch[key].to(s.dtype)))
        return torch.stack(per_side).mean()


class Cosine(_Match):
    name = ObjectiveName.cosine

    def distance(self, s: Tensor, t: Tensor) -> Tensor:
        return cosine_loss(s, t)


class Mse(_Match):
    name = ObjectiveName.mse

    def distance(self, s: Tensor, t: Tensor) -> Tensor:
        return mse_loss(s, t)
