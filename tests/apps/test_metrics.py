"""apps.eval.metrics on cases whose answers are known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kd.apps.eval import metrics
from kd.apps.eval.metrics_cluster import pair_f1


@pytest.fixture(scope="module")
def teacher() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(500, 32)).astype(np.float32)


def test_rotated_student_has_perfect_neighbour_recall(teacher):
    # A rotation and rescaling keep every cosine, so the student's neighbours are the teacher's.
    q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(32, 32)))
    student = 3.0 * teacher @ q.astype(np.float32)
    assert metrics.neighbour_recall(teacher, student, k=10) == 1.0


def test_random_student_recall_is_near_chance(teacher):
    student = np.random.default_rng(2).normal(size=(500, 16))
    chance = 10 / 499
    assert metrics.neighbour_recall(teacher, student, k=10) < 3 * chance


def test_neighbours_never_include_the_query_even_with_duplicates():
    x = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.7, 0.7]], dtype=np.float32)
    nn = metrics.nearest_neighbours(x, 2)
    assert all(i not in nn[i] for i in range(4))
    assert set(nn[0]) == {1, 3} and set(nn[1]) == {0, 3}


def test_spearman_against_own_scores_is_100_and_random_is_near_0(teacher):
    a, b = teacher[:250], teacher[250:]
    gold = metrics.rowwise_cosine(a, b) * 5 + 2.5  # any increasing map of the cosines
    assert metrics.sts_spearman(a, b, gold) == pytest.approx(100.0)
    assert metrics.sts_spearman(a, b, -gold) == pytest.approx(-100.0)
    noise = np.random.default_rng(3).normal(size=250)
    assert abs(metrics.sts_spearman(a, b, noise)) < 20


def test_mean_cosine_agreement():
    x = np.random.default_rng(4).normal(size=(20, 8))
    assert metrics.mean_cosine_agreement(2 * x, x) == pytest.approx(1.0, abs=1e-6)
    assert metrics.mean_cosine_agreement(-x, x) == pytest.approx(-1.0, abs=1e-6)
    assert math.isnan(metrics.mean_cosine_agreement(x[:, :4], x))


def test_pair_f1_hand_case():
    # pred pairs: {0,1} + 3 in {2,3,4} = 4; gold pairs: 3 in {0,1,2} + {3,4} = 4; common: {0,1}, {3,4}.
    s = pair_f1([0, 0, 1, 1, 1], ["a", "a", "a", "b", "b"])
    assert (s.precision, s.recall, s.f1) == (0.5, 0.5, 0.5)


def _blobs(n_groups: int, per: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Centres on distinct random axes: cosine ~0 between groups, ~0.99 inside one.
    centres = np.eye(16)[rng.permutation(16)[:n_groups]] * 3
    x = np.repeat(centres, per, axis=0) + rng.normal(size=(n_groups * per, 16)) * 0.3
    return x, np.repeat(np.arange(n_groups), per)


def test_tree_cut_equals_sklearn_agglomerative():
    from sklearn.cluster import AgglomerativeClustering
    from sklearn.metrics import adjusted_rand_score

    x, _ = _blobs(6, 15, 5)
    for t in (0.05, 0.3, 0.9):
        ours = metrics.agglomerative(x, t)
        ref = AgglomerativeClustering(n_clusters=None, metric="cosine", linkage="average",
                                      distance_threshold=t).fit_predict(x)
        assert adjusted_rand_score(ours, ref) == 1.0


def test_cluster_quality_recovers_separated_groups_with_a_threshold_tuned_on_dev():
    dev_x, dev_y = _blobs(8, 10, 6)
    test_x, test_y = _blobs(12, 10, 7)
    res = metrics.cluster_quality(dev_x, dev_y, test_x, test_y)
    assert res.dev.f1 == 1.0 and res.test.f1 == 1.0
    assert res.num_clusters == res.num_groups == 12
    assert 0 < res.threshold < 1


def test_probe_accuracy_separable_and_random():
    rng = np.random.default_rng(8)
    y = rng.integers(0, 2, size=400)
    x = rng.normal(size=(400, 10))
    x[:, 0] += np.where(y == 1, 4.0, -4.0)  # one clearly separating direction
    assert metrics.probe_accuracy(x[:300], y[:300], x[300:], y[300:]) == 100.0
    noise = rng.normal(size=(400, 10))
    assert 30 < metrics.probe_accuracy(noise[:300], y[:300], noise[300:], y[300:]) < 70
