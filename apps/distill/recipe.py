"""Distillation recipes: data, not code. A TOML file names the teacher, the model the student starts from, what
the store must hold, and the training stages in order; `kd distill` runs it (apps.distill.run).

    description = "..."
    teacher = "mpnet"          # whose vectors the student learns; several as one target: ["mpnet", "minilm"]
    weights = [0.7, 0.3]       # optional, several teachers: their weights (default: chosen on STS-B dev)
    start = "minilm"           # optional: whose tokenizer, embeddings and layers it starts from
    target = "sentence"        # the teacher output the student matches

    [measured]                 # optional: corpus sizes (rows) at which training beat the baseline on STS-B dev
    rows = [1000, 10000]       # (docs/results.md); --dry-run warns below the smallest that did
    beat_baseline = [false, true]

    [outputs]                  # what kd precompute stores for each role
    teacher = ["sentence"]
    start = ["init"]
    keep_layers = "0,1,2,3,4,5"

    [[stage]]                  # one kd train-student run each, in order
    name = "cosine"
    from = "start"             # start | teacher (their stored outputs) | an earlier stage (its student)
    arch = "transformer-init"
    objectives = ["cosine"]    # any other key is a kd train-student option (TrainConfig field)
    epochs = 1

The presets ship in apps/distill/recipes/ (`PRESETS`); `--recipe FILE` reads a user's own. Every check runs when the
file is read, before anything is computed: a bad recipe costs nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kd.common.errors import InputError, KdError
from kd.common.inputs import require_regular_file
from kd.common.layers import layer_numbers
from kd.common.parsing import parse_toml
from kd.student.objectives.base import parse_objective
from kd.student.train_config import TrainConfig

PRESET_DIR = Path(__file__).with_name("recipes")
PRESETS = tuple(sorted(p.stem for p in PRESET_DIR.glob("*.toml")))
ROLES = ("teacher", "start")
# TrainConfig fields a stage may not set: kd distill decides them (the store, the folders, the start, the target,
# the leakage exclusion, resumption and output).
DECIDED = ("store", "out", "init", "init_teacher", "target", "exclude_ids", "resume", "overwrite", "progress")
STAGE_OPTIONS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name not in DECIDED)
ROW_OUTPUTS = ("cls", "mean", "layers", "sentence", "logits")
OUTPUTS = (*ROW_OUTPUTS, "vocab", "init")


# Every recipe's first stage is its baseline (issue 50): the recipe's first student, untrained. Its start is what a
# user gets without kd's training: for `static` a model2vec-like table (the teacher's vocab output, PCA, SIF weights)
# with its head fitted by least squares onto the teacher's width (student.head_fit); for the Transformer presets the
# start model itself, at its own width (apps.distill.run `start_itself`). The choice weighs it like any stage, so
# training that makes a student worse on dev is never what kd distill exports; on a small corpus that happens
# (static on 1,000 sentences, docs/results.md).
BASELINE = "baseline"
UNTRAINED = {"lr": 0.0, "max_steps": 1, "val_percent": 0.0, "patience": 0}  # rate 0: the weights stay as initialised


@dataclass(frozen=True)
class Stage:
    name: str
    source: str  # "start", "teacher" or an earlier stage's name (TOML key `from`)
    options: dict[str, Any]  # TrainConfig fields


@dataclass(frozen=True)
class Recipe:
    name: str
    path: str
    description: str
    teachers: tuple[str, ...]  # whose vectors the student learns: one, or several as one target (student.target)
    weights: tuple[float, ...] | None  # several teachers: their weights; None: chosen on STS-B dev
    start: str | None
    target: str
    outputs: dict[str, list[str]]  # role -> outputs kd precompute stores for it
    keep_layers: str | None
    stages: tuple[Stage, ...] = field(default_factory=tuple)  # as the recipe writes them
    measured: tuple[tuple[int, bool], ...] = ()  # (corpus rows, whether training beat the baseline on STS-B dev)

    def size_warning(self, rows: int) -> str | None:
        """What kd's measurements say about a corpus of `rows` (None: nothing to warn about, or nothing measured)."""
        if not self.measured:
            return None
        beat = [r for r, won in self.measured if won]
        lost = [r for r, won in self.measured if not won and r >= rows]
        sizes = ", ".join(f"{r:,}" for r, won in self.measured if not won)
        if beat and rows >= min(beat):
            return None
        if not beat and not lost:
            return None  # larger than every size measured, where none beat it: not known
        where = f"at no size measured ({sizes} rows)" if not beat else \
            f"from {min(beat):,} rows on" + (f" (not at {sizes})" if sizes else " (smaller corpora not measured)")
        return (f"a corpus of {rows:,} rows: in kd's measurements (docs/results.md) the {self.name} preset's "
                f"training beat its baseline on STS-B dev {where}; this run will likely export the baseline (the "
                "untrained start) and say so")

    @property
    def digest(self) -> str:
        """sha256 of what the recipe makes a run do (its models, outputs and stages as written), not of its words:
        the description and the [measured] sizes change no step (a run's identity, apps.distill.config)."""
        what = {"teachers": self.teachers, "weights": self.weights, "start": self.start, "target": self.target,
                "outputs": self.outputs, "keep_layers": self.keep_layers,
                "stages": [[s.name, s.source, s.options] for s in self.stages]}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    @property
    def teacher(self) -> str:
        """The main teacher (the first named): its tokenizer and outputs are what `from = "teacher"` starts from."""
        return self.teachers[0]

    @property
    def baseline(self) -> Stage:
        """The recipe's first student, untrained (BASELINE)."""
        first = self.stages[0]
        return Stage(BASELINE, first.source, first.options | UNTRAINED)

    @property
    def students(self) -> tuple[Stage, ...]:
        """What a run trains, in order: the baseline, then the recipe's stages."""
        return (self.baseline, *self.stages)

    def stage(self, name: str) -> Stage:
        return next(s for s in self.students if s.name == name)

    def role_of(self, stage: Stage) -> str:
        """The role (teacher or start) whose tokenizer a stage's student has: its first stage's source."""
        while stage.source not in ROLES:
            stage = self.stage(stage.source)
        return stage.source


