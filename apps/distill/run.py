"""`kd distill`: one command from a corpus to a served student, following a recipe (apps.distill.recipe).

The run is a list of steps, each one an existing kd job that resumes itself, in OUT:
    store/             kd precompute: the teacher's targets, then the start model's outputs (init, vocab);
                       --store puts it elsewhere, so that runs on one corpus share one teacher pass
    exclude.txt        kd leakage: the rows that are also evaluation text, never trained on
    stages/<name>/     kd train-student, one folder per recipe stage (each starts from the one it names)
    choice.json        the stage chosen on STS-B dev (dev splits only: test is read once, in the report)
    model/  onnx/      kd export of the chosen student (sentence-transformers folder with a model card; ONNX)
    report.json/.md    kd eval's suite: the student beside its teacher and start model
    distill.json       the options and recipe of this run, the steps done and their seconds (rewritten after each)

Kill it anywhere and run the same command again: steps done are skipped, the step that was running resumes
(precompute by shard, training from its last checkpoint, exactly), so the files and weights equal those of an
uninterrupted run. Different options on an existing OUT are refused with the option named.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from string import Template
from typing import Any

from kd.apps import leakage
from kd.apps.distill import recipe as R
from kd.apps.distill import step_files
from kd.apps.distill import teacher_weights as W
from kd.apps.distill.config import DistillConfig, teacher_roles
from kd.apps.distill.recipe_models import check_models
from kd.apps.distill.shared_stages import (
    copy_stage,
    finished_stage,
    recorded_paths,
    stage_key,
    store_tables,
    untouched,
)
from kd.apps.eval import metrics, tasks
from kd.apps.eval.run import EvalConfig, Measure, evaluate, write_outputs
from kd.common import progress
from kd.common.errors import InputError, KdError, StoreError
from kd.common.inputs import expand_inputs
from kd.common.locks import try_lock
from kd.common.options import flag
from kd.common.outputs import (
    STORE,
    claim_output,
    file_lost,
    kd_record_left,
    kd_wrote,
    killed_write,
    kind_of,
    sidecar,
    sidecar_of,
    write_text,
)
from kd.common.parsing import read_json
from kd.common.paths import local_path
from kd.pipeline.grow import file_differences, option_differences
from kd.pipeline.job import PrecomputeJob
from kd.pipeline.precompute import inputs_header, precompute
from kd.pipeline.teacher.model import changed_since
from kd.pipeline.teacher.resolve import (
    TeacherRef,
    TeacherSpec,
    check_distinct,
    parse_teacher,
    recorded_spec,
    resolve_teacher,
)
from kd.storage import fs
from kd.storage.names import first_link
from kd.storage.store import Store, readable_manifest, refuse_foreign_folder
from kd.student import saved
from kd.student.checkpoint import CHECKPOINT
from kd.student.exporters import export_student
from kd.student.saved import load
from kd.student.setup import init_folder
from kd.student.target import Target
from kd.student.train_config import TrainConfig
from kd.student.trainer import train

STATE = "distill.json"
LOCK = ".kd-distill.lock"  # held by the process running the recipe in OUT (see _held)
WEIGHTS = "weights.json"  # several teachers: the weights chosen on STS-B dev, with each one's score
CARD = Path(__file__).with_name("templates") / "model_card.md"
FORMAT = "kd-distill"


class StepKind(str, Enum):
    """What a step of the run does; its value is the step's name (a stage's name follows `train stage`), and so a
    key of distill.json's `done`. The dry run (apps.distill.plan) estimates each kind: it walks the same list."""

    teacher = "precompute the teacher"
    start = "precompute the start model"
    weights = "choose the teacher weights on STS-B dev"
    leakage = "leave out evaluation text"
    train = "train stage"
    choose = "choose on STS-B dev"
    export = "export"
    suite = "evaluate the suite"
    sts = "evaluate on STS-B"


@dataclass
class Step:
    kind: StepKind
    run: Callable[[], Any]
    stage: str | None = None  # a training stage: its run() returns the stage's record (key, copied_from)
    leaves: tuple[Path, ...] = ()  # files it writes that later steps read: one gone, it is not done (`_intact`)
    # files and folders whose every file, as it wrote them, is its work: each is recorded with its sha256 when it is
    # done (distill.json's "files"), and one gone or changed undoes it (an export whose weights or tokenizer.json were
    # deleted stayed "done": a probe)
    folders: tuple[Path, ...] = ()
    # the first of its files not as it wrote them, by a record it keeps (a stage: the checksums in its config.json)
    damaged: Callable[[], Path | None] | None = None

    @property
    def name(self) -> str:
        return step_name(self.kind, self.stage)


def step_name(kind: StepKind, stage: str | None = None) -> str:
    return f"{kind.value} {stage}" if stage else kind.value


@dataclass
class DistillResult:
    out: Path
    chosen: str
    model: Path | None
    report: Any = None  # apps.eval.run.EvalReport
    seconds: dict[str, float] = field(default_factory=dict)
    choice: str = ""  # apps.distill.run.choice_line: the chosen stage's dev score beside the baseline's


