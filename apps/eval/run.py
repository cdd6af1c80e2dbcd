"""`kd eval`: teacher, students and an optional baseline side by side on the same inputs.

- One row per model, one column per measure (see docs/eval.md for each measure).
- Teacher vectors come from the store when it holds the evaluated texts (always for agreement
  and neighbours, which run on up to `agreement_rows` store rows), else from the kd cache of an
  earlier call (apps/eval/cache.py, `cache=False` bypasses it); otherwise the teacher is run.
- A student (or baseline) whose vectors collapsed (`metrics.collapse`, judged against the teacher's
  spread) is flagged: a `collapsed` reason in the JSON and beside its number in the table, since
  such a model can still post a plausible score.
- The same numbers feed the rich table, the JSON and the Markdown: cells are formatted by one
  function from the values the JSON holds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table

from kd.apps.eval import metrics, suite_tasks, tasks
from kd.apps.eval.cache import TeacherCache, texts_sha256
from kd.apps.eval.config import DEFAULT_MEASURES, SUITE, EvalConfig, Measure, expand_measures  # noqa: F401
from kd.apps.eval.corpus import demo_sentences
from kd.apps.eval.models import (
    EvalModel,
    model2vec_available,
    model2vec_baseline,
    model2vec_folder,
    student_model,
    teacher_model,
)
from kd.apps.eval.plots import PLOT_FILES, write_plots
from kd.apps.eval.speed import SizeResult, SpeedResult, measure_speed, picked_threads, speed_texts
from kd.apps.eval.store_teacher import StoreTeacher
from kd.common.errors import InputError
from kd.common.outputs import claim_output, sidecar, write_text, written_path
from kd.common.paths import local_path
from kd.common.progress import Bar, showing
from kd.pipeline.teacher.resolve import TeacherSpec, parse_teacher, resolve_teacher


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: str
    measure: Measure


COLUMNS = (
    Column("sts_spearman", "STS ρ×100", "{:.2f}", Measure.sts),
    Column("mrpc_accuracy", "MRPC acc", "{:.2f}", Measure.mrpc),
    Column("mrpc_f1", "MRPC F1", "{:.2f}", Measure.mrpc),
    Column("lee_pearson", "Lee r×100", "{:.2f}", Measure.lee),
    Column("probe_accuracy", "SST-2 probe acc", "{:.2f}", Measure.probe),
    Column("cluster_f1", "cluster pair-F1", "{:.2f}", Measure.cluster),
    Column("documents_f1", "doc cluster pair-F1", "{:.2f}", Measure.documents),
    Column("retrieval_recall", "title→article R@10", "{:.3f}", Measure.retrieval),
    Column("retrieval_mrr", "title→article MRR", "{:.3f}", Measure.retrieval),
    Column("cos_to_teacher", "cos to teacher", "{:.3f}", Measure.agreement),
    Column("neighbour_recall", "nbr recall@k", "{:.3f}", Measure.neighbours),
    Column("sent_per_s_b1", "sent/s b=1", "{:.0f}", Measure.speed),
    Column("sent_per_s_b256", "sent/s b=256", "{:.0f}", Measure.speed),
    Column("latency_ms", "ms/doc", "{:.2f}", Measure.speed),
    Column("params_m", "params M", "{:.2f}", Measure.speed),
    Column("embedding_params_m", "emb. params M", "{:.2f}", Measure.speed),
    Column("disk_mb", "MB", "{:.1f}", Measure.speed),
)


@dataclass
class ModelResult:
    name: str
    kind: str
    metrics: dict[str, float | None] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    empty: dict[str, str] = field(default_factory=dict)  # metric key -> why its cell is empty
    collapsed: tuple[str, str] | None = None  # (metric key whose cell is marked, why), see metrics.collapse

    def put(self, key: str, value: float, *vectors: np.ndarray) -> None:
        """Record one measure; when it is NaN, record why (non-finite vectors, or an undefined measure)."""
        self.metrics[key] = value
        if isinstance(value, float) and math.isnan(value):
            bad = sum(int((~np.isfinite(v)).any(axis=-1).sum()) for v in vectors)
            rows = sum(len(v) for v in vectors)
            self.empty[key] = (f"{bad} of {rows} vectors are NaN/Inf (a damaged model or store: kd validate)"
                               if bad else "undefined on these vectors (constant vectors or similarities)")

    def flag(self, key: str, why: str | None) -> None:
        """Mark the model collapsed (`why`, from metrics.collapse) beside measure `key`; the first finding stays."""
        if why and self.collapsed is None:
            self.collapsed = (key, why)


@dataclass
class EvalReport:
    models: list[ModelResult]
    columns: list[Column]
    info: dict[str, Any]
    sts_sims: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # for plots, not JSON

    def cell(self, row: ModelResult, col: Column) -> str:
        """The formatted value, or "—" with the number of the note saying why it is empty."""
        v = row.metrics.get(col.key)
        mark = f" (collapsed: {row.collapsed[1]})" if row.collapsed and row.collapsed[0] == col.key else ""
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            return col.fmt.format(v) + mark
        why = _why(row, col)
        return (f"— [{self.empty_notes().index((row.name, why)) + 1}]" if why else "—") + mark

    def empty_notes(self) -> list[tuple[str, str]]:
        """(model, reason) for every empty cell that has a reason, numbered in table order."""
        out: list[tuple[str, str]] = []
        for m in self.models:
            for c in self.columns:
                why = _why(m, c)
                if why and (m.name, why) not in out:
                    out.append((m.name, why))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": [{"key": c.key, "header": c.header, "measure": c.measure.value} for c in self.columns],
            "models": [{"name": m.name, "kind": m.kind, "metrics": _finite(m.metrics), "details": m.details,
                        "empty": m.empty, "collapsed": m.collapsed[1] if m.collapsed else None}
                       for m in self.models],
            "info": self.info,
        }

    def markdown(self) -> str:
        head = ["model", "kind", *[c.header for c in self.columns]]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m in self.models:
            lines.append("| " + " | ".join([m.name, m.kind, *[self.cell(m, c) for c in self.columns]]) + " |")
        notes = [f"- {k}: {v}" for k, v in self.info.items() if isinstance(v, str)]
        notes += [f"- [{i}] {name}: {why}" for i, (name, why) in enumerate(self.empty_notes(), 1)]
        return "\n".join(lines + ([""] + notes if notes else [])) + "\n"

    def rich_table(self, width: int | None = None):  # -> a rich renderable (rich imported lazily)
        """The table; where it does not fit `width` columns (an 80-column terminal), several tables, each with the
        model and kind columns and as many measures as fit, headers one word a line: rich would otherwise cut
        every cell to "8…". Widths are computed here and no cell wraps, so rich has nothing left to shrink."""

        rows = [[m.name, m.kind, *[self.cell(m, c) for c in self.columns]] for m in self.models]
        heads = ["model", "kind", *[c.header for c in self.columns]]

        def need(i: int, head: str) -> int:  # a column: its widest line, padding and a border
            return max(len(line) for cell in [head, *(r[i] for r in rows)] for line in cell.split("\n")) + 3

        if width and 1 + sum(need(i, h) for i, h in enumerate(heads)) > width:
            heads = [h.replace(" ", "\n") for h in heads]
        widths = [need(i, h) for i, h in enumerate(heads)]
        groups: list[list[int]] = [[]]
        for i in range(2, len(heads)):
            if groups[-1] and width and 1 + widths[0] + widths[1] + sum(widths[j] for j in groups[-1] + [i]) > width:
                groups.append([])
            groups[-1].append(i)
        tables = []
        for n, group in enumerate(groups):
            t = Table(title="kd eval" if n == 0 else None, header_style="bold")
            for i in [0, 1, *group]:
                t.add_column(heads[i], justify="right" if i > 1 else "left", no_wrap=True)
            for r in rows:
                t.add_row(r[0], r[1], *[r[i] for i in group])
            tables.append(t)
        tables[-1].caption = "\n".join(f"[{i}] {name}: {why}"
                                       for i, (name, why) in enumerate(self.empty_notes(), 1)) or None
        return tables[0] if len(tables) == 1 else Group(*tables)


def _why(row: ModelResult, col: Column) -> str | None:
    """Why this cell is empty: a NaN measure's reason, or the note of a measure that did not run."""
    v = row.metrics.get(col.key)
    if v is not None and not (isinstance(v, float) and math.isnan(v)):
        return None
    note = row.details.get(col.measure.value)  # e.g. details["speed"] = "not measured: ..."
    return row.empty.get(col.key) or (note if isinstance(note, str) else None)


