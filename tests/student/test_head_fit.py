"""The head's least-squares start (student.head_fit, `--head-init`): the closed form recovers a linear
target exactly, is chosen by `auto` only where it applies, refuses heads it cannot fit, and in a real
cross-teacher run (tiny BERTs of two widths) starts training below where a random head ends."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import two_teacher_store
from single_thread import one_thread  # noqa: F401  (autouse)
from two_teacher_store import train

from kd.common.errors import InputError
from kd.student.head_fit import fit_head, wants_fit
from kd.student.models import StudentConfig, build_student
from kd.student.train_config import HeadInit

# module fixtures (this module's own): the cross-teacher tests' two teachers and their store
teachers, store = two_teacher_store.teachers, two_teacher_store.store


def _student(arch: str = "transformer", out_dim: int = 24, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_student(StudentConfig(arch=arch, vocab_size=50, embed_dim=16, hidden_dim=16, out_dim=out_dim,
                                       num_layers=1, max_length=12, dropout=0.0, **kw))


def _batches(student, fn, n: int = 40, rows: int = 16):
    """Random token batches whose target is fn(pooled vector): a map the head can represent exactly."""
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        ids = torch.randint(1, 50, (rows, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[:, 8:] = torch.randint(0, 2, (rows, 4), generator=g)
        with torch.no_grad():
            x = student.pooled(ids, mask)
        yield {"input_ids": ids, "attention_mask": mask, "t.sentence": fn(x)}


def test_fit_recovers_an_affine_target_and_beats_the_random_head():
    s = _student()
    a, c = torch.randn(16, 24, generator=torch.Generator().manual_seed(2)), torch.randn(24)
    fit = fit_head(s, _batches(s, lambda x: 3.0 * (x @ a + c)), "t.sentence", rows=400, ridge=1e-9)
    assert fit.rows == 400  # stops at the first batch past `rows`
    assert fit.before > 0.3 and fit.after < 1e-6, fit
    ids = torch.randint(1, 50, (5, 12))
    got = s(ids, torch.ones_like(ids)).embedding
    want = s.pooled(ids, torch.ones_like(ids)) @ a + c  # the scale of a target does not matter to cosine
    assert torch.nn.functional.cosine_similarity(got, want).min() > 0.9999


def test_a_bias_free_head_fits_without_an_intercept():
    s = _student("static")
    assert s.head.bias is None
    a = torch.randn(16, 24, generator=torch.Generator().manual_seed(3))
    fit = fit_head(s, _batches(s, lambda x: x @ a), "t.sentence", rows=300, ridge=1e-9)
    assert fit.after < 1e-6
    x = s.pooled(torch.tensor([[3, 4, 5]]), torch.ones(1, 3))
    assert torch.nn.functional.cosine_similarity(s.head(x), x @ a).item() > 0.9999


def test_ridge_shrinks_toward_zero_on_few_rows():
    """With fewer rows than pooled dims the plain normal equations are singular; ridge keeps it solvable."""
    s = _student()
    fit = fit_head(s, _batches(s, lambda x: torch.randn(len(x), 24), n=1, rows=8), "t.sentence", rows=8)
    assert fit.rows == 8 and np.isfinite(fit.after) and np.isfinite(s.head.weight.detach().numpy()).all()


def test_auto_picks_the_fit_only_for_a_fresh_transformer_init_style_linear_head():
    lin = _student()
    assert not wants_fit(HeadInit.auto, lin, False, True)  # a transformer from scratch: its features are random
    lin.config.arch = type(lin.config.arch)("transformer-init")
    assert wants_fit(HeadInit.auto, lin, False, True)
    assert not wants_fit(HeadInit.auto, lin, True, True)  # --init: the head is already trained
    assert not wants_fit(HeadInit.auto, lin, False, False)  # no embedding target
    assert not wants_fit(HeadInit.random, lin, False, True)
    assert wants_fit(HeadInit.lstsq, _student(), False, True)


def test_lstsq_refuses_heads_it_cannot_fit():
    same = _student(out_dim=16)  # width == target width: no head at all
    with pytest.raises(InputError, match="not one linear layer"):
        wants_fit(HeadInit.lstsq, same, False, True)
    sra = _student("bilstm", sra_head=True)  # SRA's linear + tanh
    with pytest.raises(InputError, match="--head-init"):
        wants_fit(HeadInit.lstsq, sra, False, True)
    with pytest.raises(InputError, match="no embedding target"):
        wants_fit(HeadInit.lstsq, _student(), False, False)
    s = _student(out_dim=20)  # --out-dim other than the target's width
    with pytest.raises(InputError, match="maps to 20 dims"):
        fit_head(s, _batches(_student(), lambda x: x @ torch.ones(16, 24)), "t.sentence")


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_cross_teacher_run_starts_from_the_fit_and_a_resume_keeps_it(store, tmp_path, monkeypatch):
    from safetensors.numpy import load_file

    from kd.student import data as D

    common = ["--arch", "transformer-init", "--target", "big.mean", "--lr", "1e-3", "--checkpoint-every", "5"]
    fitted = train(store, tmp_path / "fit", *common, steps=10)
    assert fitted.exit_code == 0, fitted.output
    rec = _records(tmp_path / "fit")
    head = rec[0]["head_fit"]
    assert head["rows"] >= 64 and head["after"] < 0.5 * head["before"], head
    rand = train(store, tmp_path / "rand", *common, "--head-init", "random", steps=10)
    assert rand.exit_code == 0, rand.output
    assert "head_fit" not in _records(tmp_path / "rand")[0]
    fit_losses = [r["loss"] for r in rec if "loss" in r]
    rand_losses = [r["loss"] for r in _records(tmp_path / "rand") if "loss" in r]
    assert fit_losses[0] < min(rand_losses), (fit_losses, rand_losses)  # its start is below ten random-head steps
    assert json.loads((tmp_path / "fit" / "training_args.json").read_text())["head_init"] == "auto"
    # a smaller copy of it (--init-layers) counts as fresh: its head, fitted to the layer it lost, is fitted again
    shrunk = train(store, tmp_path / "shrunk", *common, "--init", str(tmp_path / "fit"), "--init-layers", "0", steps=1)
    assert shrunk.exit_code == 0, shrunk.output
    refit = _records(tmp_path / "shrunk")[0]["head_fit"]
    assert refit["after"] < refit["before"], refit

    real, calls = D.train_batches, []

    def crashing(*a, **kw):  # call 1 is the fit's pass; call 2 the training epoch, stopped after step 7
        calls.append(1)
        for n, b in enumerate(real(*a, **kw)):
            if len(calls) == 2 and n == 7:
                raise KeyboardInterrupt
            yield b

    monkeypatch.setattr(D, "train_batches", crashing)
    stopped = train(store, tmp_path / "again", *common, steps=10)
    assert stopped.exit_code == 130 and (tmp_path / "again" / "checkpoint.pt").exists()
    monkeypatch.setattr(D, "train_batches", real)
    resumed = train(store, tmp_path / "again", *common, steps=10)
    assert resumed.exit_code == 0, resumed.output
    assert sum("head_fit" in r for r in _records(tmp_path / "again")) == 1  # fitted once, restored on resume
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("fit", "again"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