class _Run:
    """One distillation: the recipe resolved against the config, and the paths it writes."""

    def __init__(self, cfg: DistillConfig, recipe: R.Recipe) -> None:
        self.cfg, self.recipe = cfg, recipe
        self.out = local_path(cfg.out)
        # Another run's store: its precompute finds the outputs there and has nothing to do (the teacher pass is
        # most of a run's time: two presets on one corpus should pay it once).
        self.store = local_path(cfg.store) if cfg.store else self.out / "store"
        self.exclude = self.out / "exclude.txt"
        teachers = cfg.teacher.split(",") if cfg.teacher else recipe.teachers
        self.teacher_roles = teacher_roles(len(teachers))  # (a combined target's: student.target)
        given = dict(zip(self.teacher_roles, teachers)) | {"start": cfg.start or recipe.start}
        # each parsed once, here, and passed on as values: a packaged teacher keeps its name (mpnet, minilm), a
        # folder is named by its role (its table in the store: teacher, teacher2, start)
        self.specs: dict[str, TeacherSpec | None] = {
            role: parse_teacher(text, role, "--start" if role == "start" else "--teacher") if text else None
            for role, text in given.items()}
        check_distinct([self.specs[r] for r in self.teacher_roles], "--teacher" if cfg.teacher else recipe.path,
                       one_target=True)
        self.names = {role: spec.name for role, spec in self.specs.items() if spec}
        self.given_teachers = {  # as distill.json records them: a folder by the file it names (recorded_spec)
            "teacher": ",".join(str(recorded_spec(self.specs[r])) for r in self.teacher_roles) if cfg.teacher else None,
            "start": str(recorded_spec(self.specs["start"])) if cfg.start else None}
        self.refs: dict[str, TeacherRef] = {}  # each role's model found, by check_models
        self.weights = _weights(cfg, recipe, len(teachers))  # None: chosen on STS-B dev (WEIGHTS)
        self._keys: dict[str, str] = {}

    def target(self) -> str:
        """The train-student --target of every stage: the teacher's output, or the teachers' as one."""
        teachers = [self.names[r] for r in self.teacher_roles]
        weights = None if len(teachers) == 1 else (self.weights or chosen_weights(self))
        return str(Target.of(teachers, self.recipe.target, weights))

    def outputs(self, role: str) -> list[str]:
        """What precompute stores for a role (every teacher of a combined target stores the teacher's outputs)."""
        return self.recipe.outputs["start" if role == "start" else "teacher"]

    def check_models(self) -> None:
        """Each role's model found, once, beside its parse (the steps load these refs), then the recipe checked
        against them before any loads (apps.distill.recipe_models). A refusal names the role and the recipe, not
        only the option: a recipe's start model is no --start of the user's."""
        for role, spec in self.specs.items():
            if spec is None:
                continue
            flag = "--start" if role == "start" else "--teacher"
            try:
                self.refs[role] = resolve_teacher(spec, flag)
            except KdError as e:
                raise InputError(f"the {role} model: {e.what}", f"{self.recipe.path} ({role}), or {flag}; {e.where}",
                                 e.fix) from None
        check_models(self.recipe, {role: ref.path for role, ref in self.refs.items()})

    def teacher(self, role: str) -> TeacherRef | TeacherSpec:
        """The role's model as the steps load it: found once (check_models), else as given."""
        return self.refs.get(role) or self.specs[role]

    def other_start(self) -> bool:
        """The recipe starts students from a model other than the teacher (its own sentence encoder)."""
        start = self.specs["start"]
        return start is not None and start.source != self.specs["teacher"].source

    @property
    def card(self) -> Path:
        """The model card: kd export writes a generic one, the evaluation its own over it."""
        return self.out / "model" / "README.md"

    def stage_dir(self, name: str) -> Path:
        return self.out / "stages" / name

    def train_config(self, stage: R.Stage, **extra: Any):
        role = self.recipe.role_of(stage)
        init = None if stage.source in R.ROLES else str(self.stage_dir(stage.source))
        if stage.name == R.BASELINE and stage.options.get("arch") == "transformer-init":
            extra = self.start_itself(stage, role) | extra
        options = stage.options | extra
        if self.cfg.seed:  # an offset: a stage's seed still sets it apart from its neighbours (wrapped: in range)
            options["seed"] = (options.get("seed", TrainConfig.seed) + self.cfg.seed) % 2**32
        return TrainConfig(str(self.store), str(self.stage_dir(stage.name)), init=init, init_teacher=self.names[role],
                           target=self.target(),
                           exclude_ids=str(self.exclude) if self.cfg.exclude_leakage else None,
                           progress=self.cfg.progress, **options)

    def start_itself(self, stage: R.Stage, role: str) -> dict[str, Any]:
        """A transformer-init baseline is the start model itself: its own width (no head onto the teacher's, which
        a least-squares fit would add and which scored below the start model on STS-B dev: 86.42 against MiniLM's
        86.72 on 1,000 sentences), so its one step at rate 0 runs a width-free objective (relational)."""

        folder = init_folder(Store.open(self.store), self.names[role], stage.options.get("init_layers"))
        width = int(json.loads((folder / "config.json").read_text(encoding="utf-8"))["hidden_size"])
        return {"out_dim": width, "objectives": ["relational"]}

    def stage_key(self, stage: R.Stage) -> str:
        """shared_stages.stage_key of a stage of this run (needs the store's tables: after the precomputes)."""

        if stage.name not in self._keys:
            source = None if stage.source in R.ROLES else self.stage_key(self.recipe.stage(stage.source))
            reads = store_tables(self.store, [*(self.names[r] for r in self.teacher_roles),
                                              self.names[self.recipe.role_of(stage)]])
            self._keys[stage.name] = stage_key(self.train_config(stage).to_json(), source, reads)
        return self._keys[stage.name]

    def other_runs(self) -> list[Path]:
        """The runs whose finished stages this one may copy: the one whose own store its --store is (OTHER/store),
        and the runs beside --out. Only a stage trained on this very store can have the same key."""
        if not self.cfg.store:
            return []
        near = [self.store.parent]
        with contextlib.suppress(OSError):  # --out's parent absent (a dry run) or unreadable: the store's run alone
            # (not a link: one to a run elsewhere had its stage recorded as copied from the link, a probe)
            near += sorted(p for p in self.out.parent.iterdir() if not p.is_symlink())
        return [p for p in dict.fromkeys(near) if p != self.out and _is_run(p)]

    def shared_stage(self, stage: R.Stage) -> Path | None:
        """A finished stage of another run on this store with this stage's key (apps.distill.shared_stages), if any."""

        for other in self.other_runs():
            try:
                found = finished_stage(other, read_json(other / STATE, ""), self.stage_key(stage))
            except (OSError, ValueError, KdError):  # a damaged record, or (dry run) a store still to be made
                continue
            if found:
                return found
        return None


def _is_run(folder: Path) -> bool:
    try:
        return (folder / STATE).is_file()
    except OSError:  # a folder we may not read is no run of ours
        return False


def _weights(cfg: DistillConfig, recipe: R.Recipe, teachers: int) -> tuple[float, ...] | None:
    """--weights ("0.7,0.3"), else the recipe's when its teachers are the run's; None: to be chosen on dev."""
    if cfg.weights is None:
        return recipe.weights if not cfg.teacher and teachers > 1 else None
    try:
        values = [float(w) for w in cfg.weights.split(",")]
    except ValueError:
        raise InputError(f"--weights {cfg.weights!r} is not a list of numbers", "--weights",
                         "write one number per teacher, comma-separated: --weights 0.7,0.3") from None
    return R.check_weights(values, teachers, "--weights")