def _finite(metrics: dict[str, float | None]) -> dict[str, float | None]:
    """NaN as null: JSON has no NaN (json.dumps would write an invalid token); the reason is in "empty"."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}


class _Bars:
    """One progress bar per encoding pass (common.progress.Bar), or nothing when progress is off."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> _Bars:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def encode(self, model: EvalModel, texts: list[str], what: str) -> np.ndarray:
        _ = model.loaded  # before the bar: loading (a first unpack, an export) is a step line, not its first batch
        with Bar(f"{model.name}: {what}", len(set(texts)), "texts", self.enabled) as bar:
            return model.encode(texts, progress=bar.advance)


@dataclass
class _Teacher:
    """Where teacher vectors come from: the store when it has the texts, else the cache of an earlier call, else
    the live model (whose vectors are then cached). `model` None: no teacher (students scored on gold labels)."""

    model: EvalModel | None
    store: StoreTeacher | None
    cache: TeacherCache | None = None

    def each(self, others: list[EvalModel]) -> list[EvalModel]:
        """The teacher (when there is one), then the other models: the report's row order."""
        return [self.model, *others] if self.model is not None else list(others)

    def encoded(self, others: list[EvalModel], texts: list[str], bars: _Bars, what: str
                ) -> tuple[list[tuple[EvalModel, np.ndarray]], str]:
        """(model, vectors of `texts`) for the teacher and every other model, and where the teacher's came from
        ("teacher vectors from the cache"; "no teacher")."""
        if self.model is None:
            return [(o, bars.encode(o, texts, what)) for o in others], "no teacher"
        tv, src = self.vectors(texts, bars, what)
        vectors = [(self.model, tv), *[(o, bars.encode(o, texts, what)) for o in others]]
        return vectors, f"teacher vectors from the {src}"

    def vectors(self, texts: list[str], bars: _Bars, what: str) -> tuple[np.ndarray, str]:
        if self.store is not None:
            got = self.store.lookup(texts)
            if got is not None:
                return got, "store"
        if self.cache is not None:
            got = self.cache.vectors(texts)
            if got is not None:
                return got, "cache"
        assert self.model is not None  # (callers without a teacher use `encoded`)
        vecs = bars.encode(self.model, texts, what)
        if self.cache is not None:
            self.cache.put_vectors(texts, vecs)
        return vecs, "model"


