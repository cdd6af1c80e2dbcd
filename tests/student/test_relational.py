"""The relational objective: the student's in-batch similarity matrix regressed to the teacher's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kd.student.objectives.relational import relational_loss


def test_zero_when_the_student_is_the_teacher_up_to_scale_and_rotation():
    t = torch.randn(6, 8)
    q, _ = torch.linalg.qr(torch.randn(8, 8))
    s = 3.0 * t @ q  # a rotated, scaled copy has the same cosine structure
    assert relational_loss(s, t).item() == pytest.approx(0.0, abs=1e-6)
    assert relational_loss(s, t, "kl").item() == pytest.approx(0.0, abs=1e-6)


def test_hand_computed_value_on_three_rows():
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    t = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    c = 1 / np.sqrt(2)
    ss = np.array([[1, 0, c], [0, 1, c], [c, c, 1]])
    tt = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1]])
    off = ~np.eye(3, dtype=bool)
    assert relational_loss(s, t).item() == pytest.approx(((ss - tt)[off] ** 2).mean(), rel=1e-6)


def test_widths_may_differ_and_the_loss_falls_on_a_fixed_batch():
    torch.manual_seed(0)
    teacher = F.normalize(torch.randn(32, 16), dim=-1)
    x = teacher @ torch.randn(16, 16)  # the student sees a distorted copy of the teacher's space
    student = torch.nn.Linear(16, 8)
    opt = torch.optim.Adam(student.parameters(), lr=0.05)
    first = None
    for _ in range(100):
        loss = relational_loss(student(x), teacher)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_kl_form_weighs_each_rows_nearest_neighbours_where_mse_weighs_every_pair():
    # Two clusters of three: row 0's neighbours are row 1 (0.9) and row 2 (0.8); the clusters are orthogonal.
    # Student rows with a given Gram matrix are its Cholesky factor (the rows' dot products reproduce it).
    block = torch.tensor([[1.0, 0.9, 0.8], [0.9, 1.0, 0.75], [0.8, 0.75, 1.0]], dtype=torch.float64)
    gram = torch.block_diag(block, block)
    swapped = gram.clone()  # row 0 ranks its two neighbours the wrong way round
    swapped[0, 1] = swapped[1, 0] = 0.8
    swapped[0, 2] = swapped[2, 0] = 0.9
    far = gram.clone()  # one pair across the clusters, no one's neighbour, 0 -> 0.2
    far[0, 5] = far[5, 0] = 0.2
    t = torch.linalg.cholesky(gram)

    def loss(g: torch.Tensor, mode: str) -> float:
        return relational_loss(torch.linalg.cholesky(g), t, mode).item()

    assert loss(far, "mse") == pytest.approx(2 * loss(swapped, "mse"), rel=1e-4)  # 0.2^2 vs 2 x 0.1^2
    assert loss(swapped, "kl") > 1e-4
    assert loss(far, "kl") < 1e-3 * loss(swapped, "kl")