def distill(cfg: DistillConfig) -> DistillResult:
    """Run every step of the recipe not yet done in cfg.out (see the module docstring)."""
    if cfg.dry_run:  # the plan is apps.distill.plan.estimate's: a run must never start from a dry one
        raise InputError("dry_run is set: this call would run the recipe", "kd distill",
                         "call kd.apps.distill.plan.estimate(cfg) for the plan, or unset dry_run")
    recipe = cfg.plan()
    run = _Run(cfg, recipe)
    _check(run)  # before anything is created: a refused run leaves nothing behind
    with _held(run):
        return _run_steps(run, _state(run))


def _run_steps(run: _Run, state: dict[str, Any]) -> DistillResult:
    """Every step not yet done in run.out (`state`: its distill.json), recorded after each; the run's result."""
    cfg = run.cfg
    steps = steps_of(run)
    _clear_undone_stages(run, state)
    # the steps `_intact` undid are undone on disk too: only in memory, a kill while one was redone left it recorded
    # done, and the next run skipped it and every step after it (kd export's card left as the model's: a probe)
    _save_state(run, state)
    seconds: dict[str, float] = {}
    for i, step in enumerate(steps, 1):
        if step.name in state["done"]:
            continue
        label = f"[{i}/{len(steps)}] {step.name}"
        _say(cfg, label)
        t = time.perf_counter()
        with progress.within(label):
            result = step.run()
        seconds[step.name] = time.perf_counter() - t
        if step.stage:
            state.setdefault("stages", {})[step.stage] = result
        elif isinstance(result, dict):  # a precompute's rows
            state.setdefault("rows", {})[step.name] = result
        state["done"].append(step.name)
        if step.folders:
            state.setdefault("files", {})[step.name] = step_files.record(run.out, step.folders)
        state.setdefault("seconds", {})[step.name] = round(seconds[step.name], 1)  # beside --dry-run's estimate
        _save_state(run, state)
    choice = _choice(run)
    report = _read_report(run) if cfg.evaluate else None
    line = choice_line(choice["chosen"], choice["sts_dev"], choice["candidates"]) \
        if R.BASELINE in choice["sts_dev"] else ""
    return DistillResult(run.out, choice["chosen"], run.out / "model" if cfg.export else None, report, seconds, line)


def _refuse_changed_models(run: _Run) -> None:
    """Each role's model (found: `_Run.check_models`) is the one whose vectors the run's store holds: a teacher whose
    weights changed in place after its pass had its dev vectors (the weights' choice) computed from the new weights
    while every stage trained on the old ones' vectors, exit 0 (a probe). Its config.json's settings too, where the
    store records them (`changed_since`)."""
    if kind_of(run.store) != STORE:
        return
    tables = Store.open(run.store).manifest.tables
    for role, ref in run.refs.items():
        table = tables.get(f"teachers/{run.names[role]}")
        changed = changed_since(ref.path, table.meta) if table is not None else None
        if changed:
            raise InputError(f"the {role} model's {changed} ({run.names[role]}) changed since its vectors were "
                             f"stored: the run's store ({run.store}) holds another model's", ref.path,
                             f"restore its {changed} to resume this run, or pass a new --out for a run on this model")


def _clear_undone_stages(run: _Run, state: dict[str, Any]) -> None:
    """A stage done once and then undone (`_intact`: its weights gone, or an earlier step's work, which it reads) is
    trained again from nothing: what is left of its folder is neither a checkpoint to resume nor a student to keep
    (its folder without weights stuck every rerun: "no model.safetensors"; a finished one after a retrained source
    was kept as if trained from it: a probe). Its record goes with it (saved by the caller), so a kill after this
    retrains it only once."""
    undone = [name for name in state.get("stages", {}) if step_name(StepKind.train, name) not in state["done"]]
    for name in undone:
        if run.stage_dir(name).exists():
            shutil.rmtree(run.stage_dir(name))
        del state["stages"][name]


def _say(cfg: DistillConfig, line: str) -> None:
    if cfg.progress:
        print(line, file=sys.stderr, flush=True)


def _check(run: _Run) -> None:
    """The inputs, OUT (never an input, never another kd output), --store, --reuse and the recipe's models."""
    expand_inputs(run.cfg.inputs)  # a missing corpus is refused before a run is recorded under its name
    claim_output(run.out, "kd distill", (), run.cfg.inputs)
    if run.cfg.store:
        check_store(run)
    if run.cfg.reuse:
        check_reuse(run)
    run.check_models()


@contextlib.contextmanager
def _held(run: _Run) -> Iterator[None]:
    """OUT for this process alone: two runs there would interleave their writes of distill.json and of the steps'
    files (the store and each stage hold locks of their own). The lock is a flock on a file inside OUT, as
    train-student's is inside its folder (beside it, a writable OUT in a folder one cannot write was refused); the
    kernel releases it when the process dies, kill -9 included."""
    refuse_foreign_out(run)
    run.out.mkdir(parents=True, exist_ok=True)
    lock = try_lock(run.out / LOCK, wait_s=1.0)  # (a dry run's look at the lock lasts an instant: see plan._running)
    if lock is None:
        raise InputError("another kd distill is writing --out right now (its lock is held)", str(run.out),
                         "wait for it to finish, or pass another --out")
    try:
        yield
    finally:
        lock.close()


def refuse_foreign_out(run: _Run) -> None:
    """OUT is new, empty, or a kd distill run's (the dry run checks it too: it planned where the run is refused)."""
    if run.out.is_dir():  # (distill.json a folder was "not a kd distill run", whose fix abandoned it: a probe)
        _refuse_folders_at_records(run)
        _refuse_a_linked_record(run)
    if not (run.out / STATE).is_file() and run.out.is_dir() and any(p.name != LOCK for p in run.out.iterdir()):
        raise InputError("--out holds files that are not a kd distill run", str(run.out), "pass a new or empty --out")
    if run.out.is_dir():  # (a new OUT holding a link where the lock goes: its lock was made outside OUT, a probe)
        _refuse_links(run)
        _refuse_foreign_store(run)


