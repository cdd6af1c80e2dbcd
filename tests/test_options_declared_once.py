"""Each option of every kd command (`kd precompute`, `kd train-student`, `kd eval`, `kd distill`, `kd demo`,
`kd finetune`, `kd finetune-teacher`, `kd info`, `kd validate`, ...: the CONFIGS table) is declared once, on its
config field (issues 40 and 52).

The CLI's parameters are built from the fields (flag, help, range, choices, default), the configs check their
ranges from the same fields, and no flag is written as a string in a second place.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kd.apps.demo.config import DemoConfig
from kd.apps.distill.config import DistillConfig
from kd.apps.eval.config import EvalConfig
from kd.apps.leakage_config import LeakageConfig
from kd.apps.query_config import QueryConfig
from kd.apps.search_config import SearchConfig
from kd.cli import app
from kd.common import bounds as B
from kd.common import options
from kd.common.errors import KdError
from kd.dataset.cluster_config import ClusterConfig
from kd.dataset.index_config import IndexConfig
from kd.pipeline.job import PrecomputeJob
from kd.pipeline.teacher.finetune_config import TeacherFinetuneConfig
from kd.storage.info_config import InfoConfig
from kd.storage.validate_config import ValidateConfig
from kd.student.embed_config import EmbedConfig
from kd.student.exporters import ExportConfig
from kd.student.finetune_config import FinetuneConfig
from kd.student.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = typer.main.get_command(app).commands
CONFIGS = {"precompute": (PrecomputeJob, "pipeline/job.py"), "train-student": (TrainConfig, "student/train_config.py"),
           "distill": (DistillConfig, "apps/distill/config.py"), "demo": (DemoConfig, "apps/demo/config.py"),
           "eval": (EvalConfig, "apps/eval/config.py"), "finetune": (FinetuneConfig, "student/finetune_config.py"),
           "finetune-teacher": (TeacherFinetuneConfig, "pipeline/teacher/finetune_config.py"),
           "info": (InfoConfig, "storage/info_config.py"), "validate": (ValidateConfig, "storage/validate_config.py"),
           "leakage": (LeakageConfig, "apps/leakage_config.py"),
           "export": (ExportConfig, "student/exporters/__init__.py"),
           "cluster": (ClusterConfig, "dataset/cluster_config.py"), "index": (IndexConfig, "dataset/index_config.py"),
           "search": (SearchConfig, "apps/search_config.py"), "embed": (EmbedConfig, "student/embed_config.py"),
           "query": (QueryConfig, "apps/query_config.py")}
ENTRY = {"precompute": "precompute", "train-student": "train_student", "distill": "distill", "demo": "demo",
         "eval": "eval_", "finetune": "finetune_cmd", "finetune-teacher": "finetune_teacher_cmd", "info": "info",
         "validate": "validate", "leakage": "leakage",
         "export": "export_cmd", "cluster": "cluster_cmd",
         "index": "index_cmd", "search": "search_cmd", "embed": "embed",
         "query": "query_cmd"}
SEEN = {"precompute": {"--shard-rows", "--batch-tokens"}, "train-student": {"--batch-size", "--layers"},
        "distill": {"--leakage", "--shard-rows"}, "demo": {"--epochs", "--quick"},
        "eval": {"--task", "--json"}, "finetune": {"--kd-store", "--hidden"},
        "finetune-teacher": {"--base", "--warmup"}, "info": set(), "validate": {"--repair"},
        "leakage": {"--exclude-out"}, "export": {"--format", "--out"},
        "cluster": {"--threshold", "-k"}, "index": {"--table", "--kind"},
        "search": {"-k", "--teacher"}, "embed": {"--student", "--batch-size"},
        "query": {"--format", "--out"}}  # flags the walk must see


def _flags(command: str) -> set[str]:
    return {o for p in COMMANDS[command].params if p.param_type_name == "option"
            for o in p.opts + p.secondary_opts if o != "--help"}


def _cli_nodes(command: str) -> list[ast.AST]:
    """cli.py without the other commands (their own --out, --teacher... are theirs)."""
    tree = ast.parse((ROOT / "cli.py").read_text(encoding="utf-8"))
    skip = {id(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != ENTRY[command]
            and any("app.command" in ast.unparse(d) for d in n.decorator_list)}
    return [n for top in tree.body if id(top) not in skip for n in ast.walk(top)]


def _literals(nodes: list[ast.AST]) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_no_flag_is_written_twice(command):
    cls, path = CONFIGS[command]
    config = list(ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8"))))
    literals = _literals(_cli_nodes(command)) + _literals(config)
    flags = _flags(command)
    assert SEEN[command] <= flags
    twice = {f: literals.count(f) for f in flags if literals.count(f) > 1}
    assert not twice, f"{command}: flags written in more than one place: {twice}"


@pytest.mark.parametrize("path", [p for _, p in CONFIGS.values()])
def test_range_checks_list_no_flags_by_hand(path):
    """The configs check the ranges their fields declare (options.check_ranges), not a hand-written list."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    by_hand = [ast.unparse(n)[:80] for n in ast.walk(tree) if isinstance(n, ast.Call)
               and ast.unparse(n.func) == "B.check"]
    assert not by_hand, by_hand


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_the_command_parameters_are_the_declared_fields(command):
    cls, _ = CONFIGS[command]
    params = {p.name: p for p in COMMANDS[command].params if p.name != "help"}
    declared = {f.name: (f, o) for f, o in options.declared(cls) if o.cli}
    assert set(params) == set(declared)
    undeclared = {f.name for f in dataclasses.fields(cls) if f.init and options.KEY not in f.metadata}
    # a new field must say how it is passed (TrainConfig.student and DemoConfig.tiers: library-only, unbounded)
    assert undeclared == {TrainConfig: {"student"}, DemoConfig: {"tiers"}}.get(cls, set())
    for name, (f, opt) in declared.items():
        p = params[name]
        if opt.argument:
            assert p.param_type_name == "argument", name
            continue
        assert p.opts[0] == options.flag_of(name, opt) and p.help == (opt.help or None), name
        assert (opt.short in p.opts) if opt.short else len(p.opts) == 1, name
        if opt.range is not None:
            assert (p.min, p.max) == (opt.range.lo, opt.range.hi), name
        if opt.choices is not None:
            kind = p.type_descriptor.annotation
            kind = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind  # repeatable: list[Enum]
            assert B.choices(kind) == B.choices(opt.choices), name
        if f.type == "bool":
            assert p.secondary_opts == [f"--no-{p.opts[0][2:]}"], name
    if "device" in params:
        assert params["device"].callback is not None  # --device's forms are checked at parse time


