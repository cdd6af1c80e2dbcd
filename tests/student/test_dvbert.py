"""DvBERT with one-logit (regression) cross-encoders: the STS stage, never an identically zero loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from objective_batches import make_batch, manifest, run, student_cfg
from single_thread import one_thread  # noqa: F401  (autouse: this module runs on one thread)
from student_stores import cross_encoder_pairs

from kd.common.errors import KdError
from kd.storage.manifest import Manifest
from kd.storage.schema import VectorDType, vector_type
from kd.student import trainer as T
from kd.student.models import build_student
from kd.student.objectives import MultiTeacher, build_objectives


def score_store(label: str | None = "double") -> Manifest:
    """Pairs scored by two regression cross-encoders (one logit each), with STS-like score labels."""
    m = manifest(pairs=True, label=label)
    for k in range(2):
        m.tables[f"teachers/ce{k}"].columns["logits"] = str(vector_type((1,), VectorDType.float32))
        m.tables[f"teachers/ce{k}"].meta["label_names"] = None
    return m


def score_batch(m: Manifest) -> dict[str, torch.Tensor]:
    batch = make_batch(m)
    for k in range(2):
        batch[f"ce{k}.logits"] = batch[f"ce{k}.logits"][:, :1]
    if "label" in batch:
        batch["label"] = 5 * batch["label"]  # STS-B scores lie in [0, 5]
        batch["label"][0] = float("nan")  # an unlabelled pair keeps the teachers' scores
    return batch


def _targets(batch: dict[str, torch.Tensor], lam: float) -> list[torch.Tensor]:
    """Each teacher's annealed target: lam * gold + (1 - lam) * score; the unlabelled row 0 keeps the score."""
    gold = batch["label"].float()
    return [torch.cat([batch[f"ce{k}.logits"][:1, 0], lam * gold[1:] + (1 - lam) * batch[f"ce{k}.logits"][1:, 0]])
            for k in range(2)]


@pytest.mark.parametrize("score", ["cosine", "linear"])
def test_one_logit_teachers_give_a_nonzero_loss_and_gradient(score: str) -> None:
    m = score_store()
    (obj,) = build_objectives([f"multi-teacher:1:score={score}"], student_cfg(), m)
    assert isinstance(obj, MultiTeacher) and obj.regression and obj.columns() == ["ce0.logits", "ce1.logits", "label"]
    model = build_student(student_cfg())
    batch = score_batch(m)
    out = run(model, batch)
    loss = obj(out, batch, 0.0)
    loss.backward()
    assert loss.item() > 0.01
    assert sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None) > 0  # reaches the student
    u, v = (o.embedding.detach() for o in out)
    if score == "cosine":
        # the paper's STS score: cos(u, v), through an affine map fitted to the first batch's targets
        assert obj.head is None and bool(obj.calibrated)
        cos = F.cosine_similarity(u, v, dim=-1)
        y = obj.affine.weight[0, 0].detach() * cos + obj.affine.bias[0].detach()
        target = torch.stack(_targets(batch, 0.0)).mean(0)
        assert y.mean().item() == pytest.approx(target.mean().item(), abs=1e-4)
        assert y.std(unbiased=False).item() == pytest.approx(target.std(unbiased=False).item(), rel=1e-3)
    else:
        assert obj.affine is None
        y = obj.head(torch.cat([u, v, (u - v).abs()], -1))[:, 0].detach()
    with torch.no_grad():
        for lam in (0.0, 0.5, 1.0):  # teachers only, the annealed mix, the gold score
            expect = sum(F.mse_loss(y, t) for t in _targets(batch, lam))
            torch.testing.assert_close(obj(out, batch, lam), expect)


def test_one_logit_teachers_without_labels_still_learn_from_the_scores() -> None:
    m = score_store(label=None)
    (obj,) = build_objectives(["multi-teacher"], student_cfg(), m)
    assert obj.columns() == ["ce0.logits", "ce1.logits"]
    batch = score_batch(m)
    assert obj(run(build_student(student_cfg()), batch), batch, 1.0).item() > 0.1


def test_gold_labels_of_the_wrong_kind_are_clear_errors() -> None:
    with pytest.raises(KdError, match="score cannot be annealed toward a class"):
        build_objectives(["multi-teacher"], student_cfg(), score_store(label="int64"))
    with pytest.raises(KdError, match="class distribution cannot be annealed toward a score"):
        build_objectives(["multi-teacher"], student_cfg(), manifest(pairs=True, label="double"))