def _refuse_folders_at_records(run: _Run) -> None:
    """A folder where the run writes one of its records (the dry run planned, the run failed writing it, naming a temp
    file and "pass a file": a probe)."""
    records = [run.out / name for name in (STATE, WEIGHTS, "choice.json", "report.json", "report.md", run.exclude.name)]
    # their sidecars and the lock too (one a folder: the run failed midway naming the record, the dry run planned)
    paths = [*records, *(sidecar(p) for p in records), run.out / LOCK]
    folder = next((p for p in paths if p.is_dir()), None)
    if folder is None:
        return
    link = folder.is_symlink()  # (a link was "a folder", to "move or delete": a probe)
    what = f"a link to a folder ({os.path.realpath(folder)})" if link else "a folder"
    clear = f"remove the link {folder}" if link else f"move {folder} away"
    if folder == run.out / STATE and any(p.name not in (STATE, LOCK) for p in run.out.iterdir()):
        # the run's own record is gone: "the rerun writes it again" was refused as "not a kd distill run" (a probe)
        raise InputError(f"{STATE} is {what}, where kd distill keeps its run's record: without the record the other "
                         "files in --out are no run it can continue", str(folder),
                         f"put the run's {STATE} back in its place ({clear} first), or {clear} and pass a new --out")
    raise InputError(f"{folder.name} is {what}, where kd distill writes that file", str(folder),
                     f"{'remove the link' if link else 'move or delete'} {folder}: the rerun writes the file again")


def _refuse_a_linked_record(run: _Run) -> None:
    """distill.json a link to a file or to nothing: "remove the link (the rerun writes the file again)" was refused as
    "not a kd distill run", and a dangling one was that refusal itself, naming no link (a probe)."""
    state = run.out / STATE
    if not state.is_symlink() or state.is_dir():  # (a link to a folder: `_refuse_folders_at_records`)
        return
    target = os.path.realpath(state)
    what = f"a symbolic link to {target}" if state.is_file() else f"a symbolic link to nothing ({os.readlink(state)})"
    raise InputError(f"{STATE} is {what}, where kd distill keeps its run's record", str(state),
                     f"put the run's {STATE} in place of the link (a copy of the file it points to, if that is it), "
                     "or pass a new --out")


def _refuse_foreign_store(run: _Run) -> None:
    """OUT's own store as precompute takes it (`refuse_foreign_folder`), checked before the run's record is touched: a
    store linked to a folder of other files was refused by its precompute after the record had every step undone
    (pointing the link back then redid the whole run: a probe)."""
    store = run.out / "store"
    if run.cfg.store is not None or not store.is_dir():
        return
    loc, link = fs.resolve(store), f" (a symbolic link to {os.path.realpath(store)})" if store.is_symlink() else ""
    try:
        existing = readable_manifest(loc, False)
    except StoreError as e:  # a damaged record: the store's own fix, naming the file (its where)
        raise InputError(f"store{link}: {e.what}", e.where or str(store), e.fix) from None
    try:
        refuse_foreign_folder(loc, False, existing)
    except StoreError:  # (its fix said "choose an empty or new --out", which starts another run: a probe)
        raise InputError(f"store{link} holds files but no kd store", str(store),
                         "point the link at the run's store (where it was moved), or remove the link: the run then "
                         "computes its store again" if link else f"move {store} away (or put the run's store back "
                         "there): the run then computes its store again") from None


def _state(run: _Run) -> dict[str, Any]:
    """OUT's distill.json (`recorded_state`), or a new one."""
    state = recorded_state(run)
    if state is None:
        state = {"format": FORMAT, "identity": run.cfg.identity(run.recipe, run.given_teachers), "done": []}
        _save_state(run, state)
    return state


def recorded_state(run: _Run) -> dict[str, Any] | None:
    """OUT's distill.json when it records this run (None: no run there yet); a run with other options is refused
    naming the first that differs. The dry run reads it too: it plans what is left, and is refused as the run is."""
    path = run.out / STATE
    if not path.is_file():
        return None
    state = _read_state(path)
    differs = run.cfg.difference(state["identity"], run.recipe, run.given_teachers, path)
    if differs and differs[0] == "out":  # the folder was moved or copied: "the same options" would name the old
        _moved(run, differs[1])          # place (a probe: the fix said to rerun with options that write there)
    if differs:
        key, was, now = differs
        # (a corpus symlink pointed elsewhere reads as the same options to its user: a probe)
        same = "pass the corpus files the run read (paths are the files they name, a symlink's target included)" \
            if key == "inputs" else "run with the same options"
        raise InputError(f"--out holds a kd distill run with other settings: {key} was {was!r}, now {now!r}",
                         str(run.out), f"{same} to resume it, or pass a new --out")
    # the corpus is recorded by its paths: one edited since was read from the old store, exit 0 (a probe)
    changed = [] if run.cfg.store else _corpus_differences(run)  # (--store's: check_store)
    if changed:
        raise InputError(f"the corpus changed since this run's store was made: {'; '.join(changed[:3])}",
                         str(run.out), "make the corpus what the store was made from to resume the run (files back as "
                         f"they were, new ones out of it), or pass a new --out (with --reuse {run.store}: the rows "
                         "that did not change are copied, not encoded again)")
    _refuse_changed_models(run)  # (after the identity: another teacher folder is another run, said so)
    done = _intact(run, state)
    _refuse_damaged(run, done)
    return state | {"done": done}


def _refuse_damaged(run: _Run, done: list[str]) -> None:
    """What a rerun would read or replace and cannot, refused before any work, in the run and its dry run alike (the
    dry run planned "export 4 s" and showed "done" where the run was refused: a probe): a damaged choice.json of a
    done choice; a file or a folder with files the export did not write where the export goes (links inside OUT:
    `refuse_foreign_out`, which both call first)."""
    if step_name(StepKind.choose) in done:
        _choice(run)
    if step_name(StepKind.weights) in done:  # (read only when a stage trains: a damaged one was kept, or a traceback)
        chosen_weights(run)
    if run.cfg.evaluate:  # done, or to be done again (an edit was written over when an earlier step was redone)
        # (one edited into other JSON was kept as the run's report; one not JSON was "done" in the dry run: probes)
        edited = next((p for p in (run.out / "report.json", run.out / "report.md") if p.is_file() and not kd_wrote(p)),
                      None)
        if edited is not None:
            raise InputError(f"{edited.name} is not the report kd distill wrote (edited or damaged since)", str(edited),
                             f"delete {edited}: the rerun evaluates the chosen student again")
    if not run.cfg.export or step_name(StepKind.export) in done:
        return
    for folder in (run.out / "model", run.out / "onnx"):
        if folder.exists() and not folder.is_dir():  # (the run said "--out is an existing file", the dry run planned)
            raise InputError(f"{folder.name} is a file where the export goes", str(folder),
                             f"move or delete {folder}: the rerun exports the chosen student there")
        foreign = _foreign_files(run, folder) if folder.is_dir() else []
        if foreign:  # (refused inside the export, after the run had recorded it undone, naming an --overwrite)
            raise InputError(f"{folder.name}/ holds {len(foreign)} file(s) the export did not write (or that changed "
                             f"since), e.g. {foreign[0]}", str(folder),
                             f"move your files out of {folder}, and restore or delete an export file you edited: "
                             "the rerun exports the chosen student there")
        if foreign is None and any(folder.iterdir()) and kind_of(folder) is None:
            # (it lost the file telling it one: "pass a new --out" was the fix, which starts the whole run again)
            raise InputError(f"{folder.name}/ is no whole export any more (a file that tells one is gone), and kd "
                             "does not delete a folder it cannot tell it wrote", str(folder),
                             f"delete {folder}: the rerun exports the chosen student into it again")