def is_stage_name(name: object) -> bool:
    """A name that is one folder of stages/ (".." trained into --out's parent, and a run's record naming one had
    a folder outside --out deleted: a probe)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def find(spec: str) -> Path:
    """A preset name or a recipe file's path."""
    if spec in PRESETS:
        return PRESET_DIR / f"{spec}.toml"
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        if path.exists():  # a named pipe would block the read: refused as what it is, not as "not found"
            require_regular_file(str(path), "the recipe")
        if not path.is_file():
            raise InputError("recipe file not found", str(path), f"pass a TOML file, or a preset: {', '.join(PRESETS)}")
        return path
    raise InputError(f"unknown student preset {spec!r}", "--student", f"use one of {', '.join(PRESETS)}, or "
                     "--recipe FILE for your own")


def load(spec: str) -> Recipe:
    """Read and check a recipe (a preset name or a file); every error names the file, the stage and the key."""
    path = find(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"the recipe is not UTF-8 text ({e})", str(path), "save the file as UTF-8") from None
    raw = parse_toml(text, str(path), "fix the file (toml.io)")
    return _recipe(raw, path)


def _recipe(raw: dict[str, Any], path: Path) -> Recipe:
    where = str(path)
    _only(raw, ("description", "teacher", "weights", "start", "target", "measured", "outputs", "stage"), where,
          "top-level key")
    outputs = raw.get("outputs", {})
    _only(outputs, (*ROLES, "keep_layers"), f"{where} [outputs]", "key")
    teachers = _teachers(raw, where)
    r = Recipe(name=path.stem, path=where, description=_str(raw, "description", where, ""),
               teachers=teachers, weights=_weights(raw.get("weights"), len(teachers), where), start=raw.get("start"),
               target=_str(raw, "target", where, "sentence"),
               outputs={role: _outputs(outputs, role, where) for role in ROLES},
               keep_layers=outputs.get("keep_layers"), stages=tuple(_stages(raw.get("stage"), where)),
               measured=_measured(raw.get("measured", {}), f"{where} [measured]"))
    if r.keep_layers is not None:
        layer_numbers(str(r.keep_layers), f"{where} [outputs] keep_layers")
    if r.target not in ROW_OUTPUTS:
        raise InputError(f"target {r.target!r} is not a row output", where, f"use one of {', '.join(ROW_OUTPUTS)}")
    if r.target not in r.outputs["teacher"]:
        raise InputError(f"the target {r.target!r} is not among the teacher's outputs", f"{where} [outputs] teacher",
                         f"add {r.target!r} to it")
    for stage in r.stages:
        _check_inputs(r, stage)
    return r