def _models(cfg: EvalConfig) -> tuple[_Teacher, list[EvalModel], dict[str, Any]]:
    info: dict[str, Any] = {}
    store, teacher = None, None
    if cfg.store:
        store = StoreTeacher.open(cfg.store, cfg.teacher, cfg.target)
        spec, target = TeacherSpec(store.name, str(store.meta.get("source") or store.name)), store.target
        teacher = teacher_model(spec, target, store.name)
        info["teacher"] = f"{store.name} (store {cfg.store}, column {store.target})"
    elif cfg.teacher:
        spec, target = parse_teacher(cfg.teacher), cfg.target
        teacher = teacher_model(spec, target)
        info["teacher"] = f"{teacher.name} (run from {cfg.teacher})"
    else:  # gold-label tasks need no teacher (agreement and neighbours do: `_teacher_measures`)
        if not cfg.students and not cfg.baseline_dir:
            raise InputError("nothing to evaluate: no --student, --teacher or --store", "kd eval",
                             "pass --student DIR (and --teacher NAME or --store STORE to compare with a teacher)")
        teacher, spec, target = None, None, None
    names: set[str] = {teacher.name} if teacher is not None else set()
    others = []
    for d in cfg.students:
        if not Path(d).is_dir():
            raise InputError("student folder not found", d, "pass a folder written by kd train-student")
        name = Path(d).resolve().name
        while name in names:
            name += "'"
        names.add(name)
        others.append(student_model(d, name))
        _ = others[-1].loaded  # a damaged student stops the run here (exit 2), before any model is timed or scored
    if cfg.baseline_dir:
        others.append(model2vec_folder(cfg.baseline_dir))
    elif cfg.baseline and teacher is None:
        info["baseline"] = "model2vec skipped: it is distilled from the teacher (pass --teacher, or --baseline-dir)"
    elif cfg.baseline and model2vec_available():
        try:  # resolve the checkpoint folder without loading the teacher's weights
            base = model2vec_baseline(resolve_teacher(spec).path)
            _ = base.loaded  # distil now, so that a failure drops this optional row instead of the run
            others.append(base)
        except Exception as e:  # any failure of the optional baseline is reported, not fatal
            info["baseline"] = f"model2vec skipped: {e}"
    cache = TeacherCache(spec, target) if cfg.cache and spec is not None else None
    return _Teacher(teacher, store, cache), others, info


