"""Objectives on the teachers' stored logits; each owns the head that turns embeddings into logits.

- logits (CoDIR eq. 2 / Tang et al.): a linear head on the embedding (on [u, v, u*v, |u-v|] in pair
  stores) and either KL(softmax(z_t / rho) || softmax(z_s / rho)) with rho = 2, or MSE between
  logits (Tang et al. 2019, used by SRA+KD).
- pair (DSE eq. 2-3): f(u, v) = w^T ReLU(W [u, v, u*v, |u-v|]) regresses the cross-encoder's pair
  logits with the squared L2 distance; with labels, alpha * L2 + (1 - alpha) * label loss (cross-entropy
  for classes, squared error of the first logit for scores), alpha = 0.5 as in the paper's best runs.
- multi-teacher (DvBERT): p = softmax(W [u, v, |u-v|]); loss = sum over teachers k of
  KL(target_k || p) with target_k = lambda * onehot(gold) + (1 - lambda) * softmax(z_k) and lambda =
  training progress, rising 0 -> 1 (teacher annealing). Rows without a gold label keep lambda = 0.
  One-logit (regression) teachers: the STS stage of the paper, y = a * cos(u, v) + b (the paper's
  cosine score, with a learned affine map because raw teacher logits and 0-5 gold scores are not on the
  cosine's scale; a and b start by matching the first training batch's mean and spread), loss = sum over
  k of (y - target_k)^2 with target_k = lambda * gold score + (1 - lambda) * z_k. `score=linear` uses
  y = w^T [u, v, |u-v|] instead.
- label (CoDIR eq. 1's L_CE): the store's gold labels through a linear head on the embedding ([u, v,
  u*v, |u-v|] in pair stores): cross-entropy on classes, squared error on scores. With logits and
  contrastive it is CoDIR's fine-tuning objective CE + a1 KD + a2 CRD.
"""

from __future__ import annotations

from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kd.common.errors import KdError
from kd.student.distributed import gather_rows
from kd.student.objectives.base import (
    Batch,
    Context,
    LabelKind,
    Objective,
    ObjectiveName,
    Out,
    head_input,
    head_width,
    label_loss,
    labelled_rows,
)
from kd.student.target import column_key


class LogitsMode(str, Enum):
    kl = "kl"
    mse = "mse"


def soft_kl(student_logits: Tensor, target_probs: Tensor) -> Tensor:
    """KL(target || softmax(student_logits)), mean over rows; zero-probability targets contribute 0."""
    return F.kl_div(F.log_softmax(student_logits, -1), target_probs, reduction="batchmean")


def annealing_weight(progress: float) -> float:
    """DvBERT's lambda: the weight of the gold label, linear in training progress, clipped to [0, 1]."""
    return min(max(float(progress), 0.0), 1.0)


def _num_logits(ctx: Context, teacher: str) -> int:
    return ctx.shape(column_key(teacher, "logits"))[0]


class Logits(Objective):
    name = ObjectiveName.logits

    def __init__(self, weight: float, columns: list[str], width: int, n: int, mode: LogitsMode, rho: float) -> None:
        super().__init__(weight, columns)
        self.mode, self.rho = mode, rho
        self.head = nn.Linear(width, n)

    @classmethod
    def build(cls, ctx: Context, weight: float, teacher: str | None = None, mode: LogitsMode | None = None,
              rho: float = 2.0) -> Logits:
        """mode: kl (default) or mse; a one-logit (score) teacher defaults to mse, and kl is refused for it."""
        t = ctx.pick_teacher("logits", False, teacher, "the logits objective")
        n = _num_logits(ctx, t)
        if mode is None:
            mode = LogitsMode.kl if n > 1 else LogitsMode.mse
        if n == 1 and LogitsMode(mode) is LogitsMode.kl:
            # softmax over one logit is 1 whatever the logit: the loss and its gradient would be 0
            raise KdError(f"teacher {t!r} has one logit (a score): its KL loss is always 0", ctx.where,
                          "use --objective logits:1:mode=mse (the default for one-logit teachers)")
        return cls(weight, [f"{t}.logits"], head_width(ctx.student.out_dim, ctx.pairs), n, LogitsMode(mode), rho)

    def loss(self, out: Out, batch: Batch, progress: float) -> Tensor:
        zs = self.head(head_input(out))
        zt = batch[self._columns[0]].to(zs.dtype)
        if self.mode is LogitsMode.mse:
            return F.mse_loss(zs, zt)
        return soft_kl(zs / self.rho, F.softmax(zt / self.rho, -1))