def test_renamed_fields_keep_their_flags():
    flags = {p.name: p.opts for p in COMMANDS["train-student"].params}
    assert flags["store"] == ["--shards", "-s"] and flags["num_layers"] == ["--layers"]
    assert flags["num_workers"] == ["--workers"] and flags["objectives"] == ["--objective"]
    assert {p.name: p.opts for p in COMMANDS["precompute"].params}["teachers"] == ["--teacher", "-t"]


@pytest.mark.parametrize("args,flag", [
    (["train-student", "-s", "S", "-o", "O", "--layers", "0"], "--layers"),
    (["train-student", "-s", "S", "-o", "O", "--workers", "-1"], "--workers"),
    (["train-student", "-s", "S", "-o", "O", "--dropout", "1"], "--dropout"),  # open end: the callback
    (["train-student", "-s", "S", "-o", "O", "--schedule", "bogus"], "--schedule"),
    (["precompute", "in.txt", "-o", "O", "--shard-rows", "0"], "--shard-rows"),
    (["precompute", "in.txt", "-o", "O", "--sample", "0"], "--sample"),
    (["precompute", "in.txt", "-o", "O", "--device", "gpu0"], "--device"),
    (["distill", "in.txt", "-o", "O", "--sample", "1.5"], "--sample"),
    (["distill", "in.txt", "-o", "O", "--segment", "words"], "--segment"),
    (["demo", "-o", "O", "--epochs", "0"], "--epochs"),
    (["eval", "--teacher", "minilm", "--task", "bogus"], "--task"),
    (["eval", "--teacher", "minilm", "--k", "0"], "--k"),
    (["finetune", "--student", "S", "--task", "classification", "--train", "t.csv", "-o", "O", "--kd-alpha", "2"],
     "--kd-alpha"),
    (["finetune-teacher", "--base", "minilm", "--task", "words", "--train", "t.csv", "-o", "O"], "--task"),
])
def test_a_bad_value_exits_2_at_parse_time(args, flag, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and f"'{flag}'" in res.output and "Invalid value" in res.output, res.output
    assert not (tmp_path / "O").exists()


def test_the_configs_refuse_by_the_declared_flag():
    with pytest.raises(KdError, match="--layers 0 must be in"):
        TrainConfig("S", "O", num_layers=0)
    with pytest.raises(KdError, match="--workers 300 must be in"):
        TrainConfig("S", "O", num_workers=300)
    with pytest.raises(KdError, match="max_val_rows 0 must be in"):  # library-only: its Python name
        TrainConfig("S", "O", max_val_rows=0)
    with pytest.raises(KdError, match="--shard-rows 0 must be in"):
        PrecomputeJob(["in.txt"], "O", ["minilm"], shard_rows=0)
    with pytest.raises(KdError, match="threads 0 must be in"):
        PrecomputeJob(["in.txt"], "O", ["minilm"], threads=0)
    with pytest.raises(KdError, match="--shard-rows 0 must be in"):
        DistillConfig(["in.txt"], "O", shard_rows=0)
    with pytest.raises(KdError, match="--epochs 0 must be in"):
        DemoConfig(epochs=0)
    with pytest.raises(KdError, match="--agreement-rows 1 must be in"):
        EvalConfig(teacher="minilm", agreement_rows=1)
    with pytest.raises(KdError, match="--text-columns needs two columns"):
        EvalConfig(teacher="minilm", text_columns=("a",))
    with pytest.raises(KdError, match="--objective") as e:
        TrainConfig("S", "O", objectives=[])
    assert e.value.where == "--objective"
    with pytest.raises(KdError, match="--batch-size 0 must be in"):
        EmbedConfig("in.txt", "S", batch_size=0)
    with pytest.raises(KdError, match="-k 0 must be in"):
        SearchConfig("S", "rates rose", teacher="minilm", k=0)
    with pytest.raises(KdError, match="--threshold 0.0 must be in"):
        ClusterConfig("S", "minilm", "sentence", 0.0)
    with pytest.raises(KdError, match="--exact-max 0 must be in"):
        ClusterConfig("S", "minilm", "sentence", 0.5, exact_max=0)
    with pytest.raises(KdError, match="--quantize int8 is for --format onnx"):
        ExportConfig("S", "O", quantize="int8")
    with pytest.raises(KdError, match="--repair must be True or False"):  # a Python caller's wrong type
        ValidateConfig("S", repair="yes")


def test_check_ranges_reads_any_declared_field():
    @dataclasses.dataclass
    class Toy:
        width: int = options.option(4, range=B.WIDTH, help="a width")
        rate: float = options.option(0.5, flag="--r", range=B.UNIT)

    options.check_ranges(Toy(), "toy")
    with pytest.raises(KdError, match="--width 0"):
        options.check_ranges(Toy(width=0), "toy")
    with pytest.raises(KdError, match="--r 2"):
        options.check_ranges(Toy(rate=2), "toy")


def test_the_cli_builds_the_config_from_the_flags(monkeypatch, tmp_path):
    import kd.pipeline.precompute as pre
    import kd.student.trainer as trainer

    seen = {}
    monkeypatch.setattr(trainer, "train", lambda cfg: seen.setdefault("cfg", cfg) and tmp_path)
    res = CliRunner().invoke(app, ["train-student", "-s", "S", "-o", "O", "--objective", "mse", "--objective",
                                   "cosine:0.5", "--layers", "2", "--workers", "1", "--no-bucket", "--arch", "static"])
    assert res.exit_code == 0, res.output
    want = TrainConfig("S", "O", objectives=["mse", "cosine:0.5"], num_layers=2, num_workers=1, bucket=False,
                       arch="static")
    assert seen["cfg"].to_json() == want.to_json()

    def stop(job):
        seen["job"] = job
        raise KdError("stop here")

    monkeypatch.setattr(pre, "run", stop)
    res = CliRunner().invoke(app, ["precompute", "a.txt", "b.txt", "-o", str(tmp_path / "s"), "-t", "x", "-t", "y",
                                   "--outputs", "vocab,init"])
    job = seen["job"]
    assert res.exit_code == 2 and (job.inputs, job.teachers, job.outputs) == (("a.txt", "b.txt"), ("x", "y"),
                                                                               ("vocab", "init"))
    CliRunner().invoke(app, ["precompute", "a.txt", "-o", str(tmp_path / "s")])
    assert seen["job"].teachers == ("minilm",) and seen["job"].outputs is None


@pytest.mark.parametrize("args", [["precompute", "in.txt", "-o", "O", "--outputs", ""],
                                  ["eval", "--teacher", "minilm", "--text-columns", " , "]])
def test_an_empty_comma_list_is_refused_not_read_as_the_default(args, tmp_path, monkeypatch):
    """`--outputs ''` wrote the teacher's default outputs with exit 0 (the probe's O008)."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "is empty" in res.output and "fix:" in res.output, res.output
    assert not (tmp_path / "O").exists()


def test_training_defaults_live_in_one_table():
    """Issue 52 item 1: a tuned training option's default is written once (train_config's BASE_DEFAULTS and
    ARCH_DEFAULTS); a dataclass elsewhere that wrote `max_length: int = 128` again would fail here."""
    from kd.student.train_config import TUNED

    found = []
    for path in [*ROOT.glob("student/**/*.py"), *ROOT.glob("apps/**/*.py"), *ROOT.glob("pipeline/**/*.py"),
                 *ROOT.glob("dataset/**/*.py"), ROOT / "cli.py"]:
        if path.name == "train_config.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ClassDef)):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                            and item.target.id in TUNED and isinstance(item.value, ast.Constant) \
                            and isinstance(item.value.value, int | float) and not isinstance(item.value.value, bool):
                        found.append(f"{path.relative_to(ROOT)}:{item.lineno} {node.name}.{item.target.id}")
    assert not found, found


def test_the_help_of_a_tuned_option_is_rendered_from_the_table():
    """The help shows every arch's default as the table has it (typed by hand, it said 1e-3 for transformer-init
    students, whose rate is 1e-4, and 3 epochs where they take 1; in brackets, rich took it for markup and showed
    nothing)."""
    from kd.student.train_config import ARCH_DEFAULTS, BASE_DEFAULTS, START_MODELS, default_help

    res = CliRunner().invoke(app, ["train-student", "--help"], env={"COLUMNS": "400"})
    text = " ".join(res.output.replace("│", " ").split())
    for key in ("lr", "epochs", "dropout", "batch_size", "max_length", "weight_decay"):
        rendered = default_help(key)
        assert rendered in text, key
        groups = dict(g.split(" ", 1) for g in rendered.removeprefix("(default: ").removesuffix(")").split("; ")[1:])
        assert rendered.startswith(f"(default: {BASE_DEFAULTS[key]:g}")
        for arch, values in ARCH_DEFAULTS.items():
            if key in values and values[key] != BASE_DEFAULTS[key]:
                want = START_MODELS if values[key] is None else f"{values[key]:g}"  # None: the start model's
                assert any(arch in archs.split("/") and v == want for archs, v in groups.items()), key
