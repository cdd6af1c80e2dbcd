"""CoDIR: contrastive distillation on intermediate representations (InfoNCE + memory bank).

- Summaries: the student's per-layer masked-mean states (`StudentOutput.layers`) and the teacher's
  `layers` column are each flattened (concatenation of the layers, CoDIR sec. 3.2) and linearly
  projected to m dims (phi_s, phi_t; m = 128), then L2-normalised so dot products are cosines.
- Loss (CoDIR eq. 4, InfoNCE): for row i, -log exp(<s_i, t_i>/tau) / sum_j exp(<s_i, c_j>/tau) over
  candidates c = the teacher projections of every row in the batch (the other rows are in-batch
  negatives) plus K negatives drawn from a memory bank; tau = 0.07.
- The paper anchors on the teacher and banks the student's projections; here the student is the
  anchor and the bank holds teacher projections (the CRD arrangement, Tian et al. 2019). The teacher
  side is a fixed target seen through one linear map, so banked entries go stale more slowly than
  the student's own outputs would.
- Bank update (CoDIR eq. 5, Wu et al. 2018): after each training step the slots of this batch's rows
  become normalise(beta * old + (1 - beta) * new) (beta = 0.5), a slot's first write stores new as is.
- By default the embeddings layer is left out on both sides, as in the paper (h_1 .. h_L).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from student.objectives.base import Batch, Context, Objective, ObjectiveName, Out, sides


def info_nce(anchor: Tensor, positive: Tensor, negatives: Tensor, tau: float) -> Tensor:
    """Mean InfoNCE of anchor[i] against positive[i], the other rows' positives and `negatives`.

    anchor, positive: [B, m]; negatives: [K, m] (K may be 0). Inputs are L2-normalised here.
    """
    a, p = F.normalize(anchor, dim=-1), F.normalize(positive, dim=-1)
    n = F.normalize(negatives, dim=-1).to(a.dtype)
    # [B, B + K]: column i of the first block is row i's positive, the rest are negatives
    logits = torch.cat([a @ p.T, a @ n.T], 1) / tau
    return F.cross_entropy(logits, torch.arange(a.shape[0], device=a.device))


class MemoryBank(nn.Module):
    """A ring of `size` L2-normalised vectors keyed by row position: slot = key mod size.

    Keys are the store's row ids (for pair stores 2 * id + side), so a row always returns to the same
    slot and its entry is a moving average of its own projections; when the store has more rows than
    slots, rows that share a slot share an entry (a bounded-memory approximation). Both tensors are
    buffers: they move with `.to(device)` and are saved in the state dict.
    """

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("vectors", torch.zeros(size, dim))
        self.register_buffer("filled", torch.zeros(size, dtype=torch.bool))

    def slots(self, keys: Tensor) -> Tensor:
        return torch.remainder(keys.to(self.vectors.device).long(), self.vectors.shape[0])

    def sample(self, k: int, exclude: Tensor) -> Tensor:
        """Up to k filled entries chosen uniformly at random, never one of the `exclude` slots."""
        allowed = self.filled.clone()
        allowed[exclude] = False  # the batch's own (older) entries would be false negatives
        idx = allowed.nonzero().squeeze(1)
        if idx.numel() > k:
            idx = idx[torch.randperm(idx.numel(), device=idx.device)[:k]]
        return self.vectors[idx]

    @torch.no_grad()
    def update(self, slots: Tensor, values: Tensor, beta: float) -> None:
        new = F.normalize(values.detach().to(self.vectors.dtype), dim=-1)
        old = self.vectors[slots]
        mixed = torch.where(self.filled[slots].unsqueeze(1), beta * old + (1.0 - beta) * new, new)
        self.vectors[slots] = F.normalize(mixed, dim=-1)
        self.filled[slots] = True


class Contrastive(Objective):
    name = ObjectiveName.contrastive

    def __init__(self, weight: float, columns: list[str], student_in: int, teacher_in: int, *, dim: int,
                 tau: float, negatives: int, beta: float, bank_size: int, embeddings: bool) -> None:
        super().__init__(weight, columns)
        self.tau, self.negatives, self.beta, self.embeddings = tau, negatives, beta, embeddings
        self.phi_s = nn.Linear(student_in, dim)
        self.phi_t = nn.Linear(teacher_in, dim)
        self.bank = MemoryBank(bank_size, dim)

    @classmethod
    def build(cls, ctx: Context, weight: float, teacher: str | None = None, dim: int = 128, tau: float = 0.07,
              negatives: int = 500, beta: float = 0.5, bank_size: int = 16384,
              embeddings: bool = False) -> Contrastive:
        t = ctx.pick_teacher("layers", True, teacher, "the contrastive objective")
        keys = ctx.keys(t, "layers", True)
        assert keys is not None
        t_layers, t_dim = ctx.shape(keys[0])
        s_layers, s_dim = ctx.student.layers_shape
        skip = 0 if embeddings else 1
        rows = ctx.num_rows * len(keys) if ctx.num_rows else bank_size
        return cls(weight, keys, (s_layers - skip) * s_dim, (t_layers - skip) * t_dim, dim=dim, tau=tau,
                   negatives=negatives, beta=beta, bank_size=max(1, min(bank_size, rows)), embeddings=embeddings)

    def _flat(self, layers: Tensor) -> Tensor:
        return (layers if self.embeddings else layers[:, 1:]).flatten(1)

    def loss(self, out: Out, batch: Batch, progress: float) -> Tensor:
        outs = sides(out)
        s = torch.cat([self.phi_s(self._flat(o.layers)) for o in outs])
        t = torch.cat([self.phi_t(self._flat(batch[k].to(s.dtype))) for k in self._columns])
        ids = batch["id"]
        # pair stores bank each side separately: key 2 * id + side
        keys = ids if len(outs) == 1 else torch.cat([2 * ids + side for side in range(len(outs))])
        slots = self.bank.slots(keys)
        loss = info_nce(s, t, self.bank.sample(self.negatives, slots), self.tau)
        if self.training:
            self.bank.update(slots, t, self.beta)
        return loss
