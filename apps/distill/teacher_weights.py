"""Several teachers' weights, chosen without training: on STS-B dev, from each teacher's vectors (issue 51).

The combined target's cosine between two texts is the weighted mean of the teachers' cosines (student.target), so
how good an ensemble is needs no student: score sum_i w_i cos_i(a, b) against STS-B dev's gold for every weight
vector on a grid (steps of 1/10 over the simplex: 11 candidates for two teachers, 66 for three) and keep the best.
Each teacher's dev vectors come from the per-machine cache that `kd eval` fills (apps.eval.cache), so after a
first run (~1 min for mpnet on 2 CPU cores) the choice takes well under a second. Dev only: test is never read.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kd.apps.eval import tasks
from kd.apps.eval.cache import TeacherCache
from kd.apps.eval.metrics import rowwise_cosine
from kd.apps.eval.models import teacher_model
from kd.common import progress as P
from kd.pipeline.teacher.resolve import TeacherRef, TeacherSpec
from kd.student.target import Target

STEPS = 10  # weights are multiples of 1/STEPS


@dataclass(frozen=True)
class WeightChoice:
    teachers: tuple[str, ...]
    weights: tuple[float, ...]  # the best on STS-B dev, summing to 1
    score: float  # its STS-B dev Spearman x100
    alone: dict[str, float]  # each teacher's own dev score
    candidates: dict[tuple[float, ...], float]  # every weight vector tried -> its dev score

    def target(self, column: str) -> str:
        """The train-student target these weights make: "mpnet.sentence:0.7,minilm.sentence:0.3"."""
        return str(Target.of(self.teachers, column, self.weights))

    def lines(self) -> list[str]:
        best = max(self.alone, key=self.alone.__getitem__)
        out = [f"{t} alone: STS-B dev {s:.2f}" for t, s in self.alone.items()]
        gain = self.score - self.alone[best]
        out.append(f"ensemble {' + '.join(f'{w:g} {t}' for t, w in zip(self.teachers, self.weights))}: STS-B dev "
                   f"{self.score:.2f} ({gain:+.2f} over {best}, the best alone; {len(self.candidates)} weightings "
                   "tried)")
        return out


def simplex(k: int, steps: int = STEPS) -> list[tuple[float, ...]]:
    """Every k-vector of non-negative multiples of 1/steps summing to 1."""
    return [tuple(c / steps for c in combo) for combo in itertools.product(range(steps + 1), repeat=k)
            if sum(combo) == steps]


def choose(names: list[str], cosines: np.ndarray, gold: np.ndarray) -> WeightChoice:
    """`cosines` [teachers, pairs]: each teacher's cosine of each dev pair; the best weighting by Spearman. A tie keeps
    the weighting with more weight on the teachers named first (the recipe's main teacher first)."""
    from scipy.stats import spearmanr

    def score(w: tuple[float, ...]) -> float:
        return float(spearmanr(np.asarray(w) @ cosines, gold).statistic) * 100.0

    grid = sorted(simplex(len(names)), reverse=True)  # (1, 0, ...) first
    candidates = {w: score(w) for w in grid}
    best = max(grid, key=candidates.__getitem__)
    alone = {n: candidates[tuple(float(i == j) for j in range(len(names)))] for i, n in enumerate(names)}
    return WeightChoice(tuple(names), best, candidates[best], alone, candidates)


def dev_cosines(vectors: Callable[[str, list[str]], np.ndarray], names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each teacher's cosine of every STS-B dev pair ([teachers, pairs]) and the gold scores; `vectors(name, texts)`
    gives a teacher's vectors of unique texts."""

    dev = tasks.load_stsb("dev")
    texts = list(dict.fromkeys([*dev.a, *dev.b]))
    row = {t: i for i, t in enumerate(texts)}
    out = []
    for name in names:
        v = vectors(name, texts)
        out.append(rowwise_cosine(v[[row[t] for t in dev.a]], v[[row[t] for t in dev.b]]))
    return np.stack(out), np.asarray(dev.scores, dtype=np.float64)


def cached_vectors(spec: TeacherSpec | TeacherRef, target: str, texts: list[str], progress: bool = True) -> np.ndarray:
    """A teacher's `target` vectors of `texts`: from the per-machine eval cache, else computed (fp32 torch, what
    `kd eval` runs) and cached."""

    cache = TeacherCache(spec, target)
    got = cache.vectors(texts)
    if got is not None:
        return got
    model = teacher_model(spec, target)
    with P.Bar(f"{model.name} on STS-B dev", len(texts), "texts", enabled=progress) as bar:
        vecs = model.encode(texts, progress=bar.advance)
    cache.put_vectors(texts, vecs)
    return vecs
