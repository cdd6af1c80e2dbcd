"""Every numeric and enum option of every command is bounded where it is declared (kd.common.bounds).

The property: for each int/float option of each command, 0, -1 and 10**12 either exit 2 at parse time naming the
option (no traceback, nothing run), or the (command, option, value) is in MEANINGFUL below. Each choice option
refuses a bogus value listing its choices. The library configs refuse the same values with a KdError.
"""

from __future__ import annotations

import inspect
import types
import typing
from enum import Enum
from pathlib import Path

import pytest
import torch
import typer
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store
from typer.testing import CliRunner

from kd.cli import app
from kd.common import bounds as B
from kd.common.errors import KdError

COMMANDS = typer.main.get_command(app).commands

# Values with a documented meaning, accepted on purpose; any other 0, -1 or 10**12 must be refused.
MEANINGFUL = {
    ("precompute", "--shard-index", 0),  # the first writer
    ("train-student", "--seed", 0), ("finetune-teacher", "--seed", 0), ("finetune", "--seed", 0),  # a seed
    ("distill", "--seed", 0),  # no offset: the recipe's own seeds
    ("train-student", "--lr", 0),  # weights stay as initialised (a no-training baseline)
    ("train-student", "--clip", 0),  # no gradient clipping
    ("train-student", "--patience", 0),  # never stop early
    ("train-student", "--warmup", 0), ("finetune-teacher", "--warmup", 0),  # no warm-up
    ("train-student", "--workers", 0),  # read in the training process
    ("train-student", "--val-percent", 0),  # no held-out rows
    ("train-student", "--weight-decay", 0),  # no decay
    ("train-student", "--dropout", 0), ("finetune", "--dropout", 0),  # no dropout
    ("finetune", "--kd-weight", 0),  # no logit term
    ("finetune", "--kd-alpha", 0),  # logit MSE only (Tang et al.)
}


def _value_type(cmd, param) -> object:
    """The option's value type from the command's signature: int, float, a Literal, an Enum, str, ..."""
    t = typing.get_type_hints(inspect.unwrap(cmd.callback))[param.name]
    if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
        t = next(a for a in typing.get_args(t) if a is not type(None))
    return typing.get_args(t)[0] if typing.get_origin(t) is list else t


def _choices(t: object) -> tuple[str, ...] | None:
    is_enum = isinstance(t, type) and issubclass(t, Enum)
    return B.choices(t) if is_enum or typing.get_origin(t) is typing.Literal else None


def _required_args(name: str, skip: str) -> list[str]:
    """A valid value for each required parameter but `skip` (dummy paths: the parse-time check runs first)."""
    cmd, args = COMMANDS[name], [name]
    for p in cmd.params:
        if not p.required or p.name == skip:
            continue
        t = _value_type(cmd, p)
        value = (_choices(t) or ("x",))[0] if t not in (int, float) else "0.5"
        args += [value] if p.param_type_name == "argument" else [p.opts[0], value]
    return args


def _options(pred) -> list[tuple[str, str, object]]:
    return [(name, p.opts[0], t) for name, cmd in COMMANDS.items() for p in cmd.params
            if p.param_type_name == "option" and pred(t := _value_type(cmd, p), p)]


NUMERIC = _options(lambda t, p: t in (int, float))
CHOICE = _options(lambda t, p: _choices(t) is not None)


def _invoke(name: str, flag: str, value: str):
    param = next(p for p in COMMANDS[name].params if p.opts[0] == flag)
    return CliRunner().invoke(app, [*_required_args(name, param.name), flag, value])


def _refused(res, flag: str) -> bool:
    return (res.exit_code == 2 and f"'{flag}'" in res.output and "Traceback" not in res.output
            and (res.exception is None or isinstance(res.exception, SystemExit)))


def test_every_command_has_bounded_numbers_and_choices():
    assert {"precompute", "train-student", "eval", "finetune", "cluster"} <= set(COMMANDS)
    assert len(NUMERIC) > 50 and len(CHOICE) > 20  # the walk sees the options (not an empty parametrisation)


@pytest.mark.parametrize("name,flag,kind", NUMERIC, ids=[f"{n} {f}" for n, f, _ in NUMERIC])
@pytest.mark.parametrize("value", [0, -1, 10**12])
def test_numbers_out_of_range_exit_2_naming_the_option(name, flag, kind, value):
    if (name, flag, value) in MEANINGFUL:
        return
    res = _invoke(name, flag, str(value))
    assert _refused(res, flag), f"kd {name} {flag} {value}: exit {res.exit_code}\n{res.output}"


@pytest.mark.parametrize("name,flag,kind", CHOICE, ids=[f"{n} {f}" for n, f, _ in CHOICE])
def test_choices_refuse_a_bogus_value_and_list_the_allowed(name, flag, kind):
    res = _invoke(name, flag, "bogus")
    assert _refused(res, flag), res.output
    assert all(f"'{c}'" in res.output for c in _choices(kind)), res.output


