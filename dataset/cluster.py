"""Agglomerative clustering of a store's vectors (cosine distance, average linkage), as a derived table.

Distance is cosine distance d = 1 - cos; clusters merge while their average pairwise distance is
below `threshold` (scikit-learn `AgglomerativeClustering(metric="cosine", linkage="average",
distance_threshold=threshold)`), as in the news-clustering setting.

- n <= exact_max: exact average linkage (scipy, on distances computed with BLAS; O(n^2) memory:
  20k rows ~ 1.6 GB of condensed distances, twice that while scipy links them).
- larger: faiss-assisted, using that average linkage never merges across components of the
  graph "d(i, j) < threshold" (a merge needs average, hence minimum, distance below it), and
  that merges inside one component do not depend on other components:
    1. kNN graph with faiss (k neighbours per row, flat or ivf index on normalised vectors);
    2. keep edges with d < threshold; connected components (scipy.sparse.csgraph);
    3. exact average linkage inside each component of <= exact_max rows; a bigger component is
       clustered by AgglomerativeClustering with the kNN graph as connectivity, where the
       distance between clusters is averaged over kNN edges only.
  Approximation: a row with more than k neighbours under the threshold may lose edges, so two
  groups linked only through such edges stay apart (clusters can split, never wrongly merge,
  in step 2); step 3's fallback for huge components averages over graph edges, not all pairs.
  With k >= the largest cluster's size, components of <= exact_max rows give the exact result.
- Output table `derived/clusters-<view>-<column>`: id, cluster (int64, numbered by first row),
  shards aligned with texts; meta records the method and parameters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import pyarrow as pa
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.cluster import AgglomerativeClustering

from kd.common import bounds as B
from kd.common.options import with_options
from kd.dataset.cluster_config import ClusterConfig
from kd.dataset.index import IndexKind, make_index, normalize, read_vectors, vector_column
from kd.dataset.query import resolve_table, view_names
from kd.storage.store import Store, drop_table, open_writer


class Method(str, Enum):
    auto = "auto"  # exact when n <= exact_max, else knn
    exact = "exact"
    knn = "knn"


@dataclass
class ClusterSummary:
    table: str  # the derived table written
    rows: int
    clusters: int
    largest: int
    singletons: int
    method: str


def condensed_cosine_distances(x: np.ndarray, block: int = 1024) -> np.ndarray:
    """1 - cos for every pair i < j of normalised rows, in scipy's condensed order (float64).

    Computed with BLAS a block of rows at a time, so the peak is the condensed vector itself
    (n^2/2 doubles) rather than scipy pdist's slower per-pair loop or a full n x n matrix.
    """
    n = len(x)
    out = np.empty(n * (n - 1) // 2, dtype=np.float64)
    start = 0
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        d = 1.0 - x[lo:hi] @ x.T
        for i in range(lo, hi):
            row = d[i - lo, i + 1 :]
            out[start : start + len(row)] = row
            start += len(row)
    return np.clip(out, 0.0, 2.0, out=out)


def _average_linkage(x: np.ndarray, threshold: float, connectivity: csr_matrix | None = None) -> np.ndarray:
    """Flat clusters of average linkage on normalised rows, cut at mean distance < threshold.

    Without connectivity: scipy's linkage on BLAS-computed distances, cut where merge heights
    reach the threshold (the same clusters as scikit-learn's `distance_threshold`, which keeps
    merges strictly below it). With connectivity: scikit-learn, merges along graph edges only.
    """
    if len(x) == 1:
        return np.zeros(1, dtype=np.int64)
    if connectivity is not None:
        model = AgglomerativeClustering(n_clusters=None, metric="cosine", linkage="average",
                                        distance_threshold=threshold, connectivity=connectivity)
        return model.fit_predict(x).astype(np.int64)
    z = linkage(condensed_cosine_distances(x), method="average")
    # fcluster keeps merges with height <= t; the next float below the threshold makes it strict.
    return fcluster(z, t=np.nextafter(threshold, -np.inf), criterion="distance").astype(np.int64) - 1


def knn_graph(x: np.ndarray, k: int, kind: IndexKind = IndexKind.flat) -> tuple[np.ndarray, np.ndarray]:
    """k nearest neighbours of every normalised row (itself excluded): (positions, cosine distances)."""
    k = min(k + 1, len(x))
    sims, pos = make_index(x, kind).search(x, k)
    return pos, 1.0 - sims


def _relabel(labels: np.ndarray) -> np.ndarray:
    """Number clusters 0, 1, ... in order of their first row (deterministic across methods)."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse]


def _resolve_method(method: Method, n: int, exact_max: int) -> Method:
    method = Method(method)
    if method is Method.auto:
        return Method.exact if n <= exact_max else Method.knn
    return method


