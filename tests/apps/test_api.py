"""The Python API (`kd.precompute`, `kd.train_student`) runs the same jobs as the CLI: same options, same
defaults per arch, same records; it returns the store and the trained student."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from typer.testing import CliRunner

import kd
from kd.cli import app
from kd.common.errors import KdError
from kd.storage.store import Store
from kd.student.saved import LoadedStudent


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sentences):
    path = tmp_path_factory.mktemp("api") / "news.txt"
    path.write_text("\n".join(sentences[:40]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def api_store(corpus, tiny_teacher) -> Store:
    return kd.precompute(corpus, corpus.parent / "store", teachers=[f"tiny={tiny_teacher}"], shard_rows=20,
                         progress=False)


def test_import_kd_stays_cheap():
    """`kd.precompute` is resolved on first use: importing kd loads neither torch nor the pipeline."""
    code = "import sys, kd; print('torch' in sys.modules, 'kd.pipeline' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_precompute_returns_the_store_the_cli_writes(api_store, corpus, tiny_teacher, tmp_path):
    assert isinstance(api_store, Store) and api_store.manifest.inputs["num_rows"] == 40
    cli_out = tmp_path / "cli-store"
    res = CliRunner().invoke(app, ["precompute", str(corpus), "-o", str(cli_out), "-t", f"tiny={tiny_teacher}",
                                   "--shard-rows", "20", "--no-progress"])
    assert res.exit_code == 0, res.output
    cli_store = Store.open(cli_out)
    a, b = api_store.read_table("teachers/tiny"), cli_store.read_table("teachers/tiny")
    assert a.column("id").to_pylist() == b.column("id").to_pylist()
    assert np.array_equal(np.stack(a.column("mean").to_numpy(zero_copy_only=False)),
                          np.stack(b.column("mean").to_numpy(zero_copy_only=False)))


@pytest.mark.parametrize("arch", ["static", "bilstm"])
def test_train_student_uses_the_cli_defaults_of_each_arch(api_store, tmp_path, arch):
    """The options left out get the arch's defaults in both doors (static: lr 5e-3, batch 256, no dropout; bilstm:
    lr 2e-3 and 64 tokens, as the demo trains it)."""
    small = dict(hidden_dim=8, max_steps=2, checkpoint_every=2)
    model = kd.train_student(api_store, tmp_path / "api", arch=arch, progress=False, **small)
    assert isinstance(model, LoadedStudent)
    vecs = model.encode(["the cat sat", "stock prices fell"])
    assert vecs.shape[0] == 2 and np.isfinite(vecs).all()
    res = CliRunner().invoke(app, ["train-student", "-s", api_store.root, "-o", str(tmp_path / "cli"), "--arch", arch,
                                   "--hidden-dim", "8", "--max-steps", "2", "--checkpoint-every", "2",
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    api_args = json.loads((tmp_path / "api" / "training_args.json").read_text())
    cli_args = json.loads((tmp_path / "cli" / "training_args.json").read_text())
    differ = {k for k in api_args if api_args[k] != cli_args.get(k)}
    assert differ == {"out"}, differ
    expect = {"static": (5e-3, 256, 0.0, 128), "bilstm": (2e-3, 64, 0.1, 64)}[arch]  # bilstm: the measured default
    assert (api_args["lr"], api_args["batch_size"], api_args["dropout"], api_args["max_length"]) == expect


def test_api_errors_are_kd_errors(api_store, tmp_path):
    with pytest.raises(KdError, match="--layers"):
        kd.train_student(api_store, tmp_path / "bad", num_layers=0)
    with pytest.raises(KdError):
        kd.precompute(tmp_path / "missing.txt", tmp_path / "s", teachers=["minilm"], progress=False)


@pytest.mark.parametrize(("call", "said"), [
    (lambda s, o: kd.precompute(5, o), "inputs must be a path"),
    (lambda s, o: kd.precompute(["a.txt"], 3.5), "out must be a path"),
    (lambda s, o: kd.precompute("a.txt", o, teachers=5), "teachers must be a teacher name or folder"),
    (lambda s, o: kd.precompute("a.txt", o, outputs=5), "--outputs must be None or a list, not 5"),
    (lambda s, o: kd.precompute("a.txt", o, bogus=1), "kd.precompute() has no option 'bogus'"),
    (lambda s, o: kd.train_student(s, None), "out must be a path"),
    (lambda s, o: kd.train_student(None, o), "store must be a path"),
    (lambda s, o: kd.train_student(s, o, arch=["bilstm"]), "--arch must be a string"),
    (lambda s, o: kd.train_student(s, o, epochs=10 ** 5000), "--epochs is a number of about 5000 digits"),
    (lambda s, o: kd.train_student(s, o, epoch=1), "no option 'epoch'; did you mean 'epochs'?"),
    (lambda s, o: kd.student.load(3.5), "path must be a path"),
    (lambda s, o: kd.student.load(o, device=5), "device must be a str or torch.device"),
    (lambda s, o: kd.distill(None, o), "inputs must be a path"),
    (lambda s, o: kd.distill(b"corpus.txt", o), "inputs must be a path"),
    (lambda s, o: kd.distill("a.txt", {}), "out must be a path"),
    (lambda s, o: kd.distill("a.txt", o, bogus=1), "kd.distill() has no option 'bogus'"),
])
def test_a_python_caller_s_wrong_argument_is_kd_s_error(api_store, tmp_path, call, said):
    """Issue 48's fresh probe: 76 calls of wrong types or unknown keywords ended in Python's TypeError (or
    ValueError for a 5,000-digit int) from deep inside; each is kd's error naming the argument, before any work."""
    with pytest.raises(KdError) as e:
        call(str(api_store), str(tmp_path / "out"))
    assert said in str(e.value) and e.value.exit_code == 2 and e.value.fix
    assert not (tmp_path / "out").exists()


