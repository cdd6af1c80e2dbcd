"""Supervised tasks shared by both stages: task kinds, labelled rows, label vocabularies, dev metrics.

A teacher fine-tuned in stage one (`kd finetune-teacher`) and a student fine-tuned in stage two
(`kd finetune`) must agree on what class index a label value has, or distilling one's logits into the
other is silently wrong; both take it from here.

- `read_task(files, task, spec)`: labelled texts or pairs, blank texts dropped exactly as
  `kd precompute` drops them, each row with the id precompute gives it (`common.ids.row_ids`).
- `LabelSet`: class names in index order. Integer labels sort numerically, so label value i is class
  i (what the student data loader assumes of an int64 label column); other labels sort as strings.
- `read_splits`, `fresh_output`: what both fine-tuning commands do before training. Labels that are
  NaN/Inf are refused with their file and row (one would make every weight NaN).
- `task_metrics`: Spearman and Pearson x 100 for scores; accuracy and F1 x 100 for classes (F1 of
  class 1 for two classes, macro F1 otherwise).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

from kd.common.errors import InputError, KdError
from kd.common.finite import non_finite_rows
from kd.common.ids import is_empty, row_ids
from kd.common.inputs import ColumnSpec, expand_inputs, read_inputs
from kd.common.outputs import COMMANDS, claim_output, locked_output


class Task(str, Enum):
    classification = "classification"  # one text -> a class
    pair_classification = "pair-classification"  # (a, b) -> a class (paraphrase, entailment)
    pair_regression = "pair-regression"  # (a, b) -> a score (semantic similarity)

    @property
    def pairs(self) -> bool:
        return self is not Task.classification

    @property
    def regression(self) -> bool:
        return self is Task.pair_regression

    @property
    def main_metric(self) -> str:
        return "spearman" if self.regression else "accuracy"


def parse_task(value: str | Task) -> Task:
    try:
        return Task(value)
    except ValueError:
        raise InputError(f"unknown task {value!r}", "--task",
                         f"use one of {', '.join(t.value for t in Task)}") from None


def task_columns(task: Task, text_column: str | None = None, pair_columns: str | None = None,
                 label_column: str | None = None, delimiter: str | None = None) -> ColumnSpec:
    """The columns to read for `task`; the label column defaults to "label"."""
    spec = ColumnSpec.from_options(text_column, pair_columns, label_column or "label", delimiter)
    if task.pairs and spec.pair is None:
        raise InputError(f"task {task.value} reads sentence pairs, and no --pair-columns was given", "--pair-columns",
                         "name the two columns: --pair-columns a,b (0-based indices for files without a header)")
    if not task.pairs and spec.pair is not None:
        raise InputError("task classification reads one text per row, but --pair-columns was given", "--task",
                         "use --task pair-classification / pair-regression, or --text-column")
    return spec


def canonical_label(value: object) -> str:
    """"1", 1, 1.0 and " 1 " are the same class; other values are their stripped strings."""
    text = str(value).strip()
    try:
        f = float(text)
        if f.is_integer():
            return str(int(f))
    except ValueError:
        pass
    return text


@dataclass
class TaskRows:
    texts: list  # str, or (a, b) tuples
    labels: list  # raw label values as read
    ids: np.ndarray  # int64, the ids kd precompute gives these rows (no dedup)
    doc_ids: list[str]

    def __len__(self) -> int:
        return len(self.texts)

    def scores(self) -> np.ndarray:
        """Labels as float scores (pair-regression); a label that is not a finite number is refused."""
        try:
            scores = np.array([float(x) for x in self.labels], dtype=np.float64)
        except ValueError:
            bad = next(i for i, x in enumerate(self.labels) if not _is_number(x))
            raise InputError(f"label {self.labels[bad]!r} is not a number", self.doc_ids[bad],
                             "pair-regression needs numeric scores; use --task pair-classification for classes") \
                from None
        self._refuse_non_finite(scores)
        return scores

    def _refuse_non_finite(self, values: np.ndarray) -> None:
        """NaN/Inf labels (a missing value written as "nan", an overflow) would make every weight NaN."""
        bad = non_finite_rows(values)
        if len(bad):
            raise InputError(f"{len(bad)} label(s) are not finite numbers (NaN/Inf), the first "
                             f"{self.labels[bad[0]]!r}", f"{self.doc_ids[bad[0]]} (file:row)",
                             "fix or drop those rows: one NaN/Inf label makes every weight of the model NaN")


def _is_number(x: object) -> bool:
    try:
        float(x)
        return True
    except (TypeError, ValueError):
        return False


def read_task(inputs: str | Sequence[str], task: Task, spec: ColumnSpec) -> TaskRows:
    """Read labelled rows (blank texts dropped, ids as kd precompute assigns them); every row needs a label."""
    files = expand_inputs([inputs] if isinstance(inputs, str) else list(inputs))
    rec = read_inputs(files, spec)
    keep = [i for i, t in enumerate(rec.texts) if not is_empty(t)]
    texts = [rec.texts[i] for i in keep]
    labels = [rec.labels[i] for i in keep]
    doc_ids = [rec.doc_ids[i] for i in keep]
    if not texts:
        raise InputError("no labelled text in the input", ", ".join(files),
                         "check the file and the --text-column / --pair-columns options")
    missing = [i for i, v in enumerate(labels) if v is None or str(v).strip() == ""]
    if missing:
        raise InputError(f"{len(missing)} row(s) have no label", doc_ids[missing[0]],
                         "fill in the label column or drop those rows")
    rows = TaskRows(texts, labels, row_ids(texts), doc_ids)
    if task.regression:
        rows.scores()  # fails early, naming the first row that is not a finite number
    else:  # a class named "nan"/"inf" is a missing or overflowed number, not a class
        rows._refuse_non_finite(np.array([float(v) if _is_number(v) else 0.0 for v in labels]))
    return rows


def read_splits(train: Sequence[str], dev: Sequence[str] | None, task: Task, text_column: str | None = None,
                pair_columns: str | None = None, label_column: str | None = None,
                delimiter: str | None = None) -> tuple[TaskRows, TaskRows | None]:
    """The training rows and, when dev files are given, the dev rows, read with the same columns."""
    spec = task_columns(task, text_column, pair_columns, label_column, delimiter)
    return read_task(train, task, spec), (read_task(dev, task, spec) if dev else None)


def fresh_output_dir(out: str, overwrite: bool, kind: str, inputs: Sequence[str | None | Sequence[str]]) -> Path:
    """An empty output folder for a fine-tuning command (`kind`: outputs.FINETUNE or outputs.TEACHER); with
    `overwrite` a previous output of that command is removed, never anything else (`outputs.claim_output`)."""
    flat = [p for i in inputs for p in ([i] if i is None or isinstance(i, str) else i)]
    path = claim_output(out, COMMANDS[kind], (kind,), flat, overwrite=overwrite, fresh=True, remove=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def fresh_output(out: str, overwrite: bool, kind: str, inputs: Sequence[str | None | Sequence[str]]) -> Iterator[Path]:
    """`fresh_output_dir`, removed again with what the run wrote into it when the run fails or is interrupted
    (a diverged loss, Ctrl-C), so no half-written output is left. The folder was empty (or this command's
    previous output, which --overwrite removes anyway): nothing of the user's goes with it. The folder is held
    (`outputs.locked_output`) for the whole run: a second run into it is refused, not interleaved."""
    flat = [p for i in inputs for p in ([i] if i is None or isinstance(i, str) else i)]
    claimed = claim_output(out, COMMANDS[kind], (kind,), flat, overwrite=overwrite, fresh=True)  # before the lock
    with locked_output(claimed, COMMANDS[kind]):
        path = fresh_output_dir(out, overwrite, kind, inputs)  # under the lock: a previous output removed
        try:
            yield path
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise


@dataclass(frozen=True)
class LabelSet:
    """Class names in index order."""

    names: tuple[str, ...]

    @classmethod
    def fit(cls, values: Sequence[object]) -> LabelSet:
        found = {canonical_label(v) for v in values}
        if len(found) < 2:
            raise InputError(f"classification needs at least two classes, the labels hold {sorted(found)}",
                             "--label-column", "check the label column, or use --task pair-regression for scores")
        ints = all(_is_int(n) for n in found)
        return cls(tuple(sorted(found, key=int) if ints else sorted(found)))

    def __len__(self) -> int:
        return len(self.names)

    @property
    def integer(self) -> bool:
        return all(_is_int(n) for n in self.names)

    def encode(self, values: Sequence[object], where: str = "labels") -> np.ndarray:
        """Class index of each value: by name, else (integer labels) the value itself when in range."""
        index = {n: i for i, n in enumerate(self.names)}
        canon = [canonical_label(v) for v in values]
        if all(c in index for c in canon):
            return np.array([index[c] for c in canon], dtype=np.int64)
        if all(_is_int(c) and 0 <= int(c) < len(self.names) for c in canon):
            return np.array([int(c) for c in canon], dtype=np.int64)
        unknown = sorted({c for c in canon if c not in index})
        raise KdError(f"labels {unknown[:5]} are not among the classes {list(self.names)}", where,
                      "use the label set the teacher was fine-tuned on (or integer labels 0..K-1)")

    def decode(self, indices: np.ndarray) -> np.ndarray:
        """Label values of class indices: int64 when every name is an integer, else strings."""
        idx = np.asarray(indices, dtype=np.int64)
        if self.integer:
            return np.array([int(n) for n in self.names], dtype=np.int64)[idx]
        return np.array(self.names, dtype=object)[idx]


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def task_metrics(task: Task, outputs: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Dev/test metrics x 100 from model outputs ([n] scores or [n, 1] for regression, [n, K] logits)."""
    out = np.asarray(outputs, dtype=np.float64)
    if task.regression:
        from scipy.stats import pearsonr, spearmanr

        pred = out.reshape(len(out), -1)[:, 0]
        g = np.asarray(gold, dtype=np.float64)
        if len(g) < 2 or np.ptp(pred) == 0 or np.ptp(g) == 0:
            return {"spearman": 0.0, "pearson": 0.0, "n": len(g)}
        return {"spearman": 100 * float(spearmanr(pred, g).statistic),
                "pearson": 100 * float(pearsonr(pred, g).statistic), "n": len(g)}
    from sklearn.metrics import accuracy_score, f1_score

    pred = out.argmax(-1) if out.ndim == 2 else out.astype(np.int64)
    g = np.asarray(gold, dtype=np.int64)
    k = out.shape[1] if out.ndim == 2 else int(max(pred.max(initial=0), g.max(initial=0)) + 1)
    f1 = f1_score(g, pred, average="binary" if k == 2 else "macro", zero_division=0)
    return {"accuracy": 100 * float(accuracy_score(g, pred)), "f1": 100 * float(f1), "n": len(g)}
