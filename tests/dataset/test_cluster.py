"""Clustering: known groups come back, the faiss-assisted path equals the exact one, pair-F1 by hand."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from store_builder import TableSpec, build_store, grouped_vectors, unit
from typer.testing import CliRunner

from kd.apps.eval.metrics_cluster import annotated_pair_f1, pair_f1
from kd.cli import app
from kd.common.errors import InputError
from kd.common.ids import row_ids
from kd.dataset.cluster import Method, agglomerative, cluster_store
from kd.dataset.query import connect
from kd.storage.store import Store


def same_partition(a, b) -> bool:
    return pair_f1(a, b).f1 == 1.0 and len(set(a)) == len(set(b))


def upgma_reference(x: list[list[float]], threshold: float) -> list[int]:
    """Textbook average linkage in plain Python: merge the closest pair while its mean distance < threshold."""
    def dist(u, v):
        return 1.0 - sum(p * q for p, q in zip(u, v)) / math.sqrt(sum(p * p for p in u) * sum(q * q for q in v))

    d = [[dist(u, v) for v in x] for u in x]
    clusters = [[i] for i in range(len(x))]
    while len(clusters) > 1:
        best, pair = math.inf, None
        for i, j in itertools.combinations(range(len(clusters)), 2):
            avg = sum(d[a][b] for a in clusters[i] for b in clusters[j]) / (len(clusters[i]) * len(clusters[j]))
            if avg < best:
                best, pair = avg, (i, j)
        if best >= threshold:
            break
        i, j = pair
        clusters[i] += clusters.pop(j)
    labels = [0] * len(x)
    for c, members in enumerate(clusters):
        for m in members:
            labels[m] = c
    return labels


@pytest.fixture(scope="module")
def groups():
    x, gold = grouped_vectors(8, 25, 32, spread=0.06, seed=3)
    perm = np.random.default_rng(0).permutation(len(x))
    return x[perm], gold[perm]


def test_exact_recovers_known_groups(groups):
    x, gold = groups
    labels = agglomerative(x, 0.5, method=Method.exact)
    assert same_partition(labels.tolist(), gold.tolist())
    assert labels[0] == 0 and sorted(set(labels.tolist())) == list(range(8))  # numbered by first row
    # a threshold below the within-group distances splits everything
    assert len(set(agglomerative(x, 0.01).tolist())) == len(x)


def test_average_linkage_matches_a_plain_python_reference():
    rng = random.Random(4)
    x = [[rng.gauss(0, 1) for _ in range(5)] for _ in range(36)]
    for threshold in (0.3, 0.5, 0.9):
        ref = upgma_reference(x, threshold)
        got = agglomerative(np.asarray(x, dtype=np.float32), threshold).tolist()
        assert same_partition(got, ref), threshold
        assert 1 < len(set(ref)) < len(x) - 10  # a non-trivial partition at each threshold


def test_knn_path_equals_exact_when_k_covers_the_clusters(groups):
    x, _ = groups
    noise = unit(np.random.default_rng(9).normal(size=(60, x.shape[1])))
    data = np.concatenate([x, noise])
    exact = agglomerative(data, 0.5, method=Method.exact)
    knn = agglomerative(data, 0.5, method=Method.knn, k=30)
    assert knn.tolist() == exact.tolist()  # same relabelling rule: identical arrays


def test_knn_path_with_components_above_exact_max(groups):
    x, gold = groups
    labels = agglomerative(x, 0.5, method=Method.knn, exact_max=10, k=15)  # connectivity-restricted fallback
    assert same_partition(labels.tolist(), gold.tolist())


def test_threshold_must_be_a_cosine_distance(groups):
    with pytest.raises(InputError, match="cosine distance"):
        agglomerative(groups[0], 0.0)


def test_cluster_table_is_aligned_and_queryable(tmp_path, groups, sentences):
    x, gold = groups
    n = len(x)
    path = tmp_path / "store"
    build_store(path, sentences[:n], {"teachers/minilm": TableSpec("teacher", {"sentence": x})},
                rows_per_shard=60)
    s = cluster_store(path, "minilm", "sentence", 0.5)
    assert (s.table, s.clusters, s.largest, s.singletons, s.method) == (
        "derived/clusters-minilm-sentence", 8, 25, 0, "exact")
    store = Store.open(path)
    rec = store.table(s.table)
    assert rec.kind == "derived" and rec.meta["threshold"] == 0.5 and rec.meta["linkage"] == "average"
    for k in range(store.manifest.num_shards):
        ids = store.read_shard("texts", k, ["id"]).column("id")
        assert store.read_shard(s.table, k, ["id"]).column("id").equals(ids)
    rows = connect(path).execute(
        "SELECT t.id, c.cluster FROM texts AS t JOIN clusters_minilm_sentence AS c USING (id) ORDER BY t.id"
    ).fetchall()
    order = np.argsort(row_ids(sentences[:n]))  # rows by id: content hashes
    assert same_partition([c for _, c in rows], gold[order].tolist())
    # re-running with other settings replaces the table (the manifest would refuse a silent change)
    s2 = cluster_store(path, "teachers/minilm", "sentence", 0.01, method="knn", k=5)
    assert s2.clusters == n and s2.method == "knn"
    m = Store.open(path).manifest
    assert m.tables[s.table].meta["threshold"] == 0.01
    assert connect(path).execute("SELECT count(DISTINCT cluster) FROM clusters_minilm_sentence").fetchone()[0] == n


def test_kd_cluster_cli(tmp_path, groups, sentences):
    x, _ = groups
    path = tmp_path / "store"
    build_store(path, sentences[: len(x)], {"students/bilstm": TableSpec("student", {"embedding": x})})
    r = CliRunner().invoke(app, ["cluster", str(path), "--table", "student_bilstm", "--column", "embedding",
                                 "--threshold", "0.5"])
    assert r.exit_code == 0, r.output
    assert "200 rows -> 8 clusters" in r.output and "derived/clusters-student_bilstm-embedding" in r.output
    r = CliRunner().invoke(app, ["cluster", str(path), "--table", "bilstm", "--column", "embedding",
                                 "--threshold", "0.5", "--method", "fast"])
    assert r.exit_code == 2 and all(f"'{m}'" in r.output for m in ("auto", "exact", "knn"))  # at parse time


# --- pair precision / recall / F1 -----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ([0, 0, 1, 1], [5, 5, 7, 7], (1.0, 1.0, 1.0)),
        ([0, 0, 0, 0], [0, 0, 1, 1], (2 / 6, 1.0, 0.5)),  # 6 predicted pairs, 2 gold, both gold ones found
        ([0, 1, 2, 3], [0, 0, 1, 1], (1.0, 0.0, 0.0)),  # nothing joined: vacuous precision, no recall
        (["a", "a", "b"], [1, 2, 2], (0.0, 0.0, 0.0)),
        ([0, 0, 0, 1], [0, 0, 1, 1], (1 / 3, 1 / 2, 0.4)),  # common (0,1); pred 3 pairs; gold 2 pairs
        ([0, 0, 0], [5, 5, None], (1.0, 1.0, 1.0)),  # unlabelled items are left out
    ],
)
def test_pair_f1_by_hand(pred, gold, expected):
    s = pair_f1(pred, gold)
    assert (s.precision, s.recall, s.f1) == pytest.approx(expected)


def test_pair_f1_equals_pair_enumeration():
    rng = random.Random(1)
    pred = [rng.randrange(6) for _ in range(80)]
    gold = [rng.randrange(4) for _ in range(80)]
    pairs = list(itertools.combinations(range(80), 2))
    p = {(i, j) for i, j in pairs if pred[i] == pred[j]}
    g = {(i, j) for i, j in pairs if gold[i] == gold[j]}
    s = pair_f1(pred, gold)
    assert (s.pred_pairs, s.gold_pairs, s.common_pairs) == (len(p), len(g), len(p & g))
    assert s.precision == pytest.approx(len(p & g) / len(p)) and s.recall == pytest.approx(len(p & g) / len(g))
    with pytest.raises(ValueError):
        pair_f1([0, 1], [0])


def test_annotated_pair_f1_counts_only_annotated_pairs():
    """The news paper's positive F1: pairs nobody annotated change nothing (issue 11 item 9)."""
    pred = ["x", "x", "x", "y", "y"]
    pairs = [(0, 1, True), (0, 3, True), (1, 2, False), (3, 4, True)]
    s = annotated_pair_f1(pred, pairs)
    # predicted together: (0,1) (1,2) (3,4); gold positives: (0,1) (0,3) (3,4); both: (0,1) (3,4)
    assert (s.pred_pairs, s.gold_pairs, s.common_pairs) == (3, 3, 2)
    assert s.precision == pytest.approx(2 / 3) and s.f1 == pytest.approx(2 / 3)
    full = pair_f1(pred, ["a", "a", "b", "a", "c"])  # a full partition counts every pair, e.g. (0, 2)
    assert full.f1 != s.f1
    with pytest.raises(ValueError, match="outside"):
        annotated_pair_f1(pred, [(0, 9, True)])