def test_one_default_per_arch_in_every_door():
    """The CLI, the Python API, the demo and the bilstm recipe build the same BiLSTM (issue 40: the demo's was
    128/256/64 tokens while bare train-student built 300/512/128)."""
    from pathlib import Path

    from kd.apps.demo.config import DemoConfig
    from kd.apps.demo.run import _tier_config
    from kd.apps.distill.recipe import load
    from kd.student.train_config import TrainConfig

    plain = TrainConfig("S", "O", arch="bilstm")
    demo = _tier_config(DemoConfig(), "bilstm", Path("S"), Path("O"))
    stage = load("bilstm").stages[0]
    shape = ("hidden_dim", "max_length", "lr", "batch_size", "embed_dim", "pooling", "epochs")
    assert [getattr(demo, k) for k in shape] == [getattr(plain, k) for k in shape]
    assert (plain.hidden_dim, plain.max_length, plain.lr, plain.pooling) == (256, 64, 2e-3, "mean")
    assert not {"hidden_dim", "max_length", "lr", "pooling", "batch_size", "embed_dim"} & set(stage.options)


def test_subpackages_are_attributes_of_kd():
    """`import kd; kd.student.load(DIR)` raised AttributeError (the README's comment uses it; the probe's F_*)."""
    import subprocess
    import sys

    code = "import kd; print(kd.student.load.__module__, kd.dataset.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["kd.student.saved", "kd.dataset"], out
    with pytest.raises(AttributeError):
        kd.no_such_thing  # noqa: B018


def test_a_string_where_several_values_go_is_one_value(corpus, tiny_teacher, tmp_path):
    """The probe's API_P02/P05: `teachers="tiny=DIR"` was read per character ("unknown teacher 't'") and
    `outputs="cls,mean"`, the CLI's own form, gave "unknown output 'c'"."""
    from kd.apps.eval.config import EvalConfig
    from kd.student.train_config import TrainConfig

    store = kd.precompute(corpus, tmp_path / "s", teachers=f"tiny={tiny_teacher}", outputs="cls,mean",
                          shard_rows=20, progress=False)
    assert store.manifest.teachers() == ["tiny"]
    assert [c for c in store.table("teachers/tiny").columns if c in ("cls", "mean", "sentence")] == ["cls", "mean"]
    assert TrainConfig(str(tmp_path / "s"), str(tmp_path / "st"), objectives="cosine:2").objectives == ["cosine:2"]
    assert EvalConfig(students="runs/a", teacher="minilm").students == ["runs/a"]


@pytest.mark.parametrize("name,config,positional", [("distill", "kd.apps.distill.config:DistillConfig", 2),
                                                     ("train_student", "kd.student.train_config:TrainConfig", 2),
                                                     ("precompute", "kd.pipeline.job:PrecomputeJob", 3)])
def test_help_shows_every_keyword_with_its_type_and_default(name, config, positional):
    """Issue 52 item 6: `help(kd.distill)` lists the config's options (type, default, help), not `**options`."""
    import dataclasses
    import importlib
    import inspect
    import pydoc

    import kd

    module, cls = config.split(":")
    fields = [f for f in dataclasses.fields(getattr(importlib.import_module(module), cls)) if not f.name.isupper()]
    fn = getattr(kd, name)
    params = inspect.signature(fn).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    keywords = {n: p for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    named = set(list(params)[:positional])
    assert {f.name for f in fields} - named == set(keywords)
    for f in fields:
        if f.name in keywords and f.default is not dataclasses.MISSING:
            assert keywords[f.name].default == f.default and keywords[f.name].annotation == f.type
    text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
    assert "**options" not in text and all(f"{n} (" in text for n in keywords)