def _refuse_links(run: _Run) -> None:
    """No symbolic link inside OUT (its store aside, which its own checks read): kd distill writes its files in place,
    and one written through a link lands outside OUT (probes: the card, report.md and a whole export were written
    through one onto a user's files; a stage folder as one stopped every rerun with a traceback)."""
    store = run.out / "store"
    if store.is_symlink() and not store.is_dir():  # (the store's own checks, or making one there, were a traceback)
        target = os.path.realpath(store)  # (the end of a chain of links: its first hop may well be there)
        what = "not a folder" if os.path.lexists(target) and not os.path.islink(target) else \
            "missing" if not os.path.islink(target) else "a link in a loop of links"
        raise InputError(f"store is a symbolic link to {target}, which is {what}", str(store),
                         "point the link at the run's store (where it was moved), or remove the link: the run then "
                         "computes its store again")
    found = first_link(run.out, skip=(run.store, store))
    if found is not None:
        link = Path(found)
        # (a copy where kd's record of a file goes was replaced by the record, exit 0: a probe)
        copy = "" if sidecar_of(link) is not None else ", or replace it by a copy of what it points to"
        raise InputError(f"{link.relative_to(run.out)} is a symbolic link (to {os.readlink(link)}) inside --out, "
                         "where kd distill writes its own files", str(link),
                         f"remove the link {link} (the rerun writes the file or folder again){copy}")


def _read_state(path: Path) -> dict[str, Any]:
    """A distill.json as kd distill writes it: {identity: {...}, done: [step names], ...}; anything else (a damaged
    or foreign file) is refused naming it (it was a traceback: a probe)."""
    try:
        state = read_json(path, "")
    except KdError as e:
        state = e
    if not (isinstance(state, dict) and isinstance(state.get("identity"), dict) and isinstance(state.get("done"), list)
            and all(isinstance(s, str) for s in state["done"]) and {"inputs", "out"} <= state["identity"].keys()
            and all(isinstance(state.get(k, {}), dict) for k in ("stages", "rows", "seconds", "files"))
            and all(R.is_stage_name(name) for name in state.get("stages", {}))
            and all(step_files.well_formed(v) for v in state.get("files", {}).values())):
        why = f" ({state.what[:100]})" if isinstance(state, KdError) else ""
        store = shlex.quote(str(path.parent / "store"))
        raise InputError(f"the run's {STATE} is not the record kd distill writes{why}, so what the run did is "
                         "unknown", str(path), f"pass a new --out (with --store {store} to start from its teacher "
                         "pass, if it holds one)")
    return state


def _moved(run: _Run, made_in: str) -> None:
    """Refuse a run folder moved or copied from `made_in`: its stages record their store and folders by path, so it
    continues only where it was made; its store can start a new run without a second teacher pass."""
    store = run.out / "store" if run.cfg.store is None else run.store
    raise InputError(f"--out holds a kd distill run made in {made_in}: the folder was moved or copied since, and a run "
                     "continues only in the folder it was made in", str(run.out),
                     f"move it back to {made_in} and run the same command there, or start a new run on its teacher "
                     f"pass: --out NEW --store {shlex.quote(str(store))}")


def check_store(run: _Run) -> None:
    """--store: a kd store, a new folder or an empty one, and not one of the run's own folders; checked before the
    run is recorded, so a refused --store leaves no run behind that its corrected rerun would call different."""

    where = f"--store {run.cfg.store}"
    if run.store == run.out or (run.out in run.store.parents and run.store != run.out / "store"):
        raise InputError("--store is inside --out, where kd distill writes its own folders", where,
                         f"pass a folder outside {run.out}, or leave --store out to use {run.out / 'store'}")
    claim_output(run.store, "kd distill", (STORE,), run.cfg.inputs, flag="--store")
    if run.store.is_dir() and any(run.store.iterdir()) and kind_of(run.store) != STORE:
        raise InputError("--store holds files but no kd store", where,
                         "pass a kd store (another run's OUT/store), or a new or empty folder")
    diffs = _corpus_differences(run)
    if diffs:
        raise InputError(f"--store was made from another corpus or other row options: {'; '.join(diffs[:3])}",
                         where, "pass the corpus and options it was made from, or another --store")


def _corpus_differences(run: _Run) -> list[str]:
    """How the corpus and row options differ from those the run's store was made from (none: no store yet)."""
    if kind_of(run.store) != STORE:
        return []
    m, now = Store.open(run.store).manifest, corpus_header(run)
    if m.fingerprint == now["fingerprint"]:
        return []
    return file_differences(m.inputs.get("files") or [], now["files"]) + \
        option_differences(m.inputs.get("options") or {}, now["options"])


def check_reuse(run: _Run) -> None:
    """--reuse: a readable kd store, not the run's own; checked before the run is recorded. Whether it holds this
    run's models with the same settings needs them loaded: precompute's check at the step that copies
    (pipeline.reuse; the dry run makes it too, from its sample's tables)."""

    where, path = f"--reuse {run.cfg.reuse}", Path(run.cfg.reuse)
    if path.resolve() == run.store:
        raise InputError("--reuse names the run's own store", where,
                         "drop --reuse: a rerun already skips what its store holds")
    if not path.exists():
        raise InputError("--reuse: no such folder", where, "pass another run's store (its OUT/store, or its --store)")
    try:
        Store.open(run.cfg.reuse)
    except StoreError as e:
        inner = path / "store"  # a kd distill run's folder: its store is inside
        fix = f"pass {inner}, that run's store" if _is_run(path) and kind_of(inner) == STORE else \
            "pass another run's store (its OUT/store, or its --store), or drop --reuse"
        raise InputError(f"--reuse: {e.what}", where, fix) from None


