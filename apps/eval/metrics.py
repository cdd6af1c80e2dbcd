"""Quality measures of an encoder, as pure functions of embeddings and gold labels.

Every function takes numpy arrays and returns plain floats (or small dataclasses), so the same
code scores a teacher, a student and a baseline, and tests can check them by hand.
STS Spearman and probe accuracy are returned ×100, as papers report them; pair precision/recall/F1
come from `apps.eval.metrics_cluster.pair_f1` as fractions.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np

from kd.apps.eval.metrics_cluster import PairScores, pair_f1


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


# A collapsed encoder can still rank STS pairs by noise in the fourth decimal and score 59 (a BiLSTM that put every
# pair at cosine ~1.0 did): the number looks fine, only the scatter plot showed it. Healthy encoders spread STS-B
# pair cosines with a std of ~0.15-0.25 and keep different texts at a mean cosine well below 0.9. Judged against the
# teacher too: a student as narrow as an anisotropic teacher (raw mean pooling, a random test BERT) copied it well.
COLLAPSE_SPREAD = 0.05  # std of the STS pair cosines below this: every pair scores alike
COLLAPSE_MEAN_COS = 0.99  # mean cosine between different texts above this: near-constant vectors


@dataclass(frozen=True)
class Spread:
    pair_std: float | None  # std of the STS pair cosines (None: no pairs)
    mean_cos: float  # mean cosine between distinct rows of an even sample


def spread(vecs: np.ndarray, pair_cos: np.ndarray | None = None, sample: int = 256) -> Spread | None:
    """How far apart the vectors are, or None where that cannot be judged (non-finite input, under 2 rows; an
    empty cell says why)."""
    if not np.isfinite(vecs).all() or (pair_cos is not None and not np.isfinite(pair_cos).all()):
        return None
    rows = np.unique(np.linspace(0, len(vecs) - 1, num=min(sample, len(vecs))).round().astype(np.int64))
    if len(rows) < 2:
        return None
    x = normalize(vecs[rows])
    gram = x @ x.T
    mean = float((gram.sum() - np.trace(gram)) / (len(rows) * (len(rows) - 1)))
    std = float(np.std(pair_cos)) if pair_cos is not None and len(pair_cos) > 1 else None
    return Spread(std, mean)


def collapse(model: Spread | None, teacher: Spread | None = None) -> str | None:
    """Why a model's vectors look collapsed ("cos spread 0.010 (teacher 0.210)", "mean cos 0.998 between texts"),
    or None: past the absolute threshold and, given the teacher's spread, under half of it."""
    if model is None:
        return None
    t_std = teacher.pair_std if teacher is not None else None
    if _narrow(model.pair_std, t_std, COLLAPSE_SPREAD):
        return f"cos spread {model.pair_std:.3f}" + _versus(t_std)
    t_cos = teacher.mean_cos if teacher is not None else None
    if _narrow(1.0 - model.mean_cos, None if t_cos is None else 1.0 - t_cos, 1.0 - COLLAPSE_MEAN_COS):
        return f"mean cos {model.mean_cos:.3f} between texts" + _versus(t_cos)
    return None


def _narrow(value: float | None, teacher: float | None, limit: float) -> bool:
    """Below the absolute limit and, where the teacher's value is known, below half of it."""
    return value is not None and value < limit and (teacher is None or value < teacher / 2)


def _versus(teacher: float | None) -> str:
    return f" (teacher {teacher:.3f})" if teacher is not None else ""


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


def _finite_rows(*xs: np.ndarray) -> bool:
    return all(bool(np.isfinite(np.asarray(x, dtype=np.float64)).all()) for x in xs)


