"""The options of `kd cluster`, declared once (kd.common.options); `dataset.cluster.cluster_store` takes the same
keywords. Light to import: `kd --help` builds the command from these fields (dataset.cluster imports scipy, faiss)."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common import bounds as B
from kd.common.options import check_ranges, option


@dataclass(frozen=True)
class ClusterConfig:
    """Which vector column `kd cluster` clusters, and how (see dataset.cluster's docstring)."""

    store: str = option(argument=True, remote=True, help="Store folder")
    table: str = option(help="Table: view name (minilm) or path (teachers/minilm)")
    column: str = option(help="1-D vector column, e.g. sentence")
    threshold: float = option(range=B.COSINE_DISTANCE, help="Cosine distance (1 - cos) under which clusters merge")
    method: str = option("auto", choices=B.ClusterMethod, help="auto | exact | knn (faiss kNN graph, for big stores)")
    exact_max: int = option(20_000, range=B.EXACT_ROWS, help="Largest row count clustered exactly")
    k: int = option(30, flag="-k", range=B.K, help="Neighbours per row in the kNN graph")

    def __post_init__(self) -> None:
        check_ranges(self, "kd cluster options")
