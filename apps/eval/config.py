"""Every option of `kd eval`, declared once (flag, help, range, choices: kd.common.options), and the measures it
takes. Light to import: `kd --help` builds the command from these fields."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kd.common import bounds as B
from kd.common.errors import InputError
from kd.common.inputs import require_regular_file, two_columns
from kd.common.options import bounded, check_ranges, one_value_as_sequence, option
from kd.pipeline.teacher.resolve import TeacherSpec

Measure = B.Measure  # one definition: an Enum (typer takes no list of Literals for the repeatable --task)

# The evidence beyond STS-B (issue 39): each number beside the teacher's; STS-B on its test split.
SUITE = (Measure.sts, Measure.mrpc, Measure.lee, Measure.probe, Measure.cluster, Measure.documents,
         Measure.retrieval)
DEFAULT_MEASURES = (Measure.sts, Measure.agreement, Measure.neighbours, Measure.speed)


def expand_measures(measures: list[Measure] | list[str]) -> list[Measure]:
    """The measures asked for, `suite` replaced by its members, each once, in the order given."""
    out = [s for m in measures for s in (SUITE if Measure(m) is Measure.suite else (Measure(m),))]
    return list(dict.fromkeys(out))


@dataclass
class EvalConfig:
    """Every option of `kd eval`; the library-only fields (no flag) size the sets for tests and the demo."""

    students: list[str] = option(path=True, factory=list, flag="--student",
                                 help="Student folder (kd train-student --out); repeatable")
    # (a TeacherSpec: a caller that parsed it passes the value, not its text to parse again: kd distill's start model)
    teacher: str | TeacherSpec | None = option(None, help="Teacher to run (minilm | DIR | NAME=DIR); with --store: "
                                                          "one of its teachers. Neither: students are scored on the "
                                                          "gold-label tasks alone (agreement and neighbours need a "
                                                          "teacher)")
    store: str | None = option(None, remote=True,
                                help="Store whose teacher vectors are reused where it holds the texts")
    measures: list[Measure] = option(factory=lambda: list(DEFAULT_MEASURES), flag="--task", choices=Measure,
                                     help="sts | probe | cluster | documents | agreement | neighbours | speed | mrpc | "
                                          "lee | retrieval | suite (sts, mrpc, lee, probe, cluster, documents, "
                                          "retrieval); repeatable")
    target: str | None = option(None, help="Teacher output compared with (default: the teacher's default_target)")
    sts_split: str | None = option(None, choices=B.StsSplit, help="STS-B split: train | dev | test (default: dev; "
                                                                  "test with --task suite)")
    pairs: str | None = option(None, path=True, help="A scored pair file (.tsv/.csv/.jsonl) instead of STS-B")
    score_column: str | None = option(None, help="Gold score column of --pairs (name, or 0-based index)")
    text_columns: tuple[str, ...] | None = option(None, comma=True, help="The two text columns of --pairs: A,B")
    max_pairs: int | None = option(None, range=B.ROWS, help="Use only the first N pairs (of STS and of each MRPC "
                                                            "split)")
    cluster_set: str = option("news-articles", choices=B.ClusterSet, help="news-articles | brown-genres | "
                                                                          "brown-documents (--task cluster)")
    cluster_scale: float = bounded(1.0, B.SAMPLE)  # the share of each cluster set used
    probe_train_rows: int = bounded(4000, B.ROWS)
    retrieval_articles: int | None = bounded(None, B.EXACT_ROWS)  # None: the bundled sample's (apps.eval.tasks)
    agreement_rows: int = option(10000, range=B.AGREEMENT_ROWS, help="Store rows (or texts) for agreement and "
                                                                     "neighbours")
    agreement_texts: str | None = option(None, path=True, help="Text file (one a line) for agreement without --store")
    k: int = option(10, range=B.K, help="Neighbours compared per text")
    speed_b1: int = bounded(128, B.BATCH)
    speed_big: int = bounded(1024, B.BATCH)
    baseline: bool = option(True, help="Add a model2vec baseline when model2vec is installed")
    baseline_dir: str | None = option(None, path=True, help="A model2vec model already distilled from the teacher")
    threads: int | None = option(None, range=B.THREADS, help="Torch threads (default: all, or 1 when the CPUs "
                                                             "are busy)")
    json_path: str | None = option(None, flag="--json", help="Write the report as JSON")
    markdown_path: str | None = option(None, flag="--markdown", help="Write the table as Markdown")
    plot_dir: str | None = option(None, flag="--plot", help="Folder for PNG plots")
    overwrite: bool = option(False, help="Replace --json/--markdown/--plot files written by kd")
    cache: bool = option(True, help="Reuse the teacher's vectors and speed of earlier calls (kd cache folder)")
    progress: bool = option(True, help="Show progress bars")

    def __post_init__(self) -> None:
        one_value_as_sequence(self)
        check_ranges(self, "kd eval options")
        self.measures = [Measure(m) for m in self.measures]
        if self.sts_split is not None:
            B.check_choice("--sts-split", self.sts_split, B.StsSplit, "STS-B split")
        if self.text_columns is not None:
            self.text_columns = two_columns(self.text_columns, "--text-columns")
        for flag, path in (("--agreement-texts", self.agreement_texts), ("--pairs", self.pairs)):
            if path is not None and os.path.exists(path):  # before any model loads: a named pipe would block the read
                require_regular_file(path, flag)
        if self.store and self.agreement_texts:  # with a store, agreement is measured on its rows: the file unread
            raise InputError("--agreement-texts is for runs without --store (a store's own rows are its agreement "
                             "texts)", self.agreement_texts, "drop --agreement-texts, or --store")
