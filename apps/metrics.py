"""Quality measures of an encoder, as pure functions of embeddings and gold labels.

Every function takes numpy arrays and returns plain floats (or small dataclasses), so the same
code scores a teacher, a student and a baseline, and tests can check them by hand.
STS Spearman and probe accuracy are returned ×100, as papers report them; pair precision/recall/F1
come from `apps.metrics_cluster.pair_f1` as fractions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kd.apps.metrics_cluster import PairScores, pair_f1


def normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero), as float32."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def rowwise_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of a[i] and b[i] for every row i."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    return np.sum(normalize(a) * normalize(b), axis=1)


def sts_spearman(emb_a: np.ndarray, emb_b: np.ndarray, gold: np.ndarray) -> float:
    """STS score: Spearman rank correlation ×100 between cos(a_i, b_i) and the gold similarity.

    - cosine of each pair's two embeddings;
    - scipy.stats.spearmanr against the gold scores (ties get average ranks).
    """
    from scipy.stats import spearmanr

    sims = rowwise_cosine(emb_a, emb_b)
    rho = spearmanr(sims, np.asarray(gold, dtype=np.float64)).statistic
    return float(rho) * 100.0


def mean_cosine_agreement(student: np.ndarray, teacher: np.ndarray) -> float:
    """Mean over texts of cos(student_i, teacher_i): how close the student's vectors are to the targets.

    Only defined when both live in the same space (same dimension); returns NaN otherwise, because
    a student with its own output size was not trained to match the teacher coordinate-wise.
    """
    if student.shape != teacher.shape:
        return float("nan")
    return float(np.mean(rowwise_cosine(student, teacher)))


def nearest_neighbours(x: np.ndarray, k: int) -> np.ndarray:
    """Indices [n, k] of each row's k nearest other rows by cosine (faiss IndexFlatIP, exact).

    - rows are L2-normalised so inner product = cosine;
    - k+1 hits are fetched and the query itself is dropped (or the last hit when an exact
      duplicate outranked it), so a row is never its own neighbour.
    """
    import faiss

    xn = np.ascontiguousarray(normalize(x))
    n = xn.shape[0]
    if not 0 < k < n:
        raise ValueError(f"k must be in 1..{n - 1}, got {k}")
    index = faiss.IndexFlatIP(xn.shape[1])
    index.add(xn)
    _, idx = index.search(xn, k + 1)
    out = np.empty((n, k), dtype=np.int64)
    for i in range(n):
        row = idx[i]
        keep = row[row != i]
        out[i] = keep[:k]
    return out


def neighbour_recall(teacher: np.ndarray, student: np.ndarray, k: int = 10) -> float:
    """Neighbour agreement: mean over queries of |teacher top-k ∩ student top-k| / k.

    - exact cosine neighbours in each space (the dimensions may differ);
    - 1.0 for a student that orders neighbours like the teacher, about k/(n-1) for random vectors.
    """
    if teacher.shape[0] != student.shape[0]:
        raise ValueError("teacher and student must embed the same texts")
    t = nearest_neighbours(teacher, k)
    s = nearest_neighbours(student, k)
    hits = [len(np.intersect1d(t[i], s[i], assume_unique=True)) for i in range(t.shape[0])]
    return float(np.mean(hits)) / k


def average_linkage_tree(x: np.ndarray) -> np.ndarray:
    """Agglomerative clustering tree (scipy linkage matrix) by average linkage on cosine distance.

    One tree serves every threshold: cutting it at distance t gives the same clusters as
    `sklearn.cluster.AgglomerativeClustering(metric="cosine", linkage="average",
    distance_threshold=t)` (tests check this), so tuning does not recluster per candidate.
    """
    from scipy.cluster.hierarchy import linkage

    return linkage(normalize(x).astype(np.float64), method="average", metric="cosine")


def cut_tree(tree: np.ndarray, threshold: float) -> np.ndarray:
    """Flat cluster labels: merges with average cosine distance below `threshold` are kept."""
    from scipy.cluster.hierarchy import fcluster

    return fcluster(tree, t=threshold, criterion="distance")


def agglomerative(x: np.ndarray, threshold: float) -> np.ndarray:
    """Cluster rows of x: average linkage on cosine distance, cut at `threshold`."""
    return cut_tree(average_linkage_tree(x), threshold)


def tune_threshold(x: np.ndarray, gold: np.ndarray, candidates: int = 200) -> tuple[float, PairScores]:
    """Distance threshold that maximises pair-F1 on a dev split, and the dev scores there.

    - candidates are midpoints between quantiles of the tree's merge heights (so every
      distinct cut is reachable when candidates >= n);
    - ties are broken towards the smaller threshold (more, purer clusters).
    """
    tree = average_linkage_tree(x)
    heights = np.unique(tree[:, 2])
    if len(heights) > candidates:
        heights = np.unique(np.quantile(heights, np.linspace(0, 1, candidates)))
    cuts = np.concatenate([[heights[0] / 2], (heights[:-1] + heights[1:]) / 2, [heights[-1] + 1e-6]])
    gold_list = list(np.asarray(gold).tolist())
    best_t, best = float(cuts[0]), None
    for t in cuts:
        s = pair_f1(cut_tree(tree, float(t)).tolist(), gold_list)
        if best is None or s.f1 > best.f1:
            best_t, best = float(t), s
    assert best is not None
    return best_t, best


@dataclass(frozen=True)
class ClusterResult:
    """Clustering quality on the test split at the threshold tuned on dev (scores as fractions)."""

    threshold: float
    dev: PairScores
    test: PairScores
    num_clusters: int
    num_groups: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def cluster_quality(
    dev_x: np.ndarray, dev_gold: np.ndarray, test_x: np.ndarray, test_gold: np.ndarray
) -> ClusterResult:
    """Tune the cut on dev, then cluster test at that cut and score it with pair P/R/F1."""
    t, dev = tune_threshold(dev_x, dev_gold)
    pred = agglomerative(test_x, t)
    return ClusterResult(t, dev, pair_f1(pred.tolist(), np.asarray(test_gold).tolist()), int(len(np.unique(pred))),
                         int(len(np.unique(test_gold))))


def probe_accuracy(
    train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, c: float = 1.0
) -> float:
    """Linear probe: accuracy ×100 of a logistic regression trained on frozen embeddings.

    - inputs are L2-normalised and then standardised on the training split, so the same C
      suits encoders whose vectors have different scales;
    - sklearn LogisticRegression (lbfgs, C=`c`), scored on the test split.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))
    clf.fit(normalize(train_x), np.asarray(train_y))
    return float(np.mean(clf.predict(normalize(test_x)) == np.asarray(test_y))) * 100.0