DEVICE_COMMANDS = [n for n, cmd in COMMANDS.items() if any(p.name == "device" for p in cmd.params)]


@pytest.mark.parametrize("name", DEVICE_COMMANDS)
def test_device_refuses_an_unknown_name_and_lists_the_forms(name):
    assert len(DEVICE_COMMANDS) == 5  # precompute, train-student, embed, finetune-teacher, finetune
    res = _invoke(name, "--device", "gpu0")
    assert _refused(res, "--device") and "cuda:N" in res.output, res.output


def test_the_choice_literals_match_the_library_enums():
    from kd.apps.eval.run import Measure
    from kd.apps.eval.tasks import ClusterSet
    from kd.common.tasks import Task
    from kd.dataset.cluster import Method
    from kd.dataset.index import IndexKind
    from kd.dataset.query import Format
    from kd.pipeline.backends.runtime import Backend, Quantize
    from kd.pipeline.teacher.model import Precision
    from kd.storage.schema import VectorDType
    from kd.student.models import Arch
    from kd.student.pooling import Pooling
    from kd.student.train_config import EmbeddingInit, Schedule

    pairs = [(B.Measure, Measure), (B.ClusterSet, ClusterSet), (B.Backend, Backend), (B.Quantize, Quantize),
             (B.Precision, Precision), (B.ClusterMethod, Method), (B.IndexKind, IndexKind), (B.QueryFormat, Format),
             (B.VectorDType, VectorDType), (B.Task, Task), (B.Arch, Arch), (B.Pooling, Pooling),
             (B.EmbeddingInit, EmbeddingInit), (B.Schedule, Schedule)]
    for literal, enum in pairs:
        assert B.choices(literal) == tuple(m.value for m in enum), enum


# --- the cases that started it -----------------------------------------------------------------------------------

def _run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("args,flag", [
    (["eval", "--max-pairs", "-1"], "--max-pairs"),  # used to score a Python slice
    (["eval", "--agreement-rows", "0"], "--agreement-rows"),
    (["train-student", "-s", "S", "-o", "O", "--embed-dim", "0"], "--embed-dim"),  # used to mean "default"
    (["train-student", "-s", "S", "-o", "O", "--out-dim", "0"], "--out-dim"),
    (["train-student", "-s", "S", "-o", "O", "--checkpoint-every", "0"], "--checkpoint-every"),  # ZeroDivisionError
    (["embed", "in.txt", "--student", "S", "--batch-size", "0"], "--batch-size"),  # a raw ValueError
    (["search", "S", "q", "-k", str(10**12)], "-k"),  # would size a 10**12-row result
])
def test_reported_options_are_refused_at_parse_time(args, flag):
    assert _refused(_run(*args), flag)


def test_sts_split_names_the_split_not_kd_shared():
    res = _run("eval", "--sts-split", "foo")
    assert _refused(res, "--sts-split") and "KD_SHARED" not in res.output
    assert all(f"'{s}'" in res.output for s in ("train", "dev", "test"))
    from kd.apps.eval import tasks
    from kd.apps.eval.run import EvalConfig

    for call, said in ((lambda: tasks.load_stsb("foo"), "unknown STS-B split 'foo'"),
                       (lambda: EvalConfig(sts_split="foo"), "--sts-split 'foo' is not one of")):
        with pytest.raises(KdError, match=said) as e:
            call()
        assert "train, dev, test" in str(e.value) and "KD_SHARED" not in str(e.value)


def test_library_configs_refuse_what_the_cli_refuses(tmp_path):
    from kd.apps.demo.run import DemoConfig
    from kd.apps.eval.run import EvalConfig
    from kd.pipeline.teacher.finetune import TeacherFinetuneConfig
    from kd.student.embed import embed
    from kd.student.finetune import FinetuneConfig
    from kd.student.trainer import TrainConfig

    bad = [
        (lambda: TrainConfig("S", "O", checkpoint_every=0), "--checkpoint-every 0"),
        (lambda: TrainConfig("S", "O", embed_dim=0), "--embed-dim 0"),
        (lambda: TrainConfig("S", "O", out_dim=-1), "--out-dim -1"),
        (lambda: TrainConfig("S", "O", batch_size=10**12), "--batch-size"),
        (lambda: EvalConfig(max_pairs=-1), "--max-pairs -1"),
        (lambda: EvalConfig(agreement_rows=0), "--agreement-rows 0"),
        (lambda: EvalConfig(k=10**12), "--k"),
        (lambda: FinetuneConfig("S", "classification", ["t"], "O", hidden=0), "--hidden 0"),
        (lambda: FinetuneConfig("S", "classification", ["t"], "O", kd_alpha=1.5, kd_store="K"), "--kd-alpha"),
        (lambda: TeacherFinetuneConfig("minilm", "classification", ["t"], "O", max_length=4), "--max-length 4"),
        (lambda: DemoConfig(epochs=0), "--epochs 0"),
        (lambda: embed("S", str(tmp_path / "in.txt"), str(tmp_path / "o.parquet"), batch_size=0), "--batch-size 0"),
    ]
    for make, message in bad:
        with pytest.raises(KdError, match=message.replace("+", r"\+")):
            make()
    assert not (tmp_path / "o.parquet").exists()