def _save_state(run: _Run, state: dict[str, Any]) -> None:
    _write_json(run.out / STATE, state)


def _write_json(path: Path, record: dict[str, Any]) -> None:
    """Whole or not at all (temp + rename): a kill leaves the last complete record."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # made anew ("x"): a link there was written through, then moved onto the record (probe)
    with open(tmp, "x", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=1))
    os.replace(tmp, path)


def steps_of(run: _Run) -> list[Step]:
    """The run's steps, in order: the one list the run executes and the dry run estimates (each step's condition
    is written here only)."""
    K, out, manifest = StepKind, run.out, (run.store / "manifest.json",)
    steps = [Step(K.teacher, lambda: _rows_record(run, _precompute(run, "teacher")), leaves=manifest)]
    if run.specs["start"] and run.recipe.outputs["start"]:
        steps.append(Step(K.start, lambda: _rows_record(run, _precompute(run, "start")), leaves=manifest))
    if run.weights is None and len(run.teacher_roles) > 1:
        steps.append(Step(K.weights, lambda: _choose_weights(run), leaves=(out / WEIGHTS,), folders=(out / WEIGHTS,)))
    if run.cfg.exclude_leakage:
        steps.append(Step(K.leakage, lambda: _leakage(run), leaves=(run.exclude,)))
    for stage in run.recipe.students:
        # (what a student folder loads by: an undone stage is removed and trained again, `_clear_undone_stages`)
        folder = run.stage_dir(stage.name)
        steps.append(Step(K.train, lambda s=stage: _train(run, s), stage.name,
                          (folder / saved.WEIGHTS, folder / saved.CONFIG),
                          folders=recorded_paths(folder),
                          damaged=lambda f=folder: saved.damaged_file(f)))
    # (its records too: an edited choice.json named a stage whose export it was not, exit 0; an edited weights.json
    # trained on its numbers: a probe)
    steps.append(Step(K.choose, lambda: _choose(run), leaves=(out / "choice.json",), folders=(out / "choice.json",)))
    if run.cfg.export:
        steps.append(Step(K.export, lambda: _export(run), leaves=(out / "model" / "modules.json",
                                                                  out / "onnx" / "model.onnx",
                                                                  out / "onnx" / "kd_onnx.json"),
                          folders=(out / "model", out / "onnx")))
    if run.cfg.evaluate:
        report = (out / "report.json", out / "report.md")  # (report.md gone: every rerun stopped reading it)
        report += (run.card,) if run.cfg.export else ()  # the card: the evaluation writes it
        steps.append(Step(K.suite, lambda: _evaluate(run), leaves=report) if run.cfg.suite else
                     Step(K.sts, lambda: _sts_report(run), leaves=report))
    return steps


def _intact(run: _Run, state: dict[str, Any]) -> list[str]:
    """The steps `state` records done whose work is still there: up to the first whose file is gone (a stage folder
    deleted to train it again; a probe: the run said "chose stage one" with stages/one gone), which is done again
    with every step after it (they read what it makes)."""
    steps, done = steps_of(run), state["done"]
    for i, step in enumerate(steps):
        if step.name not in done:
            continue
        recorded = step_files.recorded(state, step.name) or {}
        recorded = {n: sha for n, sha in recorded.items() if run.out / n != run.card}  # (the evaluation's: its step's)
        # (is_file: a file replaced by a folder was "there", and a broken export stayed done: a probe)
        gone, why = next((p for p in step.leaves if not p.is_file()), None), "is gone"
        if gone is None:  # (a stage's config.json edited kept the stage, and the export made from it: a probe)
            gone, why = step_files.first_changed(run.out, recorded) or (None, "")
        if gone is None and step.damaged is not None:
            # (an edited stage tokenizer file stopped every rerun with the load's "retrain it": a probe)
            gone, why = step.damaged(), "is not as it was written"
        if gone is not None:
            _say(run.cfg, f"{step.name}: {gone} {why}, so it is done again, and every step after it")
            before = {s.name for s in steps[:i]}
            return [name for name in done if name in before]
    return done


def corpus_options(cfg: DistillConfig) -> dict[str, Any]:
    return dict(text_column=cfg.text_column, segment=cfg.segment, dedup=cfg.dedup, sample=cfg.sample,
                shard_rows=cfg.shard_rows, progress=cfg.progress)


def corpus_header(run: _Run) -> dict[str, Any]:
    """The fingerprint precompute gives this run's corpus and row options (files hashed, nothing segmented)."""

    job = PrecomputeJob(run.cfg.inputs, str(run.store), [run.teacher("teacher")], **corpus_options(run.cfg))
    return inputs_header(expand_inputs(run.cfg.inputs), job.input_options(job.columns()))


def _precompute(run: _Run, role: str, outputs: list[str] | None = None):
    """One role's `kd precompute` into the run's store (`outputs`: the recipe's, unless given); its summary."""

    outputs = run.outputs(role) if outputs is None else outputs
    keep = run.recipe.keep_layers if "init" in outputs else None
    opts = corpus_options(run.cfg) | ({"keep_layers": keep} if keep else {})
    opts |= {"reuse": run.cfg.reuse} if run.cfg.reuse else {}
    roles = run.teacher_roles if role == "teacher" else [role]  # the teachers of a combined target in one pass
    return precompute(run.cfg.inputs, str(run.store), [run.teacher(r) for r in roles], outputs=outputs, **opts)


def _rows_record(run: _Run, summary: Any) -> dict[str, int]:
    """A precompute step's record (`summary`: its PrecomputeSummary): the rows it encoded, and those it copied from
    --reuse, said when there are any (the time they saved is the point of the flag). Counted per teacher table: two
    teachers of a combined target over 26,839 rows copy 53,678."""
    if summary.rows_reused:
        n = len(summary.teachers)
        tables = f" (the rows of {n} teachers' tables)" if n > 1 else ""
        said = f"{summary.rows_computed:,} rows encoded, {summary.rows_reused:,} copied from --reuse"
        _say(run.cfg, f"    {said}{tables}")
    return {"encoded": summary.rows_computed, "copied": summary.rows_reused}