def _only(table: Any, allowed: tuple[str, ...], where: str, what: str) -> None:
    if not isinstance(table, dict):
        raise InputError(f"expected a table, got {type(table).__name__}", where, "see apps/distill/recipes/*.toml")
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise InputError(f"unknown {what} {unknown[0]!r}", where, f"use one of {', '.join(allowed)}")


def _str(raw: dict, key: str, where: str, default: str | None = None) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise InputError(f"{key!r} must be a non-empty string", where, f'e.g. {key} = "..."')
    return value


def _measured(table: Any, where: str) -> tuple[tuple[int, bool], ...]:
    _only(table, ("rows", "beat_baseline"), where, "key")
    rows, beat = table.get("rows", []), table.get("beat_baseline", [])
    counts = isinstance(rows, list) and all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in rows)
    flags = isinstance(beat, list) and all(isinstance(b, bool) for b in beat)
    ok = counts and flags and len(rows) == len(beat)
    if not ok:
        raise InputError("rows and beat_baseline must be lists of equal length: row counts and true/false", where,
                         "e.g. rows = [1000, 10000] and beat_baseline = [false, true]")
    return tuple(zip(rows, beat))


def _teachers(raw: dict, where: str) -> tuple[str, ...]:
    """`teacher = "mpnet"` or `teacher = ["mpnet", "minilm"]`: distinct non-empty names."""
    value = raw.get("teacher")
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise InputError("'teacher' must be a name or a list of names", where, 'e.g. teacher = "mpnet", or '
                         'teacher = ["mpnet", "minilm"] for several as one target')
    return tuple(names)  # distinct: checked once parsed (kd.pipeline.teacher.resolve.check_distinct)


def _weights(value: Any, teachers: int, where: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(w, int | float) and not isinstance(w, bool) for w in value):
        raise InputError("'weights' must be a list of numbers", where, "e.g. weights = [0.7, 0.3]")
    return check_weights([float(w) for w in value], teachers, where)


def check_weights(weights: list[float], teachers: int, where: str) -> tuple[float, ...]:
    """One finite weight >= 0 per teacher, summing to a positive number (the recipe's and --weights' one check)."""
    if teachers < 2:
        raise InputError("weights need several teachers", where, "name several teachers, or drop the weights")
    if len(weights) != teachers:
        raise InputError(f"{len(weights)} weights for {teachers} teachers", where, "give one weight per teacher")
    if not all(math.isfinite(w) and w >= 0 for w in weights) or not sum(weights) > 0:
        raise InputError(f"the weights {weights} are not finite numbers >= 0 with a positive sum", where,
                         "e.g. weights = [0.7, 0.3]")
    return tuple(weights)


def _outputs(outputs: dict, role: str, where: str) -> list[str]:
    value = outputs.get(role, [])
    if not isinstance(value, list) or not all(isinstance(o, str) and o in OUTPUTS for o in value):
        raise InputError(f"[outputs] {role} must be a list of outputs", where, f"choose from {', '.join(OUTPUTS)}")
    return value


def _stages(raw: Any, where: str) -> list[Stage]:
    if not isinstance(raw, list) or not raw:
        raise InputError("the recipe has no [[stage]]", where, "add at least one [[stage]] table")
    stages: list[Stage] = []
    for i, table in enumerate(raw, 1):
        name = table.get("name") if isinstance(table, dict) else None
        at = f"{where} [[stage]] {i} ({name or 'unnamed'})"
        _only(table, ("name", "from", *STAGE_OPTIONS), at, "stage option")
        if not is_stage_name(name) or name in (*ROLES, BASELINE):
            raise InputError(f"a stage needs a name that is not a role, {BASELINE!r} (kd's own) or a path", at,
                             'e.g. name = "cosine"')
        if name in {s.name for s in stages}:
            raise InputError(f"two stages are named {name!r}", at, "give each stage its own name")
        source = table.get("from", "start")
        if source not in ROLES and source not in {s.name for s in stages}:
            raise InputError(f"stage {name!r} starts from {source!r}, which is neither a role nor an earlier stage",
                             at, f"from is one of {', '.join([*ROLES, *(s.name for s in stages)])}")
        options = {k: v for k, v in table.items() if k not in ("name", "from")}
        _check_options(options, at)
        stages.append(Stage(name, source, options))
    return stages


