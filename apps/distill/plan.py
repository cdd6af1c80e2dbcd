"""`kd distill --dry-run`: the plan, with the time each step will take on this machine, from a short measured
calibration rather than constants. Nothing is written to --out.

The calibration runs the real steps on a small sample of the corpus in a temporary folder:
- the corpus is read, segmented and deduplicated for real (its cost is the first step's, and it gives the rows);
- the teacher encodes a sample of those rows: its load time and rows/s (`PrecomputeSummary.encode_seconds`);
  the start model writes its per-model outputs (init, vocab) the same way;
- every stage trains CALIBRATION_STEPS steps on the sample store, from the stage it names: rows/s from its
  metrics (the last window, after warm-up), scaled to the padding of the run's length buckets, and the set-up
  time around them;
- the chosen student is exported in both formats, and encodes STS-B dev sentences (the choice, the suite);
- the teacher and the start model, loaded as `kd eval` loads them (fp32 reference models), encode 240 rows
  (each only when the eval cache lacks some of its suite vectors).
Each step's estimate is then its fixed cost plus its rows over its measured rate.
"""

from __future__ import annotations

import functools
import io
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from kd.apps.distill import recipe as R
from kd.apps.distill.run import (
    LOCK,
    DistillConfig,
    Step,
    StepKind,
    _precompute,
    _Run,
    check_reuse,
    check_store,
    chosen_dir,
    chosen_weights,
    corpus_header,
    corpus_options,
    recorded_state,
    refuse_foreign_out,
    step_name,
    steps_of,
    teacher_weights,
)
from kd.apps.eval import tasks
from kd.apps.eval.cache import TeacherCache
from kd.apps.eval.models import teacher_model
from kd.apps.eval.speed import picked_threads
from kd.apps.eval.suite_tasks import suite_text_sets
from kd.common import progress
from kd.common.errors import KdError
from kd.common.layers import parse_layers
from kd.common.locks import held_elsewhere
from kd.common.outputs import claim_output
from kd.pipeline.job import PER_TEACHER
from kd.pipeline.precompute import PrecomputeJob, corpus_rows
from kd.pipeline.reuse import open_sources
from kd.pipeline.teacher.keep_layers import folder_name
from kd.pipeline.teacher.model import weights_sha256
from kd.pipeline.teacher.resolve import resolve_teacher
from kd.pipeline.teacher.vocab import VOCAB_FILE, cached_for
from kd.storage.manifest import teacher_table
from kd.storage.store import Store
from kd.student.data import bucketed_padding
from kd.student.exporters import export_student
from kd.student.saved import load
from kd.student.train_config import TrainConfig
from kd.student.trainer import train

# The first batches pay one-off costs (kernel plans, compiled shapes): over fewer rows they would weigh more.
# Rows the teacher's rate is timed on, and the stages train on (20 steps cycle over them). Measured on one AVX2 core,
# mpnet, a 1,000-sentence corpus: 1,024 rows made a 156 s dry run and estimated 11 rows/s; 256 rows a 69 s one and
# 8 rows/s (measured in the run: 10.5): the per-shard fixed cost weighs more on fewer rows, so it errs long. 128
# rows: the teacher's timing ~16 s shorter again (issue 50 asks a dry run of at most 60 s), the same direction of error.
SAMPLE_ROWS = 128
CALIBRATION_STEPS = 20
WINDOW = 5  # rows/s from the last 5 steps (steady_rate): the first ones pay oneDNN plans and allocator warm-up
# The output of one token alone (vocab) runs at most this many times the sample's tokens/s: a 3-token row
# pays a whole batch's per-row overheads (measured on MiniLM, 2 cores: ~2.5x).
VOCAB_SPEEDUP = 2.5
# Rows/s of a copy from --reuse's store (read, checked, reordered): ~5,000 measured on one core for mpnet's
# 768-d rows (docs/results.md, kd precompute --reuse); minutes at most beside any teacher's encoding
COPY_RATE = 5000.0


@dataclass
class PlannedStep:
    name: str
    seconds: float
    detail: str