def best_threshold(sims: np.ndarray, labels: np.ndarray) -> float:
    """The cosine threshold (predict 1 when sim >= t) with the highest accuracy on these pairs.

    Every distinct cut is tried at once: sorted by similarity, descending, predicting the top j as positive
    is correct on (positives among the top j) + (negatives below it); cuts fall midway between distinct
    values. Ties in accuracy go to the highest threshold (the first cut found).
    """
    s = np.asarray(sims, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    pos_top = np.concatenate([[0], np.cumsum(y)])  # positives among the top j, j = 0..n
    neg_below = (~y).sum() - (np.arange(len(s) + 1) - pos_top)
    correct = pos_top + neg_below
    # A cut between j-1 and j is only possible where the values differ (ends always are).
    valid = np.concatenate([[True], s[:-1] > s[1:], [True]])
    j = int(np.flatnonzero(valid)[np.argmax(correct[valid])])
    if j == 0:
        return float(s[0] + 1.0)
    if j == len(s):
        return float(s[-1] - 1.0)
    return float((s[j - 1] + s[j]) / 2)


def binary_f1(pred: np.ndarray, gold: np.ndarray) -> float:
    """F1 of the positive class (0 when nothing is predicted or nothing is positive)."""
    pred, gold = np.asarray(pred).astype(bool), np.asarray(gold).astype(bool)
    tp = int((pred & gold).sum())
    return 2.0 * tp / max(int(pred.sum()) + int(gold.sum()), 1)


@dataclass(frozen=True)
class PairClassResult:
    """Pair classification by a cosine threshold chosen on train, scored on test (accuracy, F1 ×100)."""

    threshold: float
    train_accuracy: float
    accuracy: float
    f1: float


def pair_classification(train_sims: np.ndarray, train_y: np.ndarray, test_sims: np.ndarray,
                        test_y: np.ndarray) -> PairClassResult:
    """MRPC-style: the accuracy-best threshold on train, then accuracy and F1 (×100) on test at that threshold.

    NaN everywhere when a similarity is not finite (a damaged model): no threshold means anything then.
    """
    if not _finite_rows(train_sims, test_sims):
        return PairClassResult(*(float("nan"),) * 4)
    t = best_threshold(train_sims, train_y)
    train_acc = float(np.mean((np.asarray(train_sims) >= t) == np.asarray(train_y).astype(bool)))
    pred = np.asarray(test_sims) >= t
    gold = np.asarray(test_y).astype(bool)
    return PairClassResult(t, train_acc * 100.0, float(np.mean(pred == gold)) * 100.0, binary_f1(pred, gold) * 100.0)


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """cos(a_i, b_j) for every i, j, in float64."""
    return normalize(a).astype(np.float64) @ normalize(b).astype(np.float64).T


def matrix_pearson(x: np.ndarray, gold: np.ndarray) -> float:
    """Lee-style document similarity: Pearson ×100 between the cosine matrix of x and the gold matrix,
    over the upper triangle (each pair once, the diagonal left out). NaN for constant similarities."""
    from scipy.stats import pearsonr

    gold = np.asarray(gold, dtype=np.float64)
    if gold.shape != (len(x), len(x)):
        raise ValueError(f"gold matrix {gold.shape} for {len(x)} rows")
    iu = np.triu_indices(len(x), k=1)
    sims = cosine_matrix(x, x)[iu]
    if not np.isfinite(sims).all() or np.ptp(sims) == 0:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a near-constant input warns; the value is still defined
        return float(pearsonr(sims, gold[iu]).statistic) * 100.0


@dataclass(frozen=True)
class RetrievalScores:
    recall_at_k: float
    mrr: float
    k: int


def retrieval_scores(queries: np.ndarray, docs: np.ndarray, k: int = 10) -> RetrievalScores:
    """Query i's only relevant document is document i: recall@k and MRR by exact cosine search (numpy).

    A tie counts against the query: the rank is the number of documents scoring at least as high as the
    relevant one, so a collapsed model (every cosine equal) ranks last, not first. NaN for non-finite vectors.
    """
    if len(queries) != len(docs):
        raise ValueError(f"{len(queries)} queries for {len(docs)} documents")
    if not _finite_rows(queries, docs):
        return RetrievalScores(float("nan"), float("nan"), k)
    sims = cosine_matrix(queries, docs)
    ranks = (sims >= np.diag(sims)[:, None]).sum(axis=1)
    return RetrievalScores(float(np.mean(ranks <= k)), float(np.mean(1.0 / ranks)), k)