def agglomerative(
    x: np.ndarray, threshold: float, *, method: Method = Method.auto,
    exact_max: int = ClusterConfig.exact_max, k: int = ClusterConfig.k,  # the defaults of kd cluster's options
    knn_kind: IndexKind | None = None,
) -> np.ndarray:
    """Cluster ids (0..c-1, by first occurrence) of the rows of `x`; see the module docstring."""
    B.check("kd cluster options", ("--threshold", threshold, B.COSINE_DISTANCE),
            ("--exact-max", exact_max, B.EXACT_ROWS), ("-k", k, B.K))
    x = normalize(x)
    n = len(x)
    if _resolve_method(method, n, exact_max) is Method.exact:
        return _relabel(_average_linkage(x, threshold))
    kind = knn_kind or (IndexKind.flat if n <= 200_000 else IndexKind.ivf)
    pos, dist = knn_graph(x, k, kind)
    rows = np.repeat(np.arange(n), pos.shape[1])
    keep = (pos.reshape(-1) >= 0) & (dist.reshape(-1) < threshold)
    graph = csr_matrix((np.ones(keep.sum()), (rows[keep], pos.reshape(-1)[keep])), shape=(n, n))
    ncomp, comp = connected_components(graph, directed=False)
    labels = np.empty(n, dtype=np.int64)
    order = np.argsort(comp, kind="stable")
    bounds = np.flatnonzero(np.diff(comp[order])) + 1
    offset = 0
    for members in np.split(order, bounds):
        if len(members) <= exact_max:
            sub = _average_linkage(x[members], threshold)
        else:
            sub = _average_linkage(x[members], threshold, _component_graph(pos, members, n))
        labels[members] = sub + offset
        offset += int(sub.max()) + 1
    return _relabel(labels)


def _component_graph(pos: np.ndarray, members: np.ndarray, n: int) -> csr_matrix:
    """The kNN graph restricted to one component, re-indexed to its rows (symmetric)."""
    local = np.full(n, -1, dtype=np.int64)
    local[members] = np.arange(len(members))
    src = np.repeat(local[members], pos.shape[1])
    dst = local[np.clip(pos[members].reshape(-1), 0, None)]
    ok = (pos[members].reshape(-1) >= 0) & (dst >= 0)
    g = csr_matrix((np.ones(ok.sum()), (src[ok], dst[ok])), shape=(len(members), len(members)))
    return g + g.T


def cluster_table_name(store: Store, table: str, column: str) -> str:
    return f"derived/clusters-{view_names(store.manifest)[table]}-{column}"


def cluster_store(store_path: str | os.PathLike, table: str, column: str, threshold: float,
                  **options: Any) -> ClusterSummary:
    """`cluster` the store at `store_path`; `options` are `ClusterConfig`'s fields (method, exact_max, k)."""
    return cluster(ClusterConfig(store_path, table, column, threshold, **options))


with_options(cluster_store, ClusterConfig, ("store",))  # help(cluster_store) lists the config's keywords


def cluster(cfg: ClusterConfig) -> ClusterSummary:
    """Cluster a vector column and write `derived/clusters-<view>-<column>` (the `kd cluster` command).

    - Reads the column in shard order, clusters, writes one shard per source shard (same ids, order).
    - Re-running replaces the table: its manifest entry is dropped first, because the manifest
      refuses a table whose settings or shard contents change under the same name.
    """
    store_path, column, threshold, method, exact_max, k = (cfg.store, cfg.column, cfg.threshold, cfg.method,
                                                           cfg.exact_max, cfg.k)
    store = Store.open(store_path, content=True)
    table = resolve_table(store, cfg.table)
    vector_column(store, table, column)
    ids, x, sizes = read_vectors(store, table, column)
    labels = agglomerative(x, threshold, method=method, exact_max=exact_max, k=k)
    used = _resolve_method(method, len(x), exact_max)
    name = cluster_table_name(store, table, column)
    meta = {
        "source_table": table, "column": column, "threshold": threshold, "metric": "cosine", "linkage": "average",
        "method": used.value, "exact_max": exact_max, "k": k if used is Method.knn else None,
        "clusters": int(labels.max()) + 1 if len(labels) else 0,
    }
    writer_id = "cluster-" + name.split("/", 1)[1]
    drop_table(store.loc, name)
    w = open_writer(store_path, store.manifest, writer_id)
    try:
        w.manifest.tables.pop(name, None)
        w.declare(name, "derived", {"id": "int64", "cluster": "int64"}, meta)
        start = 0
        for k_shard, rows in enumerate(sizes):
            part = pa.table({"id": pa.array(ids[start:start + rows]), "cluster": pa.array(labels[start:start + rows])})
            w.commit(name, k_shard, part)
            start += rows
        w.publish()
    finally:
        w.close()
    counts = np.bincount(labels)
    return ClusterSummary(name, len(labels), len(counts), int(counts.max()), int((counts == 1).sum()), used.value)