class PairHead(str, Enum):
    mlp = "mlp"  # DSE eq. 3: f(u, v) = MLP([u, v, u*v, |u-v|])
    residual = "residual"  # a * cos(u, v) + b + MLP(...), the MLP's last layer starting at zero (see Pair)


class Pair(Objective):
    """DSE's f(u, v) regressing the cross-encoder's logits (module docstring).

    `head=residual` (a deliberate deviation, docs/training.md): with few pairs the paper's MLP memorises
    them (1,500 STS-B pairs: training Spearman ~67, test 32) and leaves the embeddings' geometry
    untouched. Starting f from a calibrated cosine (a, b matched to the first batch's targets, as
    DvBERT's score) with a zero residual MLP makes the cosine of u and v carry the score, so the
    embeddings themselves learn it; the MLP only adds what the cosine cannot express.
    """

    name = ObjectiveName.pair

    def __init__(self, weight: float, columns: list[str], width: int, hidden: int, n: int, alpha: float,
                 label: LabelKind | None, head: PairHead = PairHead.mlp) -> None:
        super().__init__(weight, columns)
        self.alpha, self.label, self.residual = alpha, label, head is PairHead.residual
        # biases added to eq. 3 (which has none) so a constant offset in the teacher's logits costs nothing
        self.head = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, n))
        self.affine = nn.Linear(1, n) if self.residual else None
        if self.residual:  # (only then: an mlp head's saved weights stay what they were before this option)
            nn.init.zeros_(self.head[2].weight)
            nn.init.zeros_(self.head[2].bias)
            self.register_buffer("calibrated", torch.tensor(False))

    @classmethod
    def build(cls, ctx: Context, weight: float, teacher: str | None = None, alpha: float = 0.5,
              hidden: int = 512, head: str = "mlp") -> Pair:
        """head: mlp (the paper's f) or residual (calibrated cosine + MLP, see the class docstring)."""
        if not ctx.pairs:
            raise KdError("the pair objective needs a pair store (text_a, text_b), this store holds single texts",
                          ctx.where, "precompute a pair store with a cross-encoder teacher, or use the "
                          "cosine / mse / contrastive / logits objectives")
        if head not in {h.value for h in PairHead}:
            raise KdError(f"unknown pair head {head!r}", ctx.where, "use head=mlp (DSE's f) or head=residual")
        t = ctx.pick_teacher("logits", False, teacher, "the pair objective")
        n = _num_logits(ctx, t)
        if ctx.label is LabelKind.regression and n != 1:
            raise KdError(f"score labels need a teacher with one logit, {t!r} has {n}", ctx.where,
                          "use a regression cross-encoder, or precompute without the label column")
        return cls(weight, [f"{t}.logits", *ctx.label_columns()], 4 * ctx.student.out_dim, hidden, n, alpha,
                   ctx.label, PairHead(head))

    def score(self, out: Out, target: Tensor | None = None) -> Tensor:
        """f(u, v) [B, n]. In training, the first call with one-logit targets calibrates the residual's a, b."""
        s = self.head(head_input(out, product=True))
        if not self.residual:
            return s
        assert isinstance(out, tuple) and self.affine is not None
        cos = F.cosine_similarity(out[0].embedding, out[1].embedding, dim=-1, eps=1e-8)
        if self.training and target is not None and not bool(self.calibrated) and target.shape[-1] == 1:
            calibrate(self.affine, self.calibrated, cos, target.to(cos.dtype))  # scores (classes: as built)
        return s + self.affine(cos.unsqueeze(1))

    def loss(self, out: Out, batch: Batch, progress: float) -> Tensor:
        target = batch[self._columns[0]]
        s = self.score(out, target)
        distill = (s - target.to(s.dtype)).pow(2).sum(-1).mean()
        if self.label is None:
            return distill
        return self.alpha * distill + (1.0 - self.alpha) * label_loss(s, batch["label"], self.label)