def _check_options(options: dict[str, Any], at: str) -> None:
    """Objectives parse and every option is in range: TrainConfig's own checks, run now on a placeholder."""
    objectives = options.get("objectives", ["cosine"])
    if not isinstance(objectives, list) or not objectives:
        raise InputError("objectives must be a non-empty list", at, 'e.g. objectives = ["cosine"]')
    for key, value in options.items():
        _check_type(key, value, at)
    if options.get("init_layers") is not None:  # its range needs the teacher; its form is checked now
        layer_numbers(str(options["init_layers"]), f"{at}: init_layers")
    try:
        for spec in objectives:
            parse_objective(str(spec))
        TrainConfig("store", "out", **options)
    except KdError as e:
        raise InputError(e.what, f"{at}: {e.where}" if e.where else at, e.fix) from None
    except (TypeError, ValueError) as e:
        raise InputError(f"a stage option has the wrong type or value: {e}", at,
                         "see kd train-student --help") from None


# TOML's types for TrainConfig's annotations (enum options are strings in a recipe). A bool is no number here,
# although Python's bool is an int: `epochs = true` was taken as 1 (issue 48).
_TOML_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,), "list[str]": (list,),
                                            "dict[str, Any]": (dict,)}
_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(TrainConfig)}


def _check_type(key: str, value: Any, at: str) -> None:
    """A stage option's TOML value has its option's type (None is no TOML value, so optional is the same check)."""
    name = _FIELD_TYPES[key].removesuffix(" | None")
    want = _TOML_TYPES.get(name, (str,))
    if isinstance(value, bool) != (want == (bool,)) or not isinstance(value, want):
        kind, example = {"int": ("an integer", "3"), "float": ("a number", "0.001"), "bool": ("true or false", "true"),
                         "list[str]": ("a list", '["..."]'), "dict[str, Any]": ("a table", "{ ... }")}.get(
                             name, ("a string", '"..."'))
        raise InputError(f"stage option {key} = {value!r} is not {kind}", at, f"write it as {kind}: {key} = {example}")


def _check_inputs(r: Recipe, stage: Stage) -> None:
    """What a stage starts from is there: the role and the outputs its start needs, and one tokenizer."""
    at = f"{r.path} [[stage]] {stage.name}"
    if stage.source == "start" and r.start is None:
        raise InputError(f"stage {stage.name!r} starts from the start model, and the recipe names none", at,
                         'add start = "minilm" (or another model), or from = "teacher"')
    if stage.source in ROLES:
        needs = _needed_outputs(stage.options)
        missing = [o for o in needs if o not in r.outputs[stage.source]]
        if missing:
            raise InputError(f"stage {stage.name!r} needs the {stage.source}'s {', '.join(missing)} output, which the "
                             f"recipe does not store", at, f"add {missing} to [outputs] {stage.source}")
    else:
        _check_continuation(r, stage, at)


def _check_continuation(r: Recipe, stage: Stage, at: str) -> None:
    """A stage that starts from an earlier stage's student keeps its arch, and so its tokenizer: a
    transformer-init stage reads the start model's tokenizer and layers, which a student rooted in the teacher's
    tokenizer (a static or recurrent one from `from = "teacher"`) does not have."""
    arch, before = stage.options.get("arch", "bilstm"), r.stage(stage.source).options.get("arch", "bilstm")
    if arch == before:
        return
    root = r.role_of(stage)
    wants = "start" if arch == "transformer-init" and r.start else root
    if wants != root:
        raise InputError(f"stage {stage.name!r} ({arch}) would start from stage {stage.source!r}, a student with "
                         f"another tokenizer (the {root}'s, not the {wants}'s)", at,
                         f'start it from = "{wants}", or from a {arch} stage')
    raise InputError(f"stage {stage.name!r} continues stage {stage.source!r} ({before}) as {arch}", at,
                     "a stage that starts from a student keeps its arch")


def _needed_outputs(options: dict[str, Any]) -> list[str]:
    arch = options.get("arch", "bilstm")
    if arch == "transformer-init":
        return ["init"]
    if options.get("init_embeddings") == "vocab":
        return ["vocab"]
    return []