def teacher_weights(run: _Run):  # -> apps.distill.teacher_weights.WeightChoice
    """The teachers' weights that score best on STS-B dev, from each one's dev vectors (cached per machine)."""

    specs = {run.names[r]: run.teacher(r) for r in run.teacher_roles}
    cos, gold = W.dev_cosines(lambda name, texts: W.cached_vectors(specs[name], run.recipe.target, texts,
                                                                   run.cfg.progress), list(specs))
    return W.choose(list(specs), cos, gold)


def _choose_weights(run: _Run) -> None:
    choice = teacher_weights(run)
    _write_json(run.out / WEIGHTS, {"teachers": list(choice.teachers), "weights": list(choice.weights),
                                    "sts_dev": choice.alone | {"ensemble": choice.score},
                                    "candidates": [[list(w), s] for w, s in choice.candidates.items()]})
    for line in choice.lines():
        _say(run.cfg, "    " + line)


def _leakage(run: _Run) -> None:
    leakage.check_store(str(run.store), exclude_out=str(run.exclude), overwrite=True)


def _train(run: _Run, stage: R.Stage) -> dict[str, str]:
    """Train the stage, or copy it from another run on the store that finished it with the same key
    (apps.distill.shared_stages); the stage's record for the state."""

    folder, key = run.stage_dir(stage.name), run.stage_key(stage)
    if (folder / "config.json").is_file() and not (folder / CHECKPOINT).exists():
        return {"key": key}  # finished before a kill that came ahead of the state's update
    src = run.shared_stage(stage)
    if src is not None and untouched(folder):
        _say(run.cfg, f"    the same stage as {src}: copied, not trained")
        copy_stage(src, folder)
        return {"key": key, "copied_from": str(src)}
    try:
        train(run.train_config(stage))
    except InputError as e:
        raise _in_the_recipe(run, stage, e) from None
    return {"key": key}


def _in_the_recipe(run: _Run, stage: R.Stage, e: InputError) -> InputError:
    """A refused option that the recipe's stage set is named there: its user wrote no train-student flag."""

    key = next((k for k in stage.options if flag(TrainConfig, k) == e.where), None)
    if key is None:
        return e
    name = run.recipe.stages[0].name if stage.name == R.BASELINE else stage.name  # the baseline is the first, untrained
    return InputError(e.what, f"{run.recipe.path} [[stage]] {name}: {key} (train-student's {e.where})",
                      f"set {key} in the recipe's stage (where the fix says {e.where}): {e.fix}")


def _choose(run: _Run) -> None:
    """Among the baseline (recipe.BASELINE: the first student, untrained) and the stages whose student has the
    recipe's final shape (tiny3's 6-layer stages are a means, never the result), the one that scores best on STS-B
    dev (never test); a tie keeps the baseline, which cost nothing. Every stage's score is recorded, and the choice
    is said beside the baseline's score."""

    dev = tasks.load_stsb("dev")
    scores, shapes = {}, {}
    for stage in run.recipe.students:
        model = load(run.stage_dir(stage.name))
        scores[stage.name] = _sts(model, dev)
        shapes[stage.name] = (model.config.arch.value, model.num_parameters())
    final = shapes[run.recipe.stages[-1].name]
    candidates = [n for n in scores if shapes[n] == final or n == R.BASELINE]
    chosen = max(candidates, key=lambda n: scores[n])  # the first of equals: the baseline, listed first
    _write_json(run.out / "choice.json", {"chosen": chosen, "sts_dev": scores, "candidates": candidates,
                                          "baseline": R.BASELINE})
    _say(run.cfg, "    " + choice_line(chosen, scores, candidates))


def _sts(model: Any, task: Any) -> float:
    """STS-B Spearman x100 of a loaded student on one split (apps.eval.tasks.PairTask)."""

    return metrics.sts_spearman(model.encode(task.a), model.encode(task.b), task.scores)


def choice_line(chosen: str, scores: dict[str, float], candidates: list[str]) -> str:
    """What was chosen, on which dev score, beside the baseline's (and, when the baseline won, the best of the
    stages it could have exported: `candidates`, never tiny3's 6-layer stages)."""
    base = scores[R.BASELINE]
    if chosen == R.BASELINE:
        best = max((n for n in candidates if n != R.BASELINE), key=lambda n: scores[n])
        return (f"chose the baseline (the untrained start): STS-B dev {base:.2f}; training did not beat it (best "
                f"stage {best}: {scores[best]:.2f}), so the baseline is what this run exports")
    return f"chose stage {chosen}: STS-B dev {scores[chosen]:.2f}, {scores[chosen] - base:+.2f} over the baseline " \
           f"(the untrained start: {base:.2f})"


def chosen_dir(run: _Run) -> Path:
    return run.stage_dir(_choice(run)["chosen"])


def chosen_weights(run: _Run) -> tuple[float, ...]:
    """weights.json's weights as `_choose_weights` writes them; a damaged one is named with the fix that redoes its step
    (it was a traceback; 1e308 twice trained a stage to NaN, exit 0: a probe)."""
    path = run.out / WEIGHTS
    try:
        record = read_json(path, "")
        weights = record["weights"]
        # (a record from before its sha256 was: weights no candidate of its own, its teachers swapped: a probe)
        ok = record["teachers"] == [run.names[r] for r in run.teacher_roles] and \
            weights in [c[0] for c in record["candidates"]] and \
            isinstance(weights, list) and len(weights) == len(run.teacher_roles) and \
            all(isinstance(w, float | int) and not isinstance(w, bool) and w >= 0 for w in weights) and \
            0 < sum(map(float, weights)) < math.inf  # (each finite, and their sum)
    except (KdError, TypeError, KeyError):  # (not JSON, or not of this shape)
        ok = False
    if not ok:
        raise InputError(f"{WEIGHTS} is not the teachers' weights kd distill writes", str(path),
                         f"delete {path}: the rerun chooses the weights again on STS-B dev")
    return tuple(float(w) for w in weights)


def _choice(run: _Run) -> dict[str, Any]:
    """choice.json as `_choose` writes it; a damaged one is named with the fix that redoes its step (it was "a file
    is not valid JSON" naming a line, not the file: a probe)."""
    path, names = run.out / "choice.json", {s.name for s in run.recipe.students}
    try:
        choice = read_json(path, "")
        scores, candidates = choice["sts_dev"], choice["candidates"]
        # (NaN, true, a chosen stage no candidate: each was taken, and said as the choice, exit 0: a probe)
        ok = names <= set(scores) and isinstance(candidates, list) and choice["chosen"] in candidates and \
            set(candidates) <= names and \
            all(isinstance(v, float | int) and not isinstance(v, bool) and math.isfinite(v) for v in scores.values())
    except (KdError, TypeError, KeyError, AttributeError):  # (not JSON, or not of this shape)
        ok = False
    if not ok:
        raise InputError("choice.json is not the choice kd distill writes for this recipe", str(path),
                         f"delete {path}: the rerun chooses the stage again on STS-B dev (seconds)")
    return choice


