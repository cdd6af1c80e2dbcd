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
- Bank (CoDIR sec. 3.3, "all N training examples"): one slot per store row, keyed by the row's
  ordinal in the store (the `pos` pseudo-column of student.data; pair stores: 2 * pos + side), so no
  two rows ever share a slot. `bank_size=N` bounds it: slot = key mod N, rows that share a slot share
  an entry (an approximation; default 0 = every row).
- Bank update (CoDIR eq. 5, Wu et al. 2018): after each training step the slots of this batch's rows
  become normalise(beta * old + (1 - beta) * new) (beta = 0.5), a slot's first write stores new as is.
  Under DDP each rank gathers every rank's batch (projections, slots, labels) and applies the same
  update, so all ranks hold the same bank (the bank is left out of DDP's buffer broadcast).
- Labels (CoDIR sec. 3.3, fine-tuning): in single-text stores with class labels, negatives have
  another label than the anchor: same-label rows of the batch are dropped from the denominator, and
  each row's K bank negatives are drawn among entries of other labels. Pair stores: a row's own
  partner sentence (the other side of its pair) is never one of its negatives.
- By default the embeddings layer is left out on both sides, as in the paper (h_1 .. h_L).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kd.student.distributed import gather_rows
from kd.student.objectives.base import Batch, Context, LabelKind, Objective, ObjectiveName, Out, sides

POS = "pos"  # student.data.POS (objectives do not import the data layer)


def info_nce(anchor: Tensor, positive: Tensor, negatives: Tensor, tau: float, drop: Tensor | None = None) -> Tensor:
    """Mean InfoNCE of anchor[i] against positive[i], the other rows' positives and `negatives`.

    anchor, positive: [B, m]; negatives: [K, m] (K may be 0). Inputs are L2-normalised here.
    drop: optional [B, B + K] bool, True where a candidate is not a negative of that row (same label,
    own pair partner); a row's own positive is never dropped.
    """
    a, p = F.normalize(anchor, dim=-1), F.normalize(positive, dim=-1)
    n = F.normalize(negatives, dim=-1).to(a.dtype)
    # [B, B + K]: column i of the first block is row i's positive, the rest are negatives
    logits = torch.cat([a @ p.T, a @ n.T], 1) / tau
    if drop is not None:
        keep_positive = torch.eye(a.shape[0], logits.shape[1], dtype=torch.bool, device=a.device)
        logits = logits.masked_fill(drop.to(a.device) & ~keep_positive, float("-inf"))
    return F.cross_entropy(logits, torch.arange(a.shape[0], device=a.device))


class MemoryBank(nn.Module):
    """`size` L2-normalised vectors, one per slot; slot = key mod size (keys: row positions).

    Buffers (they move with `.to(device)` and are saved in the state dict): `vectors`, `filled`, and
    `labels` (the class label of the row last written to each slot, -1 if none).
    """

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("vectors", torch.zeros(size, dim))
        self.register_buffer("filled", torch.zeros(size, dtype=torch.bool))
        self.register_buffer("labels", torch.full((size,), -1, dtype=torch.long))

    def slots(self, keys: Tensor) -> Tensor:
        return torch.remainder(keys.to(self.vectors.device).long(), self.vectors.shape[0])

    def sample(self, k: int, exclude: Tensor, not_label: int | None = None) -> Tensor:
        """Up to k filled entries chosen uniformly at random, never one of the `exclude` slots, and,
        with `not_label`, never an entry of that label."""
        allowed = self.filled.clone()
        allowed[exclude] = False  # the batch's own (older) entries would be false negatives
        if not_label is not None and not_label >= 0:
            allowed &= self.labels != not_label
        idx = allowed.nonzero().squeeze(1)
        if idx.numel() > k:
            idx = idx[torch.randperm(idx.numel(), device=idx.device)[:k]]
        return self.vectors[idx]

    @torch.no_grad()
    def update(self, slots: Tensor, values: Tensor, beta: float, labels: Tensor | None = None) -> None:
        new = F.normalize(values.detach().to(self.vectors.dtype), dim=-1)
        old = self.vectors[slots]
        mixed = torch.where(self.filled[slots].unsqueeze(1), beta * old + (1.0 - beta) * new, new)
        self.vectors[slots] = F.normalize(mixed, dim=-1)
        self.filled[slots] = True
        if labels is not None:
            self.labels[slots] = labels.to(self.labels.device).long()


class Contrastive(Objective):
    name = ObjectiveName.contrastive

    def __init__(self, weight: float, columns: list[str], student_in: int, teacher_in: int, *, dim: int,
                 tau: float, negatives: int, beta: float, bank_size: int, embeddings: bool,
                 labels: bool = False) -> None:
        super().__init__(weight, columns)
        self.tau, self.negatives, self.beta, self.embeddings = tau, negatives, beta, embeddings
        self.use_labels = labels
        self.phi_s = nn.Linear(student_in, dim)
        self.phi_t = nn.Linear(teacher_in, dim)
        self.bank = MemoryBank(bank_size, dim)

    @classmethod
    def build(cls, ctx: Context, weight: float, teacher: str | None = None, dim: int = 128, tau: float = 0.07,
              negatives: int = 500, beta: float = 0.5, bank_size: int = 0, embeddings: bool = False,
              labels: bool = True) -> Contrastive:
        """bank_size 0: one slot per store row and side (the paper's N); labels: label-aware negatives."""
        t = ctx.pick_teacher("layers", True, teacher, "the contrastive objective")
        keys = ctx.keys(t, "layers", True)
        assert keys is not None
        t_layers, t_dim = ctx.shape(keys[0])
        s_layers, s_dim = ctx.student.layers_shape
        skip = 0 if embeddings else 1
        rows = ctx.num_rows * len(keys) if ctx.num_rows else 16384  # 16384: a store that does not say
        size = rows if bank_size <= 0 else min(bank_size, rows)
        # a pair's label says how two sentences relate, not what class either sentence is: no label negatives
        use_labels = labels and ctx.label is LabelKind.classes and not ctx.pairs
        columns = [*keys, POS, *(["label"] if use_labels else [])]
        return cls(weight, columns, (s_layers - skip) * s_dim, (t_layers - skip) * t_dim, dim=dim, tau=tau,
                   negatives=negatives, beta=beta, bank_size=max(1, size), embeddings=embeddings,
                   labels=use_labels)

    def _flat(self, layers: Tensor) -> Tensor:
        return (layers if self.embeddings else layers[:, 1:]).flatten(1)

    def loss(self, out: Out, batch: Batch, progress: float) -> Tensor:
        outs = sides(out)
        s = torch.cat([self.phi_s(self._flat(o.layers)) for o in outs])
        t = torch.cat([self.phi_t(self._flat(batch[k].to(s.dtype))) for k in self._columns[: len(outs)]])
        pos = batch[POS]
        keys = pos if len(outs) == 1 else torch.cat([2 * pos + side for side in range(len(outs))])
        slots = self.bank.slots(keys)
        label = batch["label"].long().to(s.device) if self.use_labels else None
        negatives, drop = self._negatives(slots, label, len(pos), len(outs))
        loss = info_nce(s, t, negatives, self.tau, drop)
        if self.training:
            # every rank applies every rank's update, so the banks stay equal without a broadcast
            extra = [] if label is None else [label]
            g_t, g_slots, *g_label = gather_rows([t.detach(), slots, *extra])
            self.bank.update(g_slots, g_t, self.beta, g_label[0] if g_label else None)
        return loss

    def _negatives(self, slots: Tensor, label: Tensor | None, rows: int, n_sides: int) -> tuple[Tensor, Tensor]:
        """Bank negatives and the [n, n + K] mask of candidates that are not negatives of each anchor.

        - pair stores: anchor i's partner (the other side of its pair) is dropped;
        - labels: same-label batch rows are dropped, and each label group gets its own K bank entries
          of other labels (the other groups' entries are dropped for it).
        """
        n = rows * n_sides
        dev = slots.device
        idx = torch.arange(n, device=dev)
        drop = (idx[:, None] % rows == idx[None, :] % rows) & (idx[:, None] != idx[None, :])
        if label is None:
            bank = self.bank.sample(self.negatives, slots)
            return bank, torch.cat([drop, torch.zeros(n, len(bank), dtype=torch.bool, device=dev)], 1)
        drop |= (label[:, None] == label[None, :]) & (label[:, None] >= 0)
        blocks, masks = [], []
        groups = torch.unique(label).tolist()
        for g in groups:
            block = self.bank.sample(self.negatives, slots, not_label=g)
            blocks.append(block)
            masks.append((label != g)[:, None].expand(n, len(block)))
        return torch.cat(blocks), torch.cat([drop, *masks], 1)