def evaluate(cfg: EvalConfig) -> EvalReport:
    """Run every requested measure on every model and return (and optionally write) the report."""
    with picked_threads(cfg.threads), showing(cfg.progress):  # a teacher's load is a step line
        return _evaluate(cfg)


def check_outputs(cfg: EvalConfig) -> None:
    """--json, --markdown (files) and --plot (a folder) checked before any model is loaded: writable, not a
    folder where a file goes, never an input (a student, the store, a text file) nor inside a kd folder."""
    inputs = [*cfg.students, cfg.store, cfg.pairs, cfg.agreement_texts, cfg.baseline_dir]
    files = [("--json", cfg.json_path), ("--markdown", cfg.markdown_path)]
    seen: dict[Path, str] = {}
    if cfg.plot_dir is not None:
        plots = claim_output(cfg.plot_dir, "kd eval", inputs=inputs, flag="--plot")
        files += [("--plot", str(plots / name)) for name in PLOT_FILES]
        seen[plots] = "--plot"
    for flag, path in files:
        if path is None:
            continue
        claim_output(path, "kd eval", inputs=inputs, overwrite=cfg.overwrite, file=True, flag=flag)
        # the file written (a link there is replaced, so two links naming one file are two outputs: a probe) and its
        # record (--plot a folder where --json's record goes: the run ended in a traceback after its work)
        written = written_path(path)
        for place in (written, sidecar(written)):
            if place in seen:  # the second write would silently replace the first report
                what = f"{flag} and {seen[place]} name" if place == written else \
                    f"{flag}'s record ({place.name}) and {seen[place]} name"
                raise InputError(f"{what} the same file", str(path), f"give {flag} a path of its own")
            seen[place] = flag


def _evaluate(cfg: EvalConfig) -> EvalReport:
    measures = expand_measures(cfg.measures)
    check_outputs(cfg)
    teacher, others, info = _models(cfg)
    if teacher.model is None:
        measures = _without_teacher(cfg, measures, info)
    models = teacher.each(others)
    rows = {m.name: ModelResult(m.name, m.kind.value) for m in models}
    sims: dict[str, np.ndarray] = {}
    with _Bars(cfg.progress) as bars:
        if Measure.sts in measures:
            _sts(cfg, teacher, others, rows, sims, info, bars)
        if Measure.probe in measures:
            _probe(cfg, teacher, others, rows, info, bars)
        if Measure.cluster in measures:
            _cluster(cfg, teacher, others, rows, info, bars, cfg.cluster_set, "cluster")
        if Measure.documents in measures:  # the long-document task: whole Brown documents grouped by genre
            _cluster(cfg, teacher, others, rows, info, bars, tasks.ClusterSet.brown_documents, "documents")
        for measure, run in ((Measure.mrpc, suite_tasks.mrpc), (Measure.lee, suite_tasks.lee),
                             (Measure.retrieval, suite_tasks.retrieval)):
            if measure in measures:
                run(cfg, teacher, others, rows, info, bars)
        if Measure.agreement in measures or Measure.neighbours in measures:
            _agreement(cfg, teacher, others, rows, info, bars, measures)
        if Measure.speed in measures:
            _speed(cfg, teacher, others, rows, info, bars)
    columns = [c for c in COLUMNS if c.measure in measures]
    if Measure.neighbours in measures:
        columns = [Column(c.key, f"nbr recall@{cfg.k}", c.fmt, c.measure) if c.key == "neighbour_recall" else c
                   for c in columns]
    report = EvalReport([rows[m.name] for m in models], columns, info, sims)
    write_outputs(report, cfg)
    return report


def write_outputs(report: EvalReport, cfg: EvalConfig) -> None:
    if cfg.json_path:
        write_text(cfg.json_path, json.dumps(report.to_json(), indent=1, default=_json_default) + "\n", "kd eval",
                   "--json")
    if cfg.markdown_path:
        write_text(cfg.markdown_path, report.markdown(), "kd eval", "--markdown")
    if cfg.plot_dir:
        report.info["plots"] = [str(p) for p in write_plots(report, local_path(cfg.plot_dir))]  # (file: URIs)


def _json_default(o: object) -> object:
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o)}")


TEACHER_MEASURES = (Measure.agreement, Measure.neighbours)  # they compare each model with the teacher