def test_cuda_asked_on_a_machine_without_it_is_a_clear_error(tmp_path, monkeypatch):
    """Each command with --device: exit 2, "no CUDA device", no traceback and nothing written (finetune used
    to raise torch's AssertionError from deep inside the training loop)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    src = tmp_path / "in.txt"
    src.write_text("the market fell\n")
    out = tmp_path / "out"
    runs = [
        ["precompute", str(src), "-o", str(out), "--device", "cuda"],
        ["train-student", "-s", str(tmp_path / "S"), "-o", str(out), "--device", "cuda"],
        ["embed", str(src), "--student", str(tmp_path / "S"), "-o", str(out), "--device", "cuda:1"],
        ["finetune-teacher", "--base", "minilm", "--task", "classification", "--train", str(src), "-o", str(out),
         "--device", "cuda"],
        ["finetune", "--student", str(tmp_path / "S"), "--task", "classification", "--train", str(src),
         "-o", str(out), "--device", "cuda"],
    ]
    assert sorted(r[0] for r in runs) == sorted(DEVICE_COMMANDS)
    for args in runs:
        res = _run(*args)
        assert res.exit_code == 2 and "no CUDA device" in res.output, (args, res.output)
        assert isinstance(res.exception, SystemExit) and not out.exists(), args


# --- --init against explicit shape options -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def stage_one(tmp_path_factory) -> tuple[Path, Path]:
    """A store and a small BiLSTM student (embed 8, hidden 8, out 16) trained on it for two steps."""
    from kd.student.trainer import TrainConfig, train

    root = tmp_path_factory.mktemp("init")
    store = make_store(root / "store", rows=60, shards=1, tmp=root)
    return store, train(TrainConfig(str(store), str(root / "student"), embed_dim=8, hidden_dim=8, batch_size=8,
                                    max_steps=2, val_percent=10, progress=False))


@pytest.mark.parametrize("flag,value,theirs", [("--embed-dim", "16", "8"), ("--hidden-dim", "4", "8"),
                                               ("--out-dim", "32", "16"), ("--layers", "2", "1"),
                                               ("--pooling", "max", "mean")])
def test_init_refuses_a_shape_option_that_contradicts_it(stage_one, tmp_path, flag, value, theirs):
    store, student = stage_one
    out = tmp_path / "two"
    res = _run("train-student", "-s", str(store), "-o", str(out), "--init", str(student), flag, value,
               "--max-steps", "1", "--no-progress")
    assert res.exit_code == 2 and f"{flag} {value} contradicts the --init student" in res.output, res.output
    assert f"pass {flag} {theirs}" in " ".join(res.output.split()) and not out.exists()


def test_init_accepts_shape_options_that_agree(stage_one, tmp_path):
    from kd.student.setup import setup
    from kd.student.train_config import TrainConfig, arch_defaults

    store, student = stage_one
    s = setup(TrainConfig(str(store), str(tmp_path / "two"), init=str(student), embed_dim=8, hidden_dim=8,
                          out_dim=16, progress=False))
    assert (s.student_cfg.embed_dim, s.student_cfg.hidden_dim, s.student_cfg.out_dim) == (8, 8, 16)
    # a static run with --init keeps the source's width: no arch default contradicts it
    assert arch_defaults("static", {"embed_dim": None}, init=True) == {"embed_dim": None}


@pytest.mark.parametrize(("call", "kwargs", "flag"), [
    ("precompute", {"shard_rows": True}, "--shard-rows"),
    ("precompute", {"batch_tokens": 1.5}, "--batch-tokens"),
    ("train_student", {"epochs": "3"}, "--epochs"),
    ("train_student", {"lr": True}, "--lr"),
    ("train_student", {"progress": 1}, "--progress"),
    ("distill", {"sample": "0.5"}, "--sample"),
    ("distill", {"dedup": "no"}, "--dedup"),
])
def test_a_python_caller_giving_an_option_the_wrong_type_gets_kd_s_error(tmp_path, call, kwargs, flag):
    """The CLI's parser types every value; a Python caller is not held by it: `shard_rows=True` was taken as 1 and
    `epochs="3"` ended in a TypeError deep in the loop (issue 48's probe). Each is refused before any work."""
    import kd
    from kd.common.errors import InputError

    args = {"precompute": (["x.txt"], str(tmp_path / "o"), ["minilm"]), "distill": (["x.txt"], str(tmp_path / "o")),
            "train_student": (str(tmp_path), str(tmp_path / "o"))}[call]
    with pytest.raises(InputError) as e:
        getattr(kd, call)(*args, **kwargs)
    assert e.value.what.startswith(f"{flag} must be ") and repr(next(iter(kwargs.values()))) in e.value.what
    assert not (tmp_path / "o").exists()