class MultiTeacher(Objective):
    name = ObjectiveName.multi_teacher

    def __init__(self, weight: float, columns: list[str], width: int, n: int, anneal: bool,
                 score: str = "cosine") -> None:
        super().__init__(weight, columns)
        self.teacher_columns = [c for c in columns if c != "label"]
        self.anneal = anneal and "label" in columns
        self.regression = n == 1  # one-logit teachers score pairs: softmax over one logit is always 1
        self.cosine = self.regression and score == "cosine"
        # (only the modules the loss uses: DDP refuses parameters that get no gradient)
        self.head = None if self.cosine else nn.Linear(width, n)
        self.affine = nn.Linear(1, 1) if self.cosine else None
        self.register_buffer("calibrated", torch.tensor(False))

    @classmethod
    def build(cls, ctx: Context, weight: float, teachers: str = "", anneal: bool = True,
              score: str = "cosine") -> MultiTeacher:
        """score (one-logit teachers): cosine (the paper's STS score, affine-calibrated) or linear."""
        if score not in ("cosine", "linear"):
            raise KdError(f"unknown multi-teacher score {score!r}", ctx.where, "use score=cosine or score=linear")
        have = [t for t in ctx.shapes if ctx.keys(t, "logits", False)]
        names = [t.strip() for t in teachers.split(",") if t.strip()] or have
        missing = [t for t in names if t not in have]
        if missing or len(names) < 2:
            raise KdError(f"multi-teacher needs at least 2 teachers with logits; with logits: {have}"
                          + (f", asked for {missing}" if missing else ""), ctx.where,
                          "precompute the store with two or more cross-encoder teachers, or use pair / logits")
        sizes = {t: _num_logits(ctx, t) for t in names}
        if len(set(sizes.values())) != 1:
            raise KdError(f"the teachers' logits have different sizes {sizes}", ctx.where,
                          "use teachers trained on the same label set")
        n = sizes[names[0]]
        _check_gold(ctx, n, names)
        labels = ["label"] if ctx.label is not None else []
        return cls(weight, [f"{t}.logits" for t in names] + labels,
                   head_width(ctx.student.out_dim, ctx.pairs, product=False), n, anneal, score)

    def loss(self, out: Out, batch: Batch, progress: float) -> Tensor:
        if self.regression:
            return self._regression_loss(out, batch, progress)
        s = self.head(head_input(out, product=False))
        lam = torch.zeros(s.shape[0], 1, device=s.device, dtype=s.dtype)
        gold = torch.zeros_like(s)
        if self.anneal:
            label = batch["label"].long()
            keep = labelled_rows(label, LabelKind.classes)
            lam[keep] = annealing_weight(progress)
            gold[keep] = F.one_hot(label[keep], s.shape[1]).to(s.dtype)
        total = s.new_zeros(())
        for key in self.teacher_columns:
            soft = F.softmax(batch[key].to(s.dtype), -1)
            total = total + soft_kl(s, lam * gold + (1.0 - lam) * soft)
        return total

    @torch.no_grad()
    def score(self, out: Out) -> Tensor:
        """What the student predicts for a pair [B, n]: class logits, or the (calibrated) score."""
        if self.cosine:
            assert isinstance(out, tuple) and self.affine is not None
            return self.affine(F.cosine_similarity(out[0].embedding, out[1].embedding, dim=-1).unsqueeze(1))
        assert self.head is not None
        return self.head(head_input(out, product=False))

    def _regression_loss(self, out: Out, batch: Batch, progress: float) -> Tensor:
        """Sum over teachers of mean (y - (lambda * gold + (1 - lambda) * z_k))^2; lambda 0 where unlabelled."""
        if self.cosine:
            assert isinstance(out, tuple) and self.affine is not None
            cos = F.cosine_similarity(out[0].embedding, out[1].embedding, dim=-1, eps=1e-8)
        y0 = cos if self.cosine else self.head(head_input(out, product=False))[:, 0]
        lam = torch.zeros_like(y0)
        gold = torch.zeros_like(y0)
        if self.anneal:
            label = batch["label"].to(y0.dtype)
            keep = labelled_rows(label, LabelKind.regression)
            lam[keep] = annealing_weight(progress)
            gold[keep] = label[keep]
        targets = [lam * gold + (1.0 - lam) * batch[key][:, 0].to(y0.dtype) for key in self.teacher_columns]
        if self.cosine:
            if self.training and not bool(self.calibrated):
                calibrate(self.affine, self.calibrated, cos, torch.stack(targets).mean(0))
            y = self.affine(cos.unsqueeze(1))[:, 0]
        else:
            y = y0
        total = y.new_zeros(())
        for target in targets:
            total = total + F.mse_loss(y, target)
        return total