def test_logits_with_a_one_logit_teacher_is_never_a_zero_kl() -> None:
    m = score_store(label=None)
    (obj,) = build_objectives(["logits"], student_cfg(), m)
    assert obj.mode.value == "mse"
    batch = score_batch(m)
    assert obj(run(build_student(student_cfg()), batch), batch, 0.0).item() > 0.01
    with pytest.raises(KdError, match="always 0"):
        build_objectives(["logits:1:mode=kl"], student_cfg(), m)


# --------------------------------------------------------------------------------------------------
# Annealing vs validation: every checkpoint is validated at the final lambda


@pytest.fixture(scope="module")
def two_teacher_pairs(tmp_path_factory, tiny_cross_encoder) -> Path:
    from conftest import build_tiny_bert

    root = tmp_path_factory.mktemp("ce-pairs")
    other = build_tiny_bert(root / "ce-other", num_labels=3, seed=2)
    return cross_encoder_pairs(root, {"ce0": tiny_cross_encoder, "ce1": other})


def test_validation_uses_the_final_lambda_so_early_stopping_compares_like_with_like(two_teacher_pairs, tmp_path):
    # lr 0: the weights never change, so every validation must report the same loss; at the current
    # lambda (the old behaviour) the loss would move with the annealing schedule alone
    out = T.train(T.TrainConfig(str(two_teacher_pairs), str(tmp_path / "dv"), embed_dim=8, hidden_dim=8,
                                objectives=["multi-teacher"], lr=0.0, eval_every=1, patience=3, max_steps=8,
                                batch_size=8, val_percent=20, progress=False, bucket=False))
    vals = [json.loads(x)["val_loss"] for x in (out / "metrics.jsonl").read_text().splitlines() if "val_loss" in x]
    assert len(vals) == 4 and max(vals) - min(vals) < 1e-6
    info = json.loads((out / "config.json").read_text())
    assert info["stopped_early"] and info["best_step"] == 1 and info["steps"] == 4


def test_regression_stage_learns() -> None:
    torch.manual_seed(0)
    m = score_store()
    (obj,) = build_objectives(["multi-teacher"], student_cfg(), m)
    model = build_student(student_cfg())
    batch = score_batch(m)
    batch["ce1.logits"] = batch["ce0.logits"] + 0.1  # teachers that (nearly) agree: the loss can approach 0
    opt = torch.optim.Adam([*model.parameters(), *obj.parameters()], lr=1e-2)
    losses = []
    for _ in range(40):
        loss = obj(run(model, batch), batch, 0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::8]


# --- DSE's f(u, v) with a cosine residual (pair:head=residual) -----------------------------------------------

def _pair(head: str, seed: int = 0):
    torch.manual_seed(seed)
    m = score_store(label=None)
    (obj,) = build_objectives([f"pair:teacher=ce0:head={head}"], student_cfg(), m)
    return obj, build_student(student_cfg()), score_batch(m)


def test_residual_pair_head_starts_as_the_calibrated_cosine():
    obj, model, batch = _pair("residual")
    out = run(model, batch)
    obj(out, batch, 0.0)  # the first training batch calibrates a, b
    from kd.student.objectives.base import head_input

    cos = F.cosine_similarity(out[0].embedding, out[1].embedding, dim=-1).detach()
    f = (obj.head(head_input(out, product=True)) + obj.affine(cos.unsqueeze(1)))[:, 0].detach()
    target = batch["ce0.logits"][:, 0]
    assert torch.allclose(f, obj.affine.weight[0, 0] * cos + obj.affine.bias[0])  # the MLP adds 0 at the start
    assert obj.affine.weight.item() > 0
    assert f.mean().item() == pytest.approx(target.mean().item(), abs=1e-4)  # matched moments
    assert f.std(unbiased=False).item() == pytest.approx(target.std(unbiased=False).item(), rel=1e-3)
    with pytest.raises(KdError, match="unknown pair head"):
        build_objectives(["pair:teacher=ce0:head=cosine"], student_cfg(), score_store(label=None))


def test_residual_pair_head_teaches_the_embeddings_the_score():
    """The point of head=residual: the cosine of the student's own u, v comes to rank pairs like the teacher;
    the paper's MLP head can fit the scores while the embeddings' cosine stays uninformative."""
    from scipy.stats import spearmanr

    rho = {}
    for head in ("mlp", "residual"):
        obj, model, batch = _pair(head)
        opt = torch.optim.Adam([*model.parameters(), *obj.parameters()], lr=1e-2)
        for _ in range(60):
            loss = obj(run(model, batch), batch, 0.5)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            a, b = run(model, batch)
            cos = F.cosine_similarity(a.embedding, b.embedding, dim=-1)
        rho[head] = spearmanr(cos.numpy(), batch["ce0.logits"][:, 0].numpy()).statistic
    assert rho["residual"] > 0.9 and rho["residual"] > rho["mlp"] + 0.2, rho