def _export(run: _Run) -> None:
    # (a folder kd export will not replace was refused before any work: `_refuse_damaged`)
    for fmt, folder in (("sentence-transformers", run.out / "model"), ("onnx", run.out / "onnx")):
        if folder.is_dir() and not folder.is_symlink() and _foreign_files(run, folder) == []:
            shutil.rmtree(folder)  # the run's own export: kd export refuses one that lost the file that tells one
        export_student(chosen_dir(run), fmt, folder, overwrite=True)


def _foreign_files(run: _Run, folder: Path) -> list[str] | None:
    """The files in export folder `folder` that neither the run's export wrote (distill.json records them: step_files)
    nor kd (its card and sidecars, a temp left by a kill), dotfiles included; None when the run records none (a run of
    an older kd). An empty list: the folder is the run's own, even without the file that tells an export (each of
    modules.json, config_sentence_transformers.json, kd_onnx.json deleted stopped every rerun: a probe)."""
    state = _read_state(run.out / STATE) if (run.out / STATE).is_file() else {}
    wrote = step_files.recorded(state, step_name(StepKind.export))
    if wrote is None:
        return None
    by_name = None in wrote.values()  # (a record of names only, before their sha256)

    # (recorded by name, an edited card and any other kd command's output were deleted with the folder: a probe)
    def own(p: Path) -> bool:
        rel = str(p.relative_to(run.out))
        as_written = rel in wrote and step_files.as_written(p, wrote[rel])
        if p == run.card:  # the evaluation's (kd's record beside it) or the export's own, unchanged
            return kd_wrote(p) or as_written or by_name
        if sidecar_of(p) == run.card:  # its record, or the one its deletion left
            return kd_wrote(p) or kd_record_left(p)
        return as_written or killed_write(p)  # (any ".kd-tmp-" name was kd's: a probe)

    return sorted({str(file_lost(p).relative_to(folder)) for p in folder.rglob("*")
                   if (p.is_file() or p.is_symlink()) and not own(p)})


def _evaluate(run: _Run) -> None:
    """The suite: the chosen student beside its teacher and, when it is another sentence encoder, the start model
    (the model the student replaces); then the model card."""

    common = dict(measures=[Measure.suite], baseline=False, progress=run.cfg.progress)
    # the baseline's row is always there: beside the chosen student, or as the chosen one
    students = list(dict.fromkeys([chosen_dir(run), run.stage_dir(R.BASELINE)]))
    cfg = EvalConfig(students=[str(s) for s in students], store=str(run.store), teacher=run.names["teacher"],
                     json_path=str(run.out / "report.json"), markdown_path=str(run.out / "report.md"), overwrite=True,
                     **common)
    report = evaluate(cfg)
    if run.other_start():
        start = evaluate(EvalConfig(teacher=run.specs["start"], **common)).models[0]
        start.name, start.kind = f"{start.name} (start)", "start model"
        report.models.insert(1, start)
        write_outputs(report, cfg)
    if run.cfg.export:
        _model_card(run, report.markdown(), "`kd eval --task suite`")


def _sts_report(run: _Run) -> None:
    """The evaluation that fits any run: STS-B dev (the choice's) and test, read once here, of the chosen student and
    its baseline, so a user learns whether training beat the start; students encode thousands of sentences a second,
    so this costs seconds where the suite's reference models cost tens of minutes on a first CPU run (issue 50).
    report.json / report.md and the model card, as the suite writes them."""

    choice, test = _choice(run), tasks.load_stsb("test")
    rows = []
    for name in dict.fromkeys([choice["chosen"], R.BASELINE]):
        score = _sts(load(run.stage_dir(name)), test)
        kind = "baseline (the untrained start)" if name == R.BASELINE else "student"
        rows.append({"name": name, "kind": kind + (", chosen" if name == choice["chosen"] else ""),
                     "sts_dev": round(choice["sts_dev"][name], 2), "sts_test": round(score, 2)})
    table = "| model | kind | STS-B dev | STS-B test |\n|---|---|---|---|\n" + "\n".join(
        f"| {r['name']} | {r['kind']} | {r['sts_dev']:.2f} | {r['sts_test']:.2f} |" for r in rows)
    write_text(run.out / "report.json", json.dumps({"level": "sts", "models": rows}, indent=1), "kd distill", "report")
    write_text(run.out / "report.md", table + "\n", "kd distill", "report")
    if run.cfg.export:
        _model_card(run, table, "`kd distill` (STS-B dev and test; `--suite` for the whole suite)")


def _model_card(run: _Run, table: str, measured_by: str) -> None:
    choice = _choice(run)
    stages = "\n".join(f"| {s.name} | {s.source} | {choice['sts_dev'][s.name]:.2f} |" for s in run.recipe.students)
    start = run.specs["start"].source if run.specs["start"] else None
    teacher = run.specs["teacher"].source if len(run.teacher_roles) == 1 else run.target()  # several: their weights
    text = Template(CARD.read_text(encoding="utf-8")).substitute(
        name=f"kd-{run.recipe.name}", recipe=run.recipe.name, teacher=teacher,
        start_line=f", starting from `{start}`" if start else "", rows=_rows(run), stages=stages,
        chosen=choice["chosen"], table=table, measured_by=measured_by, recipe_text="```toml\n" +
        Path(run.recipe.path).read_text(encoding="utf-8").strip() + "\n```")
    write_text(run.card, text, "kd distill", "model card")  # kd's own: a re-export keeps it


def _rows(run: _Run) -> str:
    return f"{Store.open(run.store).manifest.inputs['num_rows']:,}"


def _read_report(run: _Run) -> dict[str, Any] | None:
    path = run.out / "report.json"
    if not path.is_file():
        return None
    try:
        return read_json(path, "")
    except KdError as e:
        raise InputError(f"report.json is not a report ({e.what})", str(path),
                         f"delete {path}: the rerun evaluates the chosen student again") from None