@torch.no_grad()
def calibrate(affine: nn.Linear, done: Tensor, cos: Tensor, target: Tensor) -> None:
    """y = a * cos + b with a, b := matched moments of the first batch (every rank's: equal init), so y has
    the targets' mean and spread (per logit). Not least squares: at the start cos and target barely
    correlate, and a near-zero slope would starve the encoder of gradient; a > 0 because a higher cosine
    must mean a higher score."""
    c, t = gather_rows([cos.detach().float(), target.detach().float().reshape(len(cos), -1)])
    a = t.std(0, unbiased=False).clamp_min(1e-3) / c.std(unbiased=False).clamp_min(1e-3)
    affine.weight.copy_(a.unsqueeze(1))
    affine.bias.copy_(t.mean(0) - a * c.mean())
    done.fill_(True)


def _check_gold(ctx: Context, n: int, teachers: list[str]) -> None:
    """The gold labels must be of the teachers' kind: scores for one-logit teachers, classes otherwise."""
    if n == 1 and ctx.label is LabelKind.classes:
        raise KdError(f"teachers {teachers} give one score per pair, and the store's labels are classes: "
                      "a score cannot be annealed toward a class", ctx.where,
                      "precompute the pairs with score labels (STS), or with classifier teachers (NLI)")
    if n > 1 and ctx.label is LabelKind.regression:
        raise KdError(f"teachers {teachers} give {n} class logits, and the store's labels are scores: "
                      "a class distribution cannot be annealed toward a score", ctx.where,
                      "precompute the pairs with class labels, or with one-logit (regression) teachers")


class Label(Objective):
    name = ObjectiveName.label

    def __init__(self, weight: float, width: int, n: int, kind: LabelKind) -> None:
        super().__init__(weight, ["label"])
        self.kind = kind
        self.head = nn.Linear(width, n)

    @classmethod
    def build(cls, ctx: Context, weight: float, classes: int = 0) -> Label:
        """classes: the number of classes (default: a teacher's label names, else its logits' width)."""
        if ctx.label is None:
            raise KdError("the label objective needs gold labels, and the store's texts have no label column",
                          ctx.where, "precompute with --label-column, or drop --objective label")
        n = 1 if ctx.label is LabelKind.regression else classes or _class_count(ctx)
        return cls(weight, head_width(ctx.student.out_dim, ctx.pairs), n, ctx.label)

    def loss(self, out: Out, batch: Batch, progress: float) -> Tensor:
        return label_loss(self.head(head_input(out)), batch["label"], self.kind)


def _class_count(ctx: Context) -> int:
    """Classes of a class-label store: a teacher's label names, else a teacher's number of logits."""
    for teacher, meta in ctx.meta.items():
        if meta.get("label_names"):
            return len(meta["label_names"])
        if ctx.keys(teacher, "logits", False):
            return _num_logits(ctx, teacher)
    raise KdError("the number of classes is unknown (no teacher in the store has label names or logits)",
                  ctx.where, "give it: --objective label:1:classes=N")
