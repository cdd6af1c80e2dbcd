"""Pair-counting agreement between a predicted and a gold clustering (news-story clustering metric).

Every unordered pair of items is a positive when both items share a cluster:
- precision = pairs together in both / pairs together in pred,
- recall    = pairs together in both / pairs together in gold,
- F1 their harmonic mean.
Computed from the contingency table (C(n, 2) per cell), so it is O(items), not O(items^2).
Conventions: items whose gold label is None are left out (unlabelled); with no predicted pairs
precision is 1.0 (nothing wrongly joined), with no gold pairs recall is 1.0; F1 is 0.0 when both
precision and recall are 0.

Two modes:
- `pair_f1` (full partition, what `kd eval` reports: its clustering sets give every item a gold
  cluster): every pair of labelled items counts;
- `annotated_pair_f1` (the news paper's "positive F1", Dialogue Evaluation 2021): only the pairs a
  person annotated (same event or not) count, as a binary classification of those pairs by "the
  clustering put both in one cluster"; pairs nobody annotated are neither right nor wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PairScores:
    precision: float
    recall: float
    f1: float
    pred_pairs: int
    gold_pairs: int
    common_pairs: int


def _pairs(n: int) -> int:
    return n * (n - 1) // 2


def pair_f1(pred: Sequence[Hashable], gold: Sequence[Hashable | None]) -> PairScores:
    """Pair precision/recall/F1 of cluster labels `pred` against `gold` (same length, any hashables)."""
    if len(pred) != len(gold):
        raise ValueError(f"pred has {len(pred)} items, gold {len(gold)}")
    kept = [(p, g) for p, g in zip(pred, gold) if g is not None]
    common = sum(_pairs(c) for c in Counter(kept).values())
    pred_pairs = sum(_pairs(c) for c in Counter(p for p, _ in kept).values())
    gold_pairs = sum(_pairs(c) for c in Counter(g for _, g in kept).values())
    precision = common / pred_pairs if pred_pairs else 1.0
    recall = common / gold_pairs if gold_pairs else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return PairScores(precision, recall, f1, pred_pairs, gold_pairs, common)


def annotated_pair_f1(pred: Sequence[Hashable], pairs: Sequence[tuple[int, int, bool]]) -> PairScores:
    """Positive-class precision/recall/F1 over annotated pairs (i, j, same) only: predicted positive when
    pred[i] == pred[j]. Same conventions as `pair_f1` for empty counts."""
    bad = [(i, j) for i, j, _ in pairs if not (0 <= i < len(pred) and 0 <= j < len(pred))]
    if bad:
        raise ValueError(f"annotated pair {bad[0]} refers to an item outside 0..{len(pred) - 1}")
    together = [(pred[i] == pred[j], bool(same)) for i, j, same in pairs]
    pred_pairs = sum(t for t, _ in together)
    gold_pairs = sum(s for _, s in together)
    common = sum(t and s for t, s in together)
    precision = common / pred_pairs if pred_pairs else 1.0
    recall = common / gold_pairs if gold_pairs else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return PairScores(precision, recall, f1, pred_pairs, gold_pairs, common)