@dataclass
class Plan:
    recipe: R.Recipe
    rows: int
    steps: list[PlannedStep] = field(default_factory=list)
    calibration_seconds: float = 0.0
    # the table's caption: Recipe.size_warning (the corpus is below where the preset beat its baseline), a run
    # writing --out right now
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    def table(self) -> Table:
        t = Table(title=f"kd distill: recipe {self.recipe.name}, {self.rows:,} rows "
                        f"(calibrated in {self.calibration_seconds:.0f} s)")
        for col in ("step", "estimate", "what"):
            t.add_column(col)
        for s in self.steps:
            t.add_row(s.name, _minutes(s.seconds), s.detail)
        t.add_row("total", _minutes(self.seconds), "")
        if self.notes:
            t.caption = "\n".join(f"note: {n}" for n in self.notes)
        return t

    def __str__(self) -> str:
        """The table as plain text, so `print(kd.distill(..., dry_run=True))` shows the plan, not an object."""
        console = Console(width=120, record=True, file=io.StringIO(), markup=False)
        console.print(self.table())
        return console.export_text()


def _minutes(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def estimate(cfg: DistillConfig) -> Plan:
    """The plan of `cfg` with every step's estimated time (see the module docstring); writes nothing to --out. Its
    steps are the run's own (`steps_of`), each estimated by its kind, in the run's order: an estimate uses what the
    earlier ones measured, as a step uses what the earlier ones wrote."""
    t0 = time.perf_counter()
    recipe = cfg.plan()
    run = _Run(cfg, recipe)
    claim_output(run.out, "kd distill", (), cfg.inputs)  # the checks a real run makes first, nothing created
    refuse_foreign_out(run)
    if cfg.store:
        check_store(run)
    if cfg.reuse:
        check_reuse(run)
    run.check_models()
    done = (recorded_state(run) or {}).get("done", [])  # a rerun skips them (nothing of theirs is timed)
    with tempfile.TemporaryDirectory(prefix="kd-distill-plan-") as tmp:
        c = _Calibration(run, Path(tmp), done)
        plan = Plan(recipe, c.rows, notes=[n for n in (recipe.size_warning(c.rows), _running(run)) if n])
        plan.steps = [PlannedStep(step.name, 0.0, "done") if step.name in done else _ESTIMATES[step.kind](c, step)
                      for step in steps_of(run)]
    plan.calibration_seconds = time.perf_counter() - t0
    return plan


def _running(run: _Run) -> str | None:
    """A note when another kd distill holds --out: the plan then shows its unfinished steps as not begun (a dry run
    is never refused: it writes nothing, and the lock is only looked at, never taken or created)."""
    if not held_elsewhere(run.out / LOCK):
        return None
    return ("another kd distill is running in --out now; the steps it has not finished are planned as not begun "
            "(its distill.json says where it is)")


class _Calibration:
    """What the estimates measure on the corpus sample, each measured once when an estimate first needs it."""

    def __init__(self, run: _Run, tmp: Path, done: list[str]) -> None:
        self.run, self.say = run, functools.partial(progress.step, enabled=run.cfg.progress)
        self.done = done  # the steps the run records done and still finds whole (`run._intact`)
        with self.say("dry run: reading the corpus and drawing its sample"):
            self.ids, self.read_s, sample = _corpus(run, tmp)
            self.rows = len(self.ids)
        # its own store in tmp, never --store: the sample is another corpus, and a dry run writes nothing; never
        # --reuse: the sample's rows are timed as encoded (the copied ones are counted by _reused)
        self.cal = _Run(replace(run.cfg, inputs=[str(sample)], out=str(tmp / "run"), store=None, reuse=None,
                                text_column=None,
                                segment="none", sample=None, exclude_leakage=False, progress=False), run.recipe)
        self.cal.out.mkdir()
        self.cal.refs = run.refs  # the same models, found once by the run's check
        if step_name(StepKind.weights) in done:  # the stages train on the run's chosen weights (the calibration has
            self.cal.weights = chosen_weights(run)  # no weights.json: a dry run resumed after that step was refused)

    @functools.cached_property
    def precompute(self) -> dict[str, PlannedStep]:
        with self.say(f"dry run: timing the teacher{' and the start model' if self.run.recipe.start else ''} on "
                      "the sample"):
            return {s.name: s for s in _precompute_steps(self.run, self.cal, self.ids, self.read_s)}

    @functools.cached_property
    def stages(self) -> tuple[dict[str, PlannedStep], float]:
        """Each stage's planned step by its name, and the last student's encode rate (sentences/s)."""
        _ = self.precompute  # the stages train on the sample store
        with self.say(f"dry run: timing {CALIBRATION_STEPS} training steps of each stage"):
            planned, rate = _stages(self.cal, self.rows)
        return {s.name: s for s in _copied(self.run, planned)}, rate

    @property
    def encode_rate(self) -> float:
        return self.stages[1]


def _choose_step(c: _Calibration, step: Step) -> PlannedStep:
    dev = 2 * 1500  # STS-B dev: 1,500 pairs
    n = len(c.run.recipe.students)
    return PlannedStep(step.name, n * dev / c.encode_rate, f"{n} students x {dev:,} sentences")


def _export_step(c: _Calibration, step: Step) -> PlannedStep:
    """The export of the run's chosen student when it is chosen (into the dry run's folder), else of the sample's
    last stage: with every stage done, none was trained on the sample ("no trained student here", naming the
    dry run's folder: a probe)."""
    # (the choice done means its stage is whole: a chosen stage that lost its config.json was exported, a refusal)
    src = chosen_dir(c.run) if step_name(StepKind.choose) in c.done else None
    if src is None:
        _ = c.stages
    with c.say("dry run: timing the export"):
        return _export(c.cal, step.name, src)


def _suite_step(c: _Calibration, step: Step) -> PlannedStep:
    with c.say("dry run: timing the suite's reference models"):
        return _evaluate(c.cal, c.encode_rate, step.name)


def _sts_step(c: _Calibration, step: Step) -> PlannedStep:
    test = 2 * 2 * 1379  # STS-B test: 1,379 pairs, through the chosen student and the baseline
    return PlannedStep(step.name, test / c.encode_rate,
                       f"2 students x {test // 2:,} sentences (--suite: the whole suite)")


def _weights_step(c: _Calibration, step: Step) -> PlannedStep:
    _ = c.precompute  # the teachers' dev vectors come with their precompute
    with c.say("dry run: choosing the teacher weights on STS-B dev"):
        return _weights(c.run, c.cal, step.name)


_ESTIMATES: dict[StepKind, Callable[[_Calibration, Step], PlannedStep]] = {
    StepKind.teacher: lambda c, step: c.precompute[step.name],
    StepKind.start: lambda c, step: c.precompute[step.name],
    StepKind.weights: _weights_step,
    StepKind.leakage: lambda c, step: PlannedStep(step.name, 0.0, "id lookups, seconds"),
    StepKind.train: lambda c, step: c.stages[0][step.name],
    StepKind.choose: _choose_step,
    StepKind.export: _export_step,
    StepKind.suite: _suite_step,
    StepKind.sts: _sts_step,
}


def _corpus(run: _Run, tmp: Path) -> tuple[np.ndarray, float, Path]:
    """The corpus rows, read for real (their ids and the reading's cost), and an evenly spread sample written as
    text."""

    t = time.perf_counter()
    opts = {k: v for k, v in corpus_options(run.cfg).items() if k not in ("shard_rows", "progress")}
    table, _ = corpus_rows(PrecomputeJob(run.cfg.inputs, str(tmp / "none"), [run.teacher("teacher")], **opts))
    read_s = time.perf_counter() - t
    texts = table.column("text").to_pylist()
    every = max(1, len(texts) // SAMPLE_ROWS)
    sample = tmp / "sample.txt"
    sample.write_text("\n".join(" ".join(x.split()) for x in texts[::every][:SAMPLE_ROWS]) + "\n", encoding="utf-8")
    return table.column("id").to_numpy(), read_s, sample


@dataclass
class _Rate:
    load_s: float  # loading and set-up, around the encoding
    rate: float  # rows/s

    def seconds(self, rows: int) -> float:
        return self.load_s + rows / self.rate


def _precompute_steps(run: _Run, cal: _Run, ids: np.ndarray, read_s: float) -> list[PlannedStep]:
    """The teacher's step (reading the corpus, its load, its rows at its measured rate, its vocab output) and the
    start model's (the same without the reading: its texts come back from the store); only the load and the reading
    where run.store already holds them. Of the corpus rows (`ids`), those --reuse holds are copied at COPY_RATE (for
    several teachers, the fewest: the pass lasts as long as its slowest). The sample store is filled either way: the
    stages calibrate on it."""

    corpus = corpus_header(run)["fingerprint"] if run.store.is_dir() else None  # the corpus hashed once
    stored = {"teacher": all(_stored(run, r, corpus) for r in run.teacher_roles),
              "start": bool(run.specs.get("start")) and _stored(run, "start", corpus)}

    teacher = _timed(cal, "teacher", [o for o in cal.recipe.outputs["teacher"] if o != "vocab"])
    rows, copied = len(ids), _reused(run, cal, run.teacher_roles, ids)
    secs, detail = _encoding(teacher, rows, min(copied.get(r, 0) for r in run.teacher_roles))
    secs += read_s
    if "vocab" in cal.recipe.outputs["teacher"]:
        vocab = len(Store.open(cal.store).load_tokenizer(cal.names["teacher"]))
        if _vocab_cached(cal):  # the stages calibrate on the real table, read from the cache in seconds
            _precompute(cal, "teacher")
            detail += f"; vocab: {vocab:,} tokens, in the kd cache"
        else:  # never the pass itself here: minutes; the stages calibrate on a random table (as fast to train)
            tokens = _mean_tokens(cal.store, cal.names["teacher"])
            secs += vocab * 3 / (teacher.rate * tokens * VOCAB_SPEEDUP)
            detail += f"; vocab: {vocab:,} tokens (once per machine)"
    if stored["teacher"]:
        secs, detail = read_s + teacher.load_s, "already in the store: nothing to compute"
    steps = [PlannedStep(StepKind.teacher.value, secs, detail)]
    if cal.specs["start"] and cal.recipe.outputs["start"]:
        # a model new to the store encodes its default row outputs beside its init/vocab outputs
        start = _timed(cal, "start", cal.recipe.outputs["start"])
        copied |= _reused(run, cal, ["start"], ids)
        steps.append(PlannedStep(StepKind.start.value, start.load_s, "already in the store") if
                     stored["start"] else
                     PlannedStep(StepKind.start.value, *_encoding(start, rows, copied.get("start", 0),
                                                                  f"{', '.join(cal.recipe.outputs['start'])}; ")))
    return steps


def _reused(run: _Run, cal: _Run, roles: list[str], ids: np.ndarray) -> dict[str, int]:
    """Per role, how many of the corpus rows (`ids`) --reuse's store holds for the role's model: copied, not encoded.
    First the refusal the run's precompute makes of that store (unsound, or holding a role's model with other
    settings or fewer outputs: pipeline.reuse.open_sources), made here from the sample store's tables, which the
    same models wrote with the same settings: a dry run never counts rows as copied that its run refuses to copy."""
    if not run.cfg.reuse or not roles:
        return {}
    tables = Store.open(cal.store).manifest.tables
    metas = {run.names[r]: tables[teacher_table(cal.names[r])].meta | {
        "outputs": [o for o in run.outputs(r) if o not in PER_TEACHER]} for r in roles}
    sources = open_sources(run.cfg.reuse, metas)
    return {r: int((sources[run.names[r]].find(ids) >= 0).sum()) for r in roles if run.names[r] in sources}


def _encoding(rate: _Rate, rows: int, copied: int, head: str = "") -> tuple[float, str]:
    """A precompute's seconds and its line: the rows it encodes at the measured rate, those --reuse copies."""
    secs = rate.seconds(rows - copied) + copied / COPY_RATE
    return secs, f"{head}{rows - copied:,} rows at {rate.rate:,.0f} rows/s" + \
        (f", {copied:,} copied from --reuse" if copied else "")


def _weights(run: _Run, cal: _Run, name: str) -> PlannedStep:
    """The weights chosen as the run will choose them (the same cached dev vectors: the run then takes seconds), each
    teacher's dev score and the ensemble's printed; the calibration's stages train on that target."""
    t = time.perf_counter()
    choice = teacher_weights(run)
    cal.weights = choice.weights
    if run.cfg.progress:
        for line in choice.lines():
            print("    " + line, file=sys.stderr, flush=True)
    return PlannedStep(name, time.perf_counter() - t, "; ".join(choice.lines()))


def _stored(run: _Run, role: str, corpus: str | None) -> bool:
    """Whether run.store already holds every output the recipe asks of this role, for this very corpus (`corpus`:
    its fingerprint; a --store another run filled): its precompute will find nothing to do. Read from the manifest
    alone."""

    name, outputs = run.names[role], run.outputs(role)
    try:
        m = Store.open(run.store).manifest
    except (KdError, OSError):  # no store yet, or one the run itself will refuse with its reason
        return False
    rec, files = m.tables.get(teacher_table(name)), m.extras.get("files", {})
    rows = set(outputs) - set(PER_TEACHER)
    want = [f"teachers/{name}/{VOCAB_FILE}"] * ("vocab" in outputs)
    if "init" in outputs and run.recipe.keep_layers is not None:  # checked when the recipe loaded
        layers = parse_layers(str(run.recipe.keep_layers), 1024, "[outputs] keep_layers")
        want.append(f"teachers/{name}/{folder_name(layers)}/model.safetensors")
    some_init = "init" not in outputs or any(f.startswith(f"teachers/{name}/init-") for f in files)
    return (m.fingerprint == corpus and rec is not None and m.is_complete(teacher_table(name)) and some_init
            and rows <= set(rec.meta.get("outputs", [])) and all(f in files for f in want))


def _timed(cal: _Run, role: str, outputs: list[str]) -> _Rate:
    """One role's precompute of the sample: its fixed cost (load, set-up, per-model outputs) and rows/s."""
    t = time.perf_counter()
    s = _precompute(cal, role, outputs)
    wall = time.perf_counter() - t
    rate = s.rows_computed / s.encode_seconds if s.rows_computed else float("inf")
    return _Rate(wall - s.encode_seconds, rate)


def _vocab_cached(cal: _Run) -> bool:
    return cached_for(weights_sha256(resolve_teacher(cal.teacher("teacher")).path))


def _sample_tokens(store_path: Path, teacher: str) -> np.ndarray:
    """Each sample row's token count under `teacher` (its table's n_tokens)."""
    return Store.open(store_path).read_table(teacher_table(teacher), ["n_tokens"]).column("n_tokens").to_numpy()


def _mean_tokens(store_path: Path, teacher: str) -> float:
    return max(1.0, float(_sample_tokens(store_path, teacher).mean()))


def _stages(cal: _Run, rows: int) -> tuple[list[PlannedStep], float]:
    """Each stage trained CALIBRATION_STEPS steps on the sample store: (planned steps, the last student's
    encode rate in sentences/s)."""

    out = []
    for stage in cal.recipe.stages:
        probe = dict(max_steps=CALIBRATION_STEPS, log_every=WINDOW, checkpoint_every=10_000, val_percent=0.0,
                     patience=0)
        if not _has_vocab(cal, stage):  # its start's values do not change a step's cost
            probe["init_embeddings"] = "random"
        cfg = cal.train_config(stage, **probe)
        t = time.perf_counter()
        train(cfg)
        wall = time.perf_counter() - t
        measured = steady_rate([json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()])
        full = TrainConfig(str(cal.store), "o", **stage.options)
        rate = measured * _padding_speedup(cal, full, rows)
        steps = full.max_steps or full.epochs * math.ceil(rows * (1 - full.val_percent / 100) / full.batch_size)
        train_s = steps * full.batch_size / rate
        fixed = max(0.0, wall - CALIBRATION_STEPS * cfg.batch_size / measured)
        val = min(rows * full.val_percent / 100, full.max_val_rows) * (full.epochs if not full.max_steps else 1)
        if not out:  # the baseline is the first stage untrained: its set-up and one step, never calibrated apart
            out.append(PlannedStep(f"{StepKind.train.value} {R.BASELINE}", fixed + full.batch_size / rate,
                                   "the first stage's student, untrained: its start"))
        out.append(PlannedStep(f"{StepKind.train.value} {stage.name}", fixed + train_s + val / (3 * rate),
                               f"{steps:,} steps of {full.batch_size} at {rate:,.0f} rows/s"))
    return out, _encode_rate(cal)


def steady_rate(records: list[dict]) -> float:
    """Rows/s over the calibration's last WINDOW steps, from its metrics records. A record's rows_per_s is the mean
    since the training began (rows / elapsed), so two records give the seconds between them: the window leaves out
    the first steps' one-off costs (kernel plans, allocator warm-up), which the stage's fixed cost carries."""

    logs = [r for r in records if "rows_per_s" in r]
    last = logs[-1]
    before = [r for r in logs if r["step"] <= last["step"] - WINDOW] or logs[:1]
    first = before[-1]
    seconds = last["rows"] / last["rows_per_s"] - first["rows"] / first["rows_per_s"]
    return (last["rows"] - first["rows"]) / seconds if seconds > 0 else last["rows_per_s"]


def _padding_speedup(cal: _Run, full: TrainConfig, rows: int) -> float:
    """How much faster the run's steps are than the calibration's for their padding alone. Length buckets over the
    128-row sample cannot be as tight as the run's over a shuffle buffer of up to 10,000 rows (tiny6 on news1k: 32 %
    of the calibration's token slots were padding, 1-7 % of the run's), and a step's cost follows its token slots:
    the calibration's rate alone made tiny6's training 1.5-2x longer than it ran. The run's buffer is simulated by
    drawing its rows' lengths from the sample's (seeded: the same plan each time); unbucketed batches pad alike
    over any pool."""

    if not full.bucket:
        return 1.0
    lengths = _sample_tokens(cal.store, cal.names["teacher"])
    run = np.random.default_rng(0).choice(lengths, size=max(1, min(rows, full.shuffle_buffer)))
    return (1.0 - bucketed_padding(run, full.batch_size)) / (1.0 - bucketed_padding(lengths, full.batch_size))


def _has_vocab(cal: _Run, stage) -> bool:
    """Whether the sample store holds the vocab output the stage's student would start from."""

    name = cal.names[cal.recipe.role_of(stage)]
    return f"teachers/{name}/vocab.safetensors" in Store.open(cal.store).manifest.extras.get("files", {})


def _copied(run: _Run, planned: list[PlannedStep]) -> list[PlannedStep]:
    """The stages the run will copy from the run that owns its store (apps.distill.shared_stages) cost a copy, not their
    training (the calibration trains them all the same: the stages after them start from them)."""
    out = []
    for stage, step in zip(run.recipe.students, planned, strict=True):
        src = run.shared_stage(stage)
        what = f"copied from {src.parent.parent.name}/stages/{src.name} (the same stage)" if src else ""
        out.append(PlannedStep(step.name, 1.0, what) if src else step)
    return out


def _encode_rate(cal: _Run) -> float:
    model = load(cal.stage_dir(cal.recipe.stages[-1].name))
    dev = tasks.load_stsb("dev").a[:512]
    model.encode(dev[:32])  # warm-up
    t = time.perf_counter()
    model.encode(dev)
    return len(dev) / (time.perf_counter() - t)


def _export(cal: _Run, name: str, src: Path | None) -> PlannedStep:
    src = src or cal.stage_dir(cal.recipe.stages[-1].name)
    t = time.perf_counter()
    export_student(src, "sentence-transformers", cal.out / "model")
    export_student(src, "onnx", cal.out / "onnx")
    return PlannedStep(name, time.perf_counter() - t, "sentence-transformers folder, ONNX")


def _evaluate(cal: _Run, encode_rate: float, name: str) -> PlannedStep:
    """The suite's texts through every model of its table: the student at its measured rate, and the teacher and
    the start model as `kd eval` runs them (fp32 reference models, not the store's backend): loaded and timed
    here on the sample, for the texts the eval cache does not hold yet (a second run pays neither: 31 of the 62
    minutes of a first `tiny3` run on the 10 % sample)."""

    sets = suite_text_sets()
    n = sum(map(len, sets))
    secs, notes = n / encode_rate, []
    roles = ["teacher"] + (["start"] if cal.other_start() else [])
    for role in roles:
        cache = TeacherCache(cal.teacher(role), None)
        todo = sum(len(texts) for texts in sets if cache.vectors(texts) is None)
        if todo:
            load_s, rate = _reference_rate(cal, role)
            secs += load_s + todo / rate
        notes.append(role if todo == n else f"{role} ({n - todo:,} cached)")
    return PlannedStep(name, secs, f"{n:,} texts through the student and {', '.join(notes)}")


def _reference_rate(cal: _Run, role: str) -> tuple[float, float]:
    """(load seconds, texts/s) of a role's model as kd eval loads it, on the calibration sample."""

    texts = Path(cal.cfg.inputs[0]).read_text(encoding="utf-8").splitlines()[:256]
    with picked_threads(None):  # as kd eval does
        t = time.perf_counter()
        model = teacher_model(cal.teacher(role))
        model.encode(texts[:16])  # loads, and warms up
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        model.encode(texts[16:])
        return load_s, (len(texts) - 16) / (time.perf_counter() - t)
