"""Distillation objectives: hand-checked values, errors users can act on, and that every objective
trains every student architecture (the loss on a fixed batch falls within 30 Adam steps)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from objective_batches import N_LABELS, B, D, L, make_batch, manifest, run, student_cfg
from single_thread import one_thread  # noqa: F401  (autouse: this module runs on one thread)

from kd.common.errors import KdError
from kd.student.models import Arch, build_student
from kd.student.objectives import (
    Contrastive,
    LogitsMode,
    MemoryBank,
    MultiTeacher,
    Objective,
    annealing_weight,
    build_objectives,
    cosine_loss,
    info_nce,
    mse_loss,
    parse_objective,
    required_columns,
    soft_kl,
    total_loss,
)

# --------------------------------------------------------------------------------------------------
# Every architecture x every objective learns


CASES = {  # objective spec -> store it needs
    "cosine": dict(pairs=False),
    "mse": dict(pairs=False),
    "contrastive": dict(pairs=False),
    "logits": dict(pairs=False),
    "logits:1:mode=mse": dict(pairs=False),
    "pair": dict(pairs=True),
    "pair:1:head=residual": dict(pairs=True),  # classes (ce0 has 3 logits): the residual is not calibrated
    "multi-teacher": dict(pairs=True),
    "relational": dict(pairs=False),
    "relational:1:mode=kl:tau=0.1": dict(pairs=True),
    "label": dict(pairs=False),
}


@pytest.mark.parametrize("spec", list(CASES))
@pytest.mark.parametrize("arch", list(Arch))
def test_objective_trains_every_arch(arch: Arch, spec: str) -> None:
    torch.manual_seed(0)
    m = manifest(**CASES[spec])
    cfg = student_cfg(arch)
    model = build_student(cfg)
    objectives = build_objectives([spec], cfg, m, target=None)
    batch = make_batch(m)
    assert set(required_columns(objectives)) <= set(batch)
    params = [*model.parameters(), *(p for o in objectives for p in o.parameters())]
    opt = torch.optim.Adam(params, lr=1e-2)

    def loss_now() -> float:
        with torch.no_grad():
            return total_loss(objectives, run(model, batch), batch, 0.5)[0].item()

    before = loss_now()
    for _ in range(30):
        loss, _ = total_loss(objectives, run(model, batch), batch, 0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = loss_now()
    assert math.isfinite(after) and after < 0.8 * before, (before, after)


# --------------------------------------------------------------------------------------------------
# Values checkable by hand


def test_cosine_and_mse_values() -> None:
    x = torch.tensor([[1.0, 2.0, -3.0]])
    assert cosine_loss(x, x).item() == pytest.approx(0.0, abs=1e-6)
    assert cosine_loss(x, 5 * x).item() == pytest.approx(0.0, abs=1e-6)  # scale-free
    assert cosine_loss(x, -x).item() == pytest.approx(2.0)
    assert cosine_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 3.0]])).item() == pytest.approx(1.0)
    assert mse_loss(x, torch.zeros_like(x)).item() == pytest.approx(14 / 3)


def test_info_nce_values() -> None:
    a = torch.tensor([[1.0, 0.0]])
    # one positive (cos 1) and one bank negative (cos 0) at tau 1: -log(e / (e + 1))
    loss = info_nce(a, torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 5.0]]), tau=1.0)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1)))
    # a matching positive beats a mismatched one; with in-batch rows the diagonal is the positive
    anchors = torch.eye(8)[:4]
    noise = torch.cat([torch.zeros(16, 4), torch.randn(16, 4)], 1)  # orthogonal to every anchor
    matched = info_nce(anchors, anchors, noise, tau=0.07)
    shuffled = info_nce(anchors, anchors.roll(1, 0), noise, tau=0.07)
    assert matched.item() < 0.01 < 5 < shuffled.item()
    assert info_nce(anchors, anchors, noise[:0], tau=0.07).item() < matched.item() + 1e-6  # K = 0 works


def test_memory_bank_is_a_ring_with_momentum() -> None:
    bank = MemoryBank(size=4, dim=2)
    slots = bank.slots(torch.tensor([1, 6]))  # 6 mod 4 = 2
    assert slots.tolist() == [1, 2]
    bank.update(slots, torch.tensor([[3.0, 0.0], [0.0, 2.0]]), beta=0.5)
    torch.testing.assert_close(bank.vectors[1], torch.tensor([1.0, 0.0]))  # first write: normalised value
    bank.update(bank.slots(torch.tensor([5])), torch.tensor([[0.0, 1.0]]), beta=0.5)  # 5 mod 4 = slot 1 again
    torch.testing.assert_close(bank.vectors[1], torch.tensor([1.0, 1.0]) / math.sqrt(2))  # 0.5 old + 0.5 new
    assert bank.filled.tolist() == [False, True, True, False]
    assert bank.sample(10, exclude=torch.tensor([2])).tolist() == bank.vectors[1:2].tolist()
    assert bank.sample(10, exclude=torch.tensor([1, 2])).shape == (0, 2)


def test_contrastive_uses_the_bank_for_other_rows_only() -> None:
    m = manifest(label=None)
    (obj,) = build_objectives(["contrastive:1:negatives=3"], student_cfg(), m)
    assert isinstance(obj, Contrastive) and obj.bank.vectors.shape == (64, 128)
    model = build_student(student_cfg())
    obj(run(model, make_batch(m)), make_batch(m), 0.0)
    assert obj.bank.filled.sum().item() == B  # training mode writes this batch's slots
    other = make_batch(m, seed=1, pos=torch.arange(B, 2 * B))
    seen = []
    orig = obj.bank.sample
    obj.bank.sample = lambda k, exclude: seen.append(orig(k, exclude)) or seen[-1]  # type: ignore[method-assign]
    obj.eval()
    obj(run(model, other), other, 0.0)
    assert seen[-1].shape == (3, 128)  # K = 3 of the 8 entries of the first batch
    assert obj.bank.filled.sum().item() == B  # eval mode leaves the bank alone
    assert {"bank.vectors", "bank.filled", "phi_s.weight", "phi_t.weight"} <= set(obj.state_dict())


def test_annealing_weight_and_multi_teacher_targets() -> None:
    assert annealing_weight(0.0) == 0.0 and annealing_weight(1.0) == 1.0 and annealing_weight(0.25) == 0.25
    assert annealing_weight(-1) == 0.0 and annealing_weight(2) == 1.0
    m = manifest(pairs=True)
    (obj,) = build_objectives(["multi-teacher"], student_cfg(), m)
    assert isinstance(obj, MultiTeacher) and obj.columns() == ["ce0.logits", "ce1.logits", "label"]
    model = build_student(student_cfg())
    batch = make_batch(m)
    out = run(model, batch)
    s = obj.head(torch.cat([out[0].embedding, out[1].embedding, (out[0].embedding - out[1].embedding).abs()], -1))
    # progress 0: the teachers' soft predictions only
    soft = sum(soft_kl(s, F.softmax(batch[f"ce{k}.logits"], -1)) for k in range(2))
    torch.testing.assert_close(obj(out, batch, 0.0), soft)
    # progress 1: the gold labels only, i.e. cross-entropy once per teacher
    torch.testing.assert_close(obj(out, batch, 1.0), 2 * F.cross_entropy(s, batch["label"]))
    # an unlabelled row (-1) keeps the teacher target even at progress 1
    batch["label"][0] = -1
    row0 = sum(F.kl_div(F.log_softmax(s[:1], -1), F.softmax(batch[f"ce{k}.logits"][:1], -1), reduction="sum")
               for k in range(2))
    rest = 2 * F.cross_entropy(s[1:], batch["label"][1:], reduction="sum")
    torch.testing.assert_close(obj(out, batch, 1.0), (row0 + rest) / B)


def test_pair_loss_mixes_l2_and_labels_with_alpha() -> None:
    m = manifest(pairs=True)
    model = build_student(student_cfg())
    batch = make_batch(m)
    out = run(model, batch)
    (distill,) = build_objectives(["pair:1:alpha=1"], student_cfg(), m)
    s = distill.head(torch.cat([out[0].embedding, out[1].embedding, out[0].embedding * out[1].embedding,
                                (out[0].embedding - out[1].embedding).abs()], -1))
    l2 = ((s - batch["ce0.logits"]) ** 2).sum(-1).mean()
    torch.testing.assert_close(distill(out, batch, 0.0), l2)
    distill.alpha = 0.25
    torch.testing.assert_close(distill(out, batch, 0.0), 0.25 * l2 + 0.75 * F.cross_entropy(s, batch["label"]))
    # score labels: squared error of the single logit; needs a one-logit teacher
    with pytest.raises(KdError, match="one logit"):
        build_objectives(["pair"], student_cfg(), manifest(pairs=True, label="double"))


def test_logits_kl_with_temperature_and_mse_mode() -> None:
    m = manifest(label=None)
    (kl,) = build_objectives(["logits:0.5:rho=2"], student_cfg(), m)
    (ms,) = build_objectives(["logits:1:mode=mse:teacher=ce1"], student_cfg(), m)
    assert kl.weight == 0.5 and kl.rho == 2.0 and ms.mode is LogitsMode.mse and ms.columns() == ["ce1.logits"]
    model = build_student(student_cfg())
    batch = make_batch(m)
    out = run(model, batch)
    zs, zt = kl.head(out.embedding), batch["ce0.logits"]
    expected = (F.softmax(zt / 2, -1) * (F.log_softmax(zt / 2, -1) - F.log_softmax(zs / 2, -1))).sum(-1).mean()
    torch.testing.assert_close(kl.loss(out, batch, 0.0), expected)
    torch.testing.assert_close(kl(out, batch, 0.0), 0.5 * expected)  # forward applies the weight
    torch.testing.assert_close(ms(out, batch, 0.0), F.mse_loss(ms.head(out.embedding), batch["ce1.logits"]))
    assert soft_kl(zt, F.softmax(zt, -1)).abs().item() < 1e-6


def test_projection_when_widths_differ_and_pair_store_columns() -> None:
    m = manifest(pairs=True)
    (same,) = build_objectives(["cosine"], student_cfg(out_dim=D), m)
    (proj,) = build_objectives(["mse"], student_cfg(out_dim=4), m, target="bi.mean")
    assert same.proj is None and proj.proj.weight.shape == (D, 4)
    assert same.columns() == ["bi.sentence_a", "bi.sentence_b"] and proj.columns() == ["bi.mean_a", "bi.mean_b"]
    (con,) = build_objectives(["contrastive"], student_cfg(), m)
    assert con.columns() == ["bi.layers_a", "bi.layers_b", "pos"] and con.bank.vectors.shape[0] == 128  # 2 sides x 64
    assert con.phi_t.in_features == L * D  # embeddings layer left out by default
    (pair,) = build_objectives(["pair"], student_cfg(), m)
    assert pair.columns() == ["ce0.logits", "label"]


# --------------------------------------------------------------------------------------------------
# Errors a user can act on


def test_errors() -> None:
    cfg = student_cfg()
    with pytest.raises(KdError, match=r"bi\.nope is not in the store[\s\S]*bi\.sentence"):
        build_objectives(["cosine"], cfg, manifest(), target="bi.nope")
    with pytest.raises(KdError, match="teacher 'zz' is not in the store"):
        build_objectives(["cosine"], cfg, manifest(), target="zz.sentence")
    with pytest.raises(KdError, match="not one vector per text"):
        build_objectives(["cosine"], cfg, manifest(), target="bi.layers")
    with pytest.raises(KdError, match="needs a pair store"):
        build_objectives(["pair"], cfg, manifest())
    with pytest.raises(KdError, match="at least 2 teachers with logits"):
        build_objectives(["multi-teacher"], cfg, manifest(pairs=True, cross_encoders=1))
    with pytest.raises(KdError, match="no teacher in the store has it"):
        build_objectives(["logits"], cfg, manifest(cross_encoders=0))
    with pytest.raises(KdError, match=r"unknown objective 'kd'[\s\S]*multi-teacher"):
        parse_objective("kd:1")
    with pytest.raises(KdError, match="no option 'temperature'"):
        build_objectives(["contrastive:1:temperature=2"], cfg, manifest())
    with pytest.raises(KdError, match="not a valid"):
        build_objectives(["logits:1:mode=l1"], cfg, manifest())
    with pytest.raises(KdError, match="weight is not a number"):
        parse_objective("cosine:x")


def test_specs_round_trip_and_total_loss() -> None:
    spec = parse_objective("contrastive:0.1:tau=0.2:negatives=16")
    assert str(spec) == "contrastive:0.1:tau=0.2:negatives=16" and parse_objective(str(spec)) == spec
    m = manifest()
    objs = build_objectives(["cosine:0.5", spec], student_cfg(), m, target="bi.sentence")
    assert [o.spec for o in objs] == ["cosine:0.5", "contrastive:0.1:tau=0.2:negatives=16"]
    assert objs[1].tau == 0.2 and objs[1].negatives == 16 and all(isinstance(o, Objective) for o in objs)
    model = build_student(student_cfg())
    batch = make_batch(m)
    out = run(model, batch)
    for o in objs:
        o.eval()
    total, parts = total_loss(objs, out, batch, 0.0)
    assert set(parts) == {"cosine:0.5", "contrastive:0.1:tau=0.2:negatives=16"}
    torch.testing.assert_close(total, 0.5 * objs[0].loss(out, batch, 0) + 0.1 * objs[1].loss(out, batch, 0))


def test_label_objective_and_codir_fine_tuning_stage() -> None:
    """--objective label --objective logits --objective contrastive: CoDIR eq. 1, CE + a1 KD + a2 CRD."""
    m = manifest(label="int64")
    label, logits, crd = build_objectives(["label", "logits:0.7", "contrastive:0.1:negatives=4"], student_cfg(), m)
    assert label.columns() == ["label"] and label.head.out_features == N_LABELS  # from ce0's label names
    assert set(required_columns([label, logits, crd])) == {"label", "ce0.logits", "bi.layers", "pos"}
    model = build_student(student_cfg())
    batch = make_batch(m)
    out = run(model, batch)
    torch.testing.assert_close(label(out, batch, 0.0), F.cross_entropy(label.head(out.embedding), batch["label"]))
    for o in (label, logits, crd):
        o.eval()
    total, _ = total_loss([label, logits, crd], out, batch, 0.0)
    torch.testing.assert_close(total, label.loss(out, batch, 0) + 0.7 * logits.loss(out, batch, 0)
                               + 0.1 * crd.loss(out, batch, 0))
    batch["label"][0] = -1  # unlabelled rows are left out of the cross-entropy
    torch.testing.assert_close(label(out, batch, 0.0),
                               F.cross_entropy(label.head(out.embedding)[1:], batch["label"][1:]))
    with pytest.raises(KdError, match="no label column"):
        build_objectives(["label"], student_cfg(), manifest(label=None))
    (score,) = build_objectives(["label"], student_cfg(), manifest(label="double"))
    assert score.head.out_features == 1


def test_sra_targets_cls_and_sra_kd_mixes_with_alpha() -> None:
    """SRA distils [CLS]: --target <teacher>.cls for any teacher storing it; SRA+KD: a CE + (1 - a) MSE."""
    from kd.common.tasks import Task
    from kd.student.finetune import FinetuneConfig, _mixed_loss

    (sra,) = build_objectives(["cosine:0.5"], student_cfg(), manifest(), target="ce1.cls")
    assert sra.columns() == ["ce1.cls"]
    z, y, kd = torch.tensor([[2.0, -1.0]]), torch.tensor([0]), torch.tensor([[1.0, 1.0]])
    ce, mse = F.cross_entropy(z, y), F.mse_loss(z, kd)
    cfg = FinetuneConfig("s", "classification", ["t.tsv"], "o", kd_store="k", kd_alpha=0.25)
    torch.testing.assert_close(_mixed_loss(z, y, kd, Task.classification, cfg), 0.25 * ce + 0.75 * mse)
    cfg = FinetuneConfig("s", "classification", ["t.tsv"], "o", kd_store="k", kd_weight=2.0)
    torch.testing.assert_close(_mixed_loss(z, y, kd, Task.classification, cfg), ce + 2.0 * mse)
    with pytest.raises(KdError, match="kd-alpha"):
        FinetuneConfig("s", "classification", ["t.tsv"], "o", kd_alpha=0.5)  # no kd store