def _without_teacher(cfg: EvalConfig, measures: list[Measure], info: dict[str, Any]) -> list[Measure]:
    """The measures a run without --teacher or --store takes: the gold-label ones. Agreement and neighbours asked
    for by name are refused; left at their default (kd eval --student DIR), they are dropped with a note."""
    asked = [m for m in measures if m in TEACHER_MEASURES]
    if asked and list(cfg.measures) != list(DEFAULT_MEASURES):
        names = " and ".join(m.value for m in asked)
        raise InputError(f"--task {names} compare{'s' * (len(asked) == 1)} each student with a teacher, and none "
                         "was given", "kd eval", "pass --teacher NAME or --store STORE, or leave out --task "
                         f"{names} (sts, probe, cluster, documents, mrpc, lee, retrieval and speed need none)")
    if asked:
        info["agreement"] = ("not run: agreement and neighbours compare with a teacher (pass --teacher NAME or "
                             "--store STORE)")
    return [m for m in measures if m not in TEACHER_MEASURES]


def _sts(cfg, teacher: _Teacher, others, rows, sims, info, bars) -> None:
    if cfg.pairs:
        if not cfg.score_column:
            raise InputError("--pairs needs --score-column", cfg.pairs, "name (or index) the gold score column")
        task = tasks.load_pairs(cfg.pairs, cfg.score_column, cfg.text_columns)
        if len(task.head(cfg.max_pairs).a) < 2:  # a rank correlation of one pair is undefined, not a score
            raise InputError(f"--pairs holds {len(task.a)} scored pair(s){' (after --max-pairs)' * bool(cfg.max_pairs)}"
                             "; a Spearman correlation needs at least 2", cfg.pairs, "pass a file of scored pairs")
    else:
        task = tasks.load_stsb(cfg.sts_split or ("test" if Measure.suite in cfg.measures else "dev"))
    task = task.head(cfg.max_pairs)
    texts = task.a + task.b
    n = len(task.a)
    models, src = teacher.encoded(others, texts, bars, task.name)
    info["sts"] = f"{task.name}, {n} pairs, {src}"
    tv = models[0][1] if teacher.model is not None else None
    reference = metrics.spread(tv, metrics.rowwise_cosine(tv[:n], tv[n:])) if tv is not None else None
    for m, vecs in models:
        rows[m.name].put("sts_spearman", metrics.sts_spearman(vecs[:n], vecs[n:], task.scores), vecs)
        sims[m.name] = metrics.rowwise_cosine(vecs[:n], vecs[n:])
        if reference is not None and m is not teacher.model:  # the teacher: the reference a collapse is judged by
            rows[m.name].flag("sts_spearman", metrics.collapse(metrics.spread(vecs, sims[m.name]), reference))
    sims["_gold"] = task.scores


def _probe(cfg, teacher: _Teacher, others, rows, info, bars) -> None:
    task = tasks.load_sst2(cfg.probe_train_rows)
    texts = task.train_texts + task.test_texts
    n = len(task.train_texts)
    models, src = teacher.encoded(others, texts, bars, "sst2")
    info["probe"] = f"SST-2: logistic regression on {n} train sentences, accuracy on {len(task.test_texts)} dev; {src}"
    for m, v in models:
        rows[m.name].put("probe_accuracy", metrics.probe_accuracy(v[:n], task.train_labels, v[n:],
                                                                 task.test_labels), v)


def _cluster(cfg, teacher: _Teacher, others, rows, info, bars, name: str, key: str) -> None:
    """Clustering set `name` scored as measure `key` (its column `{key}_f1`)."""
    task = tasks.load_cluster_set(name, cfg.cluster_scale)
    texts = task.dev_texts + task.test_texts
    n = len(task.dev_texts)
    models, src = teacher.encoded(others, texts, bars, task.name)
    info[key] = (f"{task.name}: average-linkage cosine clustering, cut tuned on {n} dev texts "
                 f"({len(set(task.dev_groups))} groups), pair-F1 on {len(task.test_texts)} test texts "
                 f"({len(set(task.test_groups))} groups); {src}")
    for m, v in models:
        res = metrics.cluster_quality(v[:n], task.dev_groups, v[n:], task.test_groups)
        rows[m.name].metrics[f"{key}_f1"] = res.test.f1 * 100.0
        rows[m.name].details[key] = res.to_dict()


