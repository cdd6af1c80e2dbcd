"""Every option of `kd distill`, declared once (flag, help, range: kd.common.options); `kd.distill(...)` takes the
same keywords. Light to import: `kd --help` builds the command from these fields."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kd.common import bounds as B
from kd.common.errors import InputError
from kd.common.options import check_ranges, one_value_as_sequence, option, saved_defaults
from kd.common.paths import as_given, named_files, recorded_files, refuse_empty, start_folder
from kd.pipeline.teacher.resolve import parse_teacher, recorded_spec

if TYPE_CHECKING:
    from kd.apps.distill.recipe import Recipe


@dataclass
class DistillConfig:
    """Every option of `kd distill` (the CLI builds one; `kd.distill(...)` takes the same keywords)."""

    inputs: list[str] = option(path=True, argument=True,
                               help="Corpus files or globs: .txt, .jsonl, .csv/.tsv, .parquet")
    out: str = option(short="-o", help="Folder for the store, the stages, the model and the report")
    store: str | None = option(None, help="Use (and grow) this store instead of OUT/store: one that already holds "
                                          "the teacher's outputs for this corpus (another run's) is not recomputed")
    reuse: str | None = option(None, path=True,
                               help="Copy the teacher and start model vectors that another store holds for this "
                                    "corpus's rows (same text, same settings) instead of computing them: a grown "
                                    "corpus, or other --segment/--sample, pays only its new rows")
    student: str = option("tiny6", help="Preset: tiny6 | tiny6-ensemble | tiny3 | tiny3-ensemble | static | bilstm "
                                        "(apps/distill/recipes)")
    recipe: str | None = option(None, path=True,
                                help="Your own recipe file (TOML; see docs/distill.md); overrides --student")
    teacher: str | None = option(None, short="-t", help="Replace the recipe's teacher: a packaged name or a "
                                                        "checkpoint folder; several as one target: mpnet,minilm")
    weights: str | None = option(None, help="Several teachers: their weights, e.g. 0.7,0.3 (default: the recipe's, "
                                            "else chosen on STS-B dev from the teachers' vectors, in seconds)")
    start: str | None = option(None, help="Replace the recipe's start model: a packaged name or a checkpoint folder")
    text_column: str | None = option(None, help="Column with the text (csv/jsonl/parquet)")
    segment: str = option("none", choices=B.Segment, help=B.SEGMENT_HELP)
    dedup: bool = option(True, help="Drop repeated texts")
    sample: float | None = option(None, range=B.SAMPLE, help="Keep this fraction of the rows, chosen by id hash "
                                                             "(kd precompute --sample)")
    seed: int = option(0, range=B.SEED, help="Added to every stage's seed (the recipe's seeds are offsets): runs that "
                                             "differ only in --seed tell a margin from noise")
    shard_rows: int = option(20_000, range=B.ROWS, help="Rows per store shard")
    exclude_leakage: bool = option(True, flag="--leakage", help="Leave out the rows that are also evaluation text")
    export: bool = option(True, help="Export the chosen student (sentence-transformers, ONNX)")
    evaluate: bool = option(True, help="Evaluate the chosen student: STS-B dev and test beside its baseline (seconds)"
                                       ", or with --suite the whole suite")
    suite: bool = option(False, help="Evaluate on the whole suite (MRPC, Lee, SST-2, clustering, retrieval) beside "
                                     "the teacher and the start model: tens of minutes on a CPU until their vectors "
                                     "are cached")
    dry_run: bool = option(False, help="Print the plan and each step's estimated time; write nothing")
    progress: bool = option(True, help="Show progress")

    # options a rerun may change without touching what was computed
    # (--reuse too: a copied vector is the one it saves computing, to rounding: ~1e-7, other batch neighbours)
    RESUMABLE = ("reuse", "export", "evaluate", "suite", "dry_run", "progress")

    def __post_init__(self) -> None:
        one_value_as_sequence(self)
        self.out = os.fspath(self.out)
        self.store = None if self.store is None else os.fspath(self.store)
        # the run resolves both at once: "" was the working folder, and a run was written into it (a probe)
        for value, name in ((self.out, "--out"), (self.store, "--store")):
            if value is not None:
                refuse_empty(value, name)
        # ("" was the recipe's teacher, unsaid; an empty entry of a list, "a,", a traceback: probes). refuse_empty's
        # rule, written here: a teacher's text goes to its one parser and nowhere else (issue 52)
        for parts, name, several in ((self.teacher, "--teacher", True), (self.start, "--start", False)):
            if isinstance(parts, str) and not all(p.strip() for p in (parts.split(",") if several else [parts])):
                raise InputError(f"{name} is empty" if not parts.strip() else f"{name} {parts!r} has an empty entry",
                                 f"{name} {parts!r}", f"pass a packaged name or a checkpoint folder (several: "
                                 f"mpnet,minilm), or leave {name} out for the recipe's")
        if not self.inputs:
            raise InputError("no corpus given", "kd distill", "pass one or more text files: kd distill corpus.txt ...")
        check_ranges(self, "kd distill options")

    def plan(self) -> Recipe:
        from kd.apps.distill.recipe import load  # (torch: only when a run starts, not for `kd --help`)

        return load(self.recipe or self.student)

    def identity(self, recipe: Recipe, teachers: dict[str, str | None]) -> dict[str, Any]:
        """What makes two runs the same run: the options and what the recipe makes the run do (its digest, not its
        bytes: a newer kd may reword a preset or add [measured] sizes, and a long run must still resume). Paths are
        the files they name (out1, out1/, /abs/out1 and a symlink to it are one run); `teachers`: --teacher and
        --start as the run parsed them, each folder by the file it names (`_Run.given_teachers`)."""
        opts = {k: v for k, v in asdict(self).items() if k not in self.RESUMABLE and k not in teachers}
        return named_files(opts, PATHS) | teachers | {"recipe_digest": recipe.digest}

    def difference(self, recorded: dict[str, Any], recipe: Recipe, teachers: dict[str, str | None],
                   record_file: Path) -> tuple[str, Any, Any] | None:
        """The first key in which the identity a run recorded in `record_file` differs from this one's (the key,
        then and now), or None: the same run. A run recorded before the digest holds `recipe_sha256`, the recipe
        file's bytes; the same bytes now are the same recipe. An option the record lacks is compared at its default
        (common.options.saved_defaults). A record of an older kd holds its paths as typed, read from the folder the
        run started in (`recorded_files`: a moved-folder refusal named a place the run never was), and its teachers
        as typed: the same text now is the same teacher."""
        now = self.identity(recipe, teachers)
        defaults = {k: v for k, v in saved_defaults(DistillConfig).items() if k in now}
        began = start_folder(recorded.get("out"), as_given(self.out))
        recorded = recorded_files(defaults | recorded, PATHS, as_given(self.out), record_file, fix="pass a new --out")
        recorded |= {k: _recorded_teachers(recorded[k], k, began) for k in teachers
                     if isinstance(recorded.get(k), str) and recorded[k] != now[k]}
        if "recipe_sha256" in recorded:
            now = {k: v for k, v in now.items() if k != "recipe_digest"} | {
                "recipe_sha256": hashlib.sha256(Path(recipe.path).read_bytes()).hexdigest()}
        key = next((k for k in sorted(set(now) | set(recorded)) if recorded.get(k) != now.get(k)), None)
        return None if key is None else (key, recorded.get(key), now.get(key))


def teacher_roles(count: int) -> list[str]:
    """The roles of a run's `count` teachers: the main one is "teacher" (its tokenizer and outputs are what `from =
    "teacher"` starts from), the others of a combined target "teacher2", "teacher3", ..."""
    return ["teacher", *(f"teacher{i}" for i in range(2, count + 1))]


def _recorded_teachers(text: str, option: str, began: Path | None) -> str:
    """An older record's --teacher or --start (as typed, each folder relative to where its run began) as a record of
    today's kd names them (`_Run.given_teachers`): the same text typed in another folder was the same run (a probe)."""
    parts = text.split(",")
    roles = ["start"] if option == "start" else teacher_roles(len(parts))
    return ",".join(str(recorded_spec(parse_teacher(part, role), began)) for role, part in zip(roles, parts))


PATHS = ("out", "store", "recipe", "inputs")  # options naming files (inputs: a list), compared as the files they name