def _agreement_texts(cfg: EvalConfig, teacher: _Teacher, bars: _Bars) -> tuple[list[str], np.ndarray, str]:
    if teacher.store is not None:
        texts, tv = teacher.store.sample(cfg.agreement_rows)
        return texts, tv, f"{len(texts)} rows of the store (of {teacher.store.num_rows})"

    if cfg.agreement_texts:
        try:
            lines = Path(cfg.agreement_texts).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise InputError(f"--agreement-texts is not UTF-8 text ({e.reason} at byte {e.start}; a binary file?)",
                             cfg.agreement_texts, "pass a text file of sentences, one a line, in UTF-8") from None
        texts, where = [t for t in lines if t.strip()][: cfg.agreement_rows], cfg.agreement_texts
        if len(texts) < 2:  # agreement averages over texts and neighbours need a second one
            raise InputError(f"--agreement-texts holds {len(texts)} non-empty line(s); agreement needs at least 2",
                             cfg.agreement_texts, "pass a text file of sentences, one a line")
    else:
        texts, where = demo_sentences()[: cfg.agreement_rows], "the bundled demo corpus"
    tv, src = teacher.vectors(texts, bars, "agreement texts")
    return texts, tv, f"{len(texts)} sentences of {where}, teacher vectors from the {src}"


def _agreement(cfg, teacher: _Teacher, others, rows, info, bars, measures) -> None:
    texts, tv, where = _agreement_texts(cfg, teacher, bars)
    info["agreement"] = f"{where}; k={cfg.k}"
    k = min(cfg.k, len(texts) - 1)
    reference = metrics.spread(tv)
    for m in [teacher.model, *others]:
        v = tv if m is teacher.model else bars.encode(m, texts, "agreement texts")
        if Measure.agreement in measures:
            rows[m.name].put("cos_to_teacher", metrics.mean_cosine_agreement(v, tv), v, tv)
        if Measure.neighbours in measures:
            rows[m.name].put("neighbour_recall", metrics.neighbour_recall(tv, v, k), v, tv)
        if m is not teacher.model:
            key = "cos_to_teacher" if Measure.agreement in measures else "neighbour_recall"
            rows[m.name].flag(key, metrics.collapse(metrics.spread(v), reference))


def _speed(cfg, teacher: _Teacher, others, rows, info, bars) -> None:
    texts = list(dict.fromkeys(tasks.load_stsb("dev").a))
    import torch

    info["speed"] = (f"STS-B dev sentences: {min(cfg.speed_b1, len(texts))} one at a time, "
                     f"{min(cfg.speed_big, len(texts))} in batches of 256; ms/doc is the median batch-1 latency; "
                     f"{torch.get_num_threads()} torch thread(s)")
    for m in teacher.each(others):
        sp, size, cached = _timed(cfg, m, texts, teacher.cache if m is teacher.model else None, bars)
        if cached:
            info["speed"] += f"; {m.name}'s speed and size as timed by an earlier call here (--no-cache times again)"
        r = rows[m.name].metrics
        r.update(sent_per_s_b1=sp.sent_per_s_b1, sent_per_s_b256=sp.sent_per_s_b256, latency_ms=sp.latency_ms)
        if size is not None:
            r.update(params_m=size.params / 1e6, embedding_params_m=size.embedding_params / 1e6, disk_mb=size.disk_mb)
            rows[m.name].details["size"] = size.to_dict()


def _timed(cfg, m: EvalModel, texts: list[str], cache: TeacherCache | None, bars: _Bars
           ) -> tuple[SpeedResult, SizeResult | None, bool]:
    """Speed and size of `m`, and whether they came from `cache` (the teacher's, timed here with the same
    threads and texts by an earlier call: timing it again would load the teacher only for that)."""
    import torch

    settings = {"threads": torch.get_num_threads(), "speed_b1": cfg.speed_b1, "speed_big": cfg.speed_big,
                "speed_texts": texts_sha256(texts)}
    got = _speed_record(cache.speed(settings)) if cache is not None else None
    if got is not None:
        return *got, True
    _ = m.loaded  # (a step line of its own)
    with Bar(f"{m.name}: timing", speed_texts(texts, cfg.speed_b1, cfg.speed_big), "texts", bars.enabled) as bar:
        sp = measure_speed(m.encode_batch, texts, cfg.speed_b1, cfg.speed_big, progress=bar.advance)
    size = m.size()
    if cache is not None:
        cache.put_speed(settings, sp.to_dict(), asdict(size) if size is not None else None)
    return sp, size, False


def _speed_record(rec: dict | None) -> tuple[SpeedResult, SizeResult | None] | None:
    """A cached speed record as results, or None when it is absent or not one kd wrote (a miss: timed again)."""
    try:
        return SpeedResult(**rec["speed"]), SizeResult(**rec["size"]) if rec["size"] is not None else None
    except (TypeError, KeyError):
        return None
