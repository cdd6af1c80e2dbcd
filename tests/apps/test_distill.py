"""`kd distill`: recipes are checked before anything runs, a run killed between or inside stages resumes to
byte-identical weights, and `--dry-run` writes nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_bert
from typer.testing import CliRunner

from kd.apps.distill import recipe as R
from kd.apps.distill.run import LOCK, DistillConfig, _held, _Run, distill
from kd.apps.distill.shared_stages import untouched
from kd.cli import app
from kd.common.errors import InputError
from kd.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]


def write_recipe(path: Path, teacher: Path, stages: str, start: Path | None = None, outputs: str = "") -> Path:
    start_line = f'start = "{start}"\n' if start else ""
    outputs = outputs or ('[outputs]\nteacher = ["mean"]\nstart = ["init"]\nkeep_layers = "0,1"\n' if start
                          else '[outputs]\nteacher = ["mean"]\n')
    path.write_text(f'description = "test"\nteacher = "{teacher}"\n{start_line}target = "mean"\n\n'
                    f"{outputs}\n{stages}", encoding="utf-8")
    return path


# Two stages: a 2-layer student from the start model's layers, then a 1-layer copy of it with a relational term.
STAGES = """
[[stage]]
name = "two"
from = "start"
arch = "transformer-init"
init_layers = "0,1"
objectives = ["cosine"]
max_steps = {steps}
batch_size = 8
checkpoint_every = 5
val_percent = 10

[[stage]]
name = "one"
from = "two"
arch = "transformer-init"
init_layers = "1"
objectives = ["cosine", "relational:25:mode=kl"]
max_steps = {steps}
batch_size = 8
checkpoint_every = 5
val_percent = 10
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sentences) -> Path:
    path = tmp_path_factory.mktemp("distill") / "corpus.txt"
    path.write_text("\n".join(sentences[:160]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def recipe_file(tmp_path_factory, tiny_teacher) -> Path:
    return write_recipe(tmp_path_factory.mktemp("recipe") / "r.toml", tiny_teacher, STAGES.format(steps=30),
                        start=tiny_teacher)


def _refused(tmp_path: Path, teacher: Path, stages: str, match: str, **kw) -> None:
    path = write_recipe(tmp_path / "bad.toml", teacher, stages, **kw)
    with pytest.raises(InputError, match=match) as e:
        R.load(str(path))
    assert str(path) in str(e.value)  # the file is named
    res = CliRunner().invoke(app, ["distill", "x.txt", "-o", str(tmp_path / "o"), "--recipe", str(path)])
    assert res.exit_code == 2 and match.split("(")[0][:20] in " ".join(res.output.split()), res.output
    assert not (tmp_path / "o").exists()


def test_recipe_errors_are_clear_and_cost_nothing(tmp_path, tiny_teacher):
    one = STAGES.format(steps=3).split("[[stage]]")[1]
    _refused(tmp_path, tiny_teacher, "[[stage]]" + one.replace('"cosine"]', '"cosinus"]'),
             "unknown objective 'cosinus'", start=tiny_teacher)
    _refused(tmp_path, tiny_teacher, "[[stage]]" + one.replace('from = "start"', 'from = "later"'),
             "neither a role nor an earlier stage", start=tiny_teacher)
    # the stage needs the start model's init output, which the recipe does not store
    _refused(tmp_path, tiny_teacher, "[[stage]]" + one, "needs the start's init output", start=tiny_teacher,
             outputs='[outputs]\nteacher = ["mean"]\nstart = ["vocab"]\n')
    # a stage that would continue a student of another tokenizer: a static student (teacher's vocabulary)
    # handed on to a Transformer that reads the start model's
    static = '[[stage]]\nname = "s"\nfrom = "teacher"\narch = "static"\n'
    _refused(tmp_path, tiny_teacher, static + "[[stage]]" + one.replace('from = "start"', 'from = "s"'),
             "another tokenizer", start=tiny_teacher)
    _refused(tmp_path, tiny_teacher, "[[stage]]" + one.replace("max_steps", "max_stepz"),
             "unknown stage option 'max_stepz'", start=tiny_teacher)
    _refused(tmp_path, tiny_teacher, "[[stage]]" + one.replace("batch_size = 8", "batch_size = 0"), "--batch-size",
             start=tiny_teacher)


@pytest.mark.parametrize("recipe", ["nope.toml", "folder", "bad.toml"])
def test_kd_distill_refuses_a_bad_recipe_before_transformers_loads(tmp_path, monkeypatch, recipe):
    """The seventh probe: a missing, folder or broken recipe was refused after "loading torch and transformers"
    (~15 s on a loaded core); reading a recipe needs neither."""
    import kd.cli as cli

    (tmp_path / "folder").mkdir()
    (tmp_path / "bad.toml").write_text("teacher = [", encoding="utf-8")
    monkeypatch.setattr(cli, "_starting", lambda *a: pytest.fail("transformers loaded before the recipe was read"))
    r = CliRunner().invoke(app, ["distill", str(tmp_path / "c.txt"), "-o", str(tmp_path / "run"), "--recipe",
                                 str(tmp_path / recipe), "--dry-run"])
    assert r.exit_code == 2 and str(tmp_path / recipe) in r.output and "fix:" in r.output, r.output
    assert not (tmp_path / "run").exists()


def test_a_stage_option_train_student_refuses_is_named_in_the_recipe(tmp_path, tiny_teacher, corpus):
    """An option only training can refuse (a least-squares head where the BiLSTM's 32-wide output is the 32-wide
    teacher's, so there is no head): named at the recipe's stage and key, not as the train-student flag the
    recipe's user never wrote."""
    stages = ('[[stage]]\nname = "s"\nfrom = "teacher"\narch = "bilstm"\nhidden_dim = 16\nmax_steps = 2\n'
              'head_init = "lstsq"\n')
    recipe = write_recipe(tmp_path / "r.toml", tiny_teacher, stages)
    res = CliRunner().invoke(app, ["distill", *_args(corpus, tmp_path / "out", recipe), "--no-leakage"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and f"where: {recipe} [[stage]] s: head_init (train-student's --head-init)" in text, \
        res.output


@pytest.mark.parametrize("case", ["keep_layers", "init_layers", "later_init_layers", "start_folder", "static_width"])
def test_a_recipe_s_layers_and_models_are_checked_before_any_model_loads(case, tmp_path, tiny_teacher, corpus,
                                                                         monkeypatch):
    """The layers a recipe names exist in its 2-layer start model and its model folders exist: found before any
    model loads, in a dry run and a run alike (issue 48's probe: after the models' load and timing, up to 2 min,
    naming a temporary folder); a refused run leaves no --out behind."""
    from kd.pipeline.backends import loading

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the recipe was checked")

    monkeypatch.setattr(loading, "load_teacher", no_load)
    stages, start, outputs = STAGES.format(steps=3), tiny_teacher, ""
    where, said = {
        "keep_layers": ("[outputs] keep_layers", "layers are numbered 0..1 (the model has 2 layers)"),
        "init_layers": ("[[stage]] two: init_layers", "init layers 0,7, which the run does not store"),
        "later_init_layers": ("[[stage]] one: init_layers", "layers are numbered 0..1"),
        "start_folder": ("(start), or --start", "the start model: unknown teacher"),
        "static_width": ("[[stage]] s: embed_dim", "embed_dim 64, wider than the teacher's vocab output (32)"),
    }[case]
    if case == "keep_layers":
        outputs = '[outputs]\nteacher = ["mean"]\nstart = ["init"]\nkeep_layers = "0,9"\n'
    elif case == "init_layers":
        stages = stages.replace('init_layers = "0,1"', 'init_layers = "0,7"')
    elif case == "later_init_layers":
        stages = stages.replace('init_layers = "1"', 'init_layers = "5"')
    elif case == "static_width":  # the static table is the PCA of the teacher's 32-wide vocab output
        stages = '[[stage]]\nname = "s"\nfrom = "teacher"\narch = "static"\nembed_dim = 64\n' + stages
        outputs = '[outputs]\nteacher = ["mean", "vocab"]\nstart = ["init"]\nkeep_layers = "0,1"\n'
    else:
        start = tmp_path / "no-such-model"
    recipe = write_recipe(tmp_path / "r.toml", tiny_teacher, stages, start=start, outputs=outputs)
    for dry in (["--dry-run"], []):
        res = CliRunner().invoke(app, ["distill", *_args(corpus, tmp_path / "out", recipe), *dry])
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and said in text and where in text, res.output
        assert not (tmp_path / "out").exists()


def test_presets_load():
    assert {"tiny6", "tiny3", "static", "bilstm"} <= set(R.PRESETS)
    tiny3 = R.load("tiny3")
    epochs = sum(s.options.get("epochs", 0) for s in tiny3.stages)
    assert [s.source for s in tiny3.stages] == ["start", "cosine", "relational"] and epochs <= 3
    tiny6 = R.load("tiny6")
    assert sum(s.options.get("epochs", 0) for s in tiny6.stages) <= 2
    # tiny6's stages, setting for setting: tiny3 beside tiny6 on one store copies them (apps.distill.shared_stages)
    assert [(s.name, s.source, s.options) for s in tiny3.stages[:2]] == \
        [(s.name, s.source, s.options) for s in tiny6.stages]
    # the same pair on the two-teacher target: tiny3-ensemble copies tiny6-ensemble's stages, and its copy is tiny3's
    e3, e6 = R.load("tiny3-ensemble"), R.load("tiny6-ensemble")
    assert e3.teachers == e6.teachers == ("mpnet", "minilm") and (e3.start, e3.target) == (e6.start, e6.target)
    assert [(s.name, s.source, s.options) for s in e3.stages] == \
        [(s.name, s.source, s.options) for s in [*e6.stages, tiny3.stages[2]]]


def test_seed_offsets_every_stage_s_seed_and_makes_another_run(tmp_path, corpus, recipe_file, uninterrupted):
    """--seed N adds N to each stage's seed (runs that differ only in it measure the spread), wraps within numpy's
    range, and is part of what a run is: a finished run's folder refuses another seed."""
    from kd.apps.distill.run import _Run

    recipe = R.load(str(recipe_file))
    stages = [s for s in recipe.students if s.name != R.BASELINE]
    runs = {n: _Run(_cfg(corpus, tmp_path / str(n), recipe_file, seed=n), recipe) for n in (0, 20, 2**32 - 1)}
    seeds = {n: [run.train_config(s).seed for s in stages] for n, run in runs.items()}
    assert seeds[0] == [s.options.get("seed", 0) for s in stages]
    assert seeds[20] == [s + 20 for s in seeds[0]] and seeds[2**32 - 1] == [(s - 1) % 2**32 for s in seeds[0]]
    with pytest.raises(InputError, match="seed was 0, now 20"):
        distill(_cfg(corpus, uninterrupted, recipe_file, seed=20))


NOT_ITS = r"the export did not write \(or that changed since\), e.g."  # kd distill's refusal of a user's file


def _cfg(corpus: Path, out: Path, recipe: Path, **kw) -> DistillConfig:
    return DistillConfig([str(corpus)], str(out), recipe=str(recipe), **({"evaluate": False, "export": False,
                                                                        "progress": False} | kw))


def _weights(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.glob("stages/*/model.safetensors"))}


def _args(corpus: Path, out: Path, recipe: Path) -> list[str]:
    return [str(corpus), "-o", str(out), "--recipe", str(recipe), "--no-evaluate", "--no-export", "--no-progress"]


def _kd(args: list[str]) -> subprocess.Popen:
    """`kd distill` in a process of its own: every run compared here has the same threads and environment."""
    env = os.environ | {"PYTHONPATH": str(ROOT.parent)}
    return subprocess.Popen([sys.executable, "-m", "kd", "distill", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus, recipe_file) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    proc = _kd(_args(corpus, out, recipe_file))
    assert proc.wait() == 0, proc.stderr.read().decode()
    choice = json.loads((out / "choice.json").read_text())  # the final shape only: "two" is a means to "one"
    assert choice["candidates"] == ["baseline", "one"] and set(choice["sts_dev"]) == {"baseline", "one", "two"}
    assert choice["chosen"] == max(choice["candidates"], key=lambda n: choice["sts_dev"][n])
    state = json.loads((out / "distill.json").read_text())
    assert state["done"][-1] == "choose on STS-B dev" and (out / "exclude.txt").is_file()
    return out


def test_a_second_run_is_a_no_op_and_other_options_are_refused(uninterrupted, corpus, recipe_file):
    before = _weights(uninterrupted)
    distill(_cfg(corpus, uninterrupted, recipe_file))
    assert _weights(uninterrupted) == before
    with pytest.raises(InputError, match="sample was None, now 0.5"):
        distill(_cfg(corpus, uninterrupted, recipe_file, sample=0.5))


def test_a_second_process_on_the_same_out_is_refused_until_the_first_ends(uninterrupted, corpus, recipe_file):
    """Two runs on one OUT would interleave their writes of distill.json: the second is refused, the first's files
    untouched; the lock dies with its holder (kill -9 here), so the next run goes on."""
    state = (uninterrupted / "distill.json").read_bytes()
    holder = subprocess.Popen(  # a kd distill at work in this OUT, as far as its lock says
        [sys.executable, "-c", "import time\nfrom kd.common.locks import try_lock\n"
         f"f = try_lock({str(uninterrupted / LOCK)!r})\nprint('held' if f else 'not held', flush=True)\n"
         "time.sleep(60)"], stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT.parent)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match="another kd distill is writing --out"):
            distill(_cfg(corpus, uninterrupted, recipe_file))
        res = CliRunner().invoke(app, ["distill", *_args(corpus, Path(f"{uninterrupted}/"), recipe_file)])
        assert res.exit_code == 2 and "another kd distill" in res.output, res.output  # the same OUT, spelt otherwise
        res = CliRunner().invoke(app, ["distill", *_args(corpus, uninterrupted, recipe_file), "--dry-run"])
        said = " ".join(res.output.split())  # a dry run writes nothing: it plans, saying what it cannot know
        assert res.exit_code == 0 and "note: another kd distill is running in --out now" in said, said
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert (uninterrupted / "distill.json").read_bytes() == state
    distill(_cfg(corpus, uninterrupted, recipe_file))  # done already: a no-op once the holder is gone


def test_a_lock_path_holding_no_file_is_refused_with_a_message(uninterrupted, corpus, recipe_file):
    """Something a user put where kd keeps its lock (a FIFO here) is no lock: the run is refused naming it (it was a
    traceback from opening a FIFO to append), the dry run plans as usual, and with it moved away the run goes on."""
    lock = uninterrupted / LOCK
    lock.unlink(missing_ok=True)
    os.mkfifo(lock)
    try:
        res = CliRunner().invoke(app, ["distill", *_args(corpus, uninterrupted, recipe_file)])
        assert res.exit_code == 2 and "lock file is a FIFO" in res.output and str(lock) in res.output, res.output
        res = CliRunner().invoke(app, ["distill", *_args(corpus, uninterrupted, recipe_file), "--dry-run"])
        assert res.exit_code == 0 and "another kd distill" not in res.output, res.output
        assert stat.S_ISFIFO(lock.stat().st_mode)  # left as the user put it
    finally:
        lock.unlink()
    distill(_cfg(corpus, uninterrupted, recipe_file))


def test_a_refused_run_creates_nothing_and_a_writable_out_needs_no_writable_parent(tmp_path, corpus, recipe_file):
    """The checks come before the lock: a refused run leaves no folder behind; the lock is inside OUT, so an OUT
    one may write inside a folder one may not is a run like any other (and -o / is refused, not a traceback)."""
    out = tmp_path / "new" / "deeper" / "run"
    with pytest.raises(InputError, match="not found|no file"):
        distill(_cfg(tmp_path / "nosuch.txt", out, recipe_file))
    assert not (tmp_path / "new").exists()
    res = CliRunner().invoke(app, ["distill", *_args(corpus, Path("/"), recipe_file)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    parent = tmp_path / "readonly"
    (parent / "run").mkdir(parents=True)
    parent.chmod(0o555)
    try:  # (root writes there anyway: where the lock lies is what this checks)
        with _held(_Run(_cfg(corpus, parent / "run", recipe_file), R.load(str(recipe_file)))):
            assert (parent / "run" / LOCK).is_file() and sorted(p.name for p in parent.iterdir()) == ["run"]
    finally:
        parent.chmod(0o755)


def test_a_run_is_the_same_run_however_its_paths_are_spelt(uninterrupted, corpus, recipe_file, monkeypatch):
    """out1, out1/, /abs/out1 or a path from another folder name one run: resuming it with a trailing slash (a
    shell's completion) was refused as "out was 'run', now 'run/'"."""
    before = _weights(uninterrupted)
    monkeypatch.chdir(uninterrupted.parent)
    distill(_cfg(os.path.relpath(corpus), f"{uninterrupted.name}/", os.path.relpath(recipe_file)))
    assert _weights(uninterrupted) == before
    link = uninterrupted.parent / "link"
    link.symlink_to(uninterrupted)
    distill(_cfg(corpus, link, recipe_file))
    done = distill(_cfg(corpus, f"file://{uninterrupted}", recipe_file))  # claim_output's spelling too (review)
    assert done.out == uninterrupted and not (uninterrupted.parent / "file:").exists()
    assert _weights(uninterrupted) == before


def _run_until(args: list[str], done: callable, timeout: float = 120.0) -> None:
    """Start `kd distill` and kill -9 it once `done()` holds."""
    proc = _kd(args)
    t0 = time.monotonic()
    while not done() and proc.poll() is None and time.monotonic() - t0 < timeout:
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("where", ["between stages", "inside a stage"])
def test_killed_run_resumes_to_identical_weights(tmp_path, uninterrupted, corpus, recipe_file, where):
    out = tmp_path / "run"
    args = _args(corpus, out, recipe_file)
    if where == "between stages":
        def done() -> bool:
            p = out / "distill.json"
            return p.is_file() and "train stage two" in json.loads(p.read_text() or "{}").get("done", [])
    else:
        def done() -> bool:
            return (out / "stages" / "one" / "checkpoint.pt").exists()
    _run_until(args, done)
    assert not (out / "choice.json").exists(), "the run finished before it was killed: nothing was tested"
    proc = _kd(args)
    assert proc.wait() == 0, proc.stderr.read().decode()
    assert _weights(out) == _weights(uninterrupted) and len(_weights(out)) == 3  # baseline, one, two
    assert json.loads((out / "choice.json").read_text()) == json.loads((uninterrupted / "choice.json").read_text())


def test_dry_run_writes_nothing_and_estimates_each_step(tmp_path, corpus, recipe_file, monkeypatch):
    out, temp = tmp_path / "planned", tmp_path / "temp"
    temp.mkdir()  # its own temp folder: another kd's dry run beside this test makes and removes its own in /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(out), "--recipe", str(recipe_file),
                                   "--dry-run", "--no-evaluate"])
    assert res.exit_code == 0, res.output
    assert not out.exists() and not list(temp.iterdir())  # its calibration folder gone with it
    text = " ".join(res.output.split())
    for step in ("precompute the teacher", "precompute the start model", "train stage two", "train stage one",
                 "choose on STS-B dev", "export"):
        assert step in text, text
    assert "another kd distill is running" not in text, text


def test_the_dry_run_plans_exactly_the_steps_the_run_records(uninterrupted, corpus, recipe_file, tmp_path):
    """The plan and the run walk one list of steps (apps.distill.run.steps_of): the dry run of the finished run's
    options plans the steps its distill.json records as done, by the same names, in the same order."""
    from kd.apps.distill.plan import estimate

    plan = estimate(_cfg(corpus, tmp_path / "planned", recipe_file))
    assert [s.name for s in plan.steps] == json.loads((uninterrupted / "distill.json").read_text())["done"]
    assert all(s.seconds > 0 for s in plan.steps if s.name != "leave out evaluation text"), plan


def test_a_dry_run_plans_what_is_left_and_is_refused_as_the_run_is(uninterrupted, corpus, recipe_file, tmp_path):
    """The dry run of a finished run planned (and timed) every step again, and planned a run its run refuses; a run
    folder moved or copied was refused with a fix naming no way out ("run with the same options": they write to the
    old place). Now the dry run shows the steps distill.json records as done and is refused as the run is; a moved
    run's refusal names where it was made and the store a new run can start from, and that fix works."""
    from kd.apps.distill.plan import estimate

    done = json.loads((uninterrupted / "distill.json").read_text())["done"]
    plan = estimate(_cfg(corpus, uninterrupted, recipe_file))
    assert [(s.name, s.seconds, s.detail) for s in plan.steps] == [(name, 0.0, "done") for name in done]
    with pytest.raises(InputError, match="seed was 0, now 3"):
        estimate(_cfg(corpus, uninterrupted, recipe_file, seed=3))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="holds files that are not a kd distill run"):  # (it planned: a probe)
        estimate(_cfg(corpus, tmp_path / "mine", recipe_file))
    moved = tmp_path / "moved"
    shutil.copytree(uninterrupted, moved)
    for run in (estimate, distill):
        with pytest.raises(InputError, match=f"made in {uninterrupted}: the folder was moved or copied") as e:
            run(_cfg(corpus, moved, recipe_file))
        assert f"move it back to {uninterrupted}" in e.value.fix and f"--store {moved / 'store'}" in e.value.fix
    distill(_cfg(corpus, tmp_path / "new", recipe_file, store=str(moved / "store")))
    rows = json.loads((tmp_path / "new" / "distill.json").read_text())["rows"]
    assert {step: r["encoded"] for step, r in rows.items()} == {"precompute the teacher": 0,
                                                                "precompute the start model": 0}


def test_a_step_whose_work_is_gone_is_done_again_with_the_steps_after_it(uninterrupted, corpus, recipe_file, tmp_path):
    """A stage folder deleted to train it again: the run said "chose stage one" with stages/one gone, and the dry run
    showed every step done. The first step whose work is gone is done again, with every step after it."""
    from kd.apps.distill.plan import estimate

    out = tmp_path / "run"
    distill(_cfg(corpus, out, recipe_file, store=str(uninterrupted / "store")))  # (its stages: copied, not trained)
    shutil.rmtree(out / "stages" / "one")
    (out / "choice.json").unlink()
    planned = estimate(_cfg(corpus, out, recipe_file, store=str(uninterrupted / "store"))).steps
    plan = {s.name: s.detail for s in planned}
    assert [n for n, d in plan.items() if d != "done"] == ["train stage one", "choose on STS-B dev"], plan
    result = distill(_cfg(corpus, out, recipe_file, store=str(uninterrupted / "store")))
    assert result.chosen == json.loads((uninterrupted / "choice.json").read_text())["chosen"]
    assert (out / "stages" / "one" / "model.safetensors").read_bytes() == \
        (uninterrupted / "stages" / "one" / "model.safetensors").read_bytes()
    # a stage's weights deleted: its folder stuck every rerun ("no model.safetensors", recorded done); the stage
    # after it, which starts from it, was kept as if trained from the new one. Both are trained again from nothing.
    (out / "stages" / "two" / "model.safetensors").unlink()
    (out / "stages" / "one" / "left-by-the-old-stage").write_text("x")
    result = distill(_cfg(corpus, out, recipe_file, store=str(uninterrupted / "store")))
    assert not (out / "stages" / "one" / "left-by-the-old-stage").exists()
    for name in ("two", "one"):
        assert (out / "stages" / name / "model.safetensors").read_bytes() == \
            (uninterrupted / "stages" / name / "model.safetensors").read_bytes()
    assert json.loads((out / "distill.json").read_text())["done"] == \
        json.loads((uninterrupted / "distill.json").read_text())["done"]
    # an export that lost a file telling it one (modules.json, kd_onnx.json) was refused, "pass a new --out" (the whole
    # run again), then "delete it", though distill.json records every file the export wrote: it is exported again.
    # With a file the export did not write, it is still refused: kd deletes no folder it cannot tell it wrote
    store = str(uninterrupted / "store")
    distill(_cfg(corpus, out, recipe_file, store=store, export=True))
    exported = (out / "model" / "model.safetensors").read_bytes()
    (out / "model" / "modules.json").unlink()
    (out / "onnx" / "kd_onnx.json").unlink()
    state = (out / "distill.json").read_bytes()
    for mine in ("notes.txt", ".notes"):  # (a dotfile was taken for kd's own, and deleted with the folder: a probe)
        (out / "model" / mine).write_text("mine")
        for call in (distill, estimate):  # (the dry run planned "export 4 s": a probe)
            with pytest.raises(InputError, match=f"holds 1 file\\(s\\) {NOT_ITS} {mine}") as e:
                call(_cfg(corpus, out, recipe_file, store=store, export=True))
            assert e.value.where == str(out / "model")
            assert e.value.fix.startswith(f"move your files out of {out / 'model'}, and restore or delete an export")
        assert (out / "model" / mine).read_text() == "mine" and (out / "distill.json").read_bytes() == state
        (out / "model" / mine).unlink()
    plan = {s.name: s.detail for s in estimate(_cfg(corpus, out, recipe_file, store=store, export=True)).steps}
    assert [n for n, d in plan.items() if d != "done"] == ["export"], plan
    distill(_cfg(corpus, out, recipe_file, store=store, export=True))
    assert (out / "model" / "modules.json").is_file() and (out / "onnx" / "kd_onnx.json").is_file()
    assert (out / "model" / "model.safetensors").read_bytes() == exported
    # any other file the export wrote, gone (its weights, the ONNX tokenizer, onnx/README.md) or replaced by a folder,
    # was not noticed
    for gone in ("model/model.safetensors", "onnx/tokenizer.json", "onnx/README.md"):
        (out / gone).unlink()
    (out / "onnx" / "tokenizer.json").mkdir()
    plan = {s.name: s.detail for s in estimate(_cfg(corpus, out, recipe_file, store=store, export=True)).steps}
    assert [n for n, d in plan.items() if d != "done"] == ["export"], plan
    distill(_cfg(corpus, out, recipe_file, store=store, export=True))
    assert (out / "model" / "model.safetensors").read_bytes() == exported
    assert (out / "onnx" / "tokenizer.json").is_file() and (out / "onnx" / "README.md").is_file()
    # out/model replaced by a file: the run said "--out is an existing file" (naming out/model), the dry run planned;
    # by a dangling link: the export was written through it, outside --out
    shutil.rmtree(out / "model")
    (out / "model").write_text("x")
    for call in (distill, estimate):
        with pytest.raises(InputError, match="model is a file where the export goes") as e:
            call(_cfg(corpus, out, recipe_file, store=store, export=True))
        assert e.value.where == str(out / "model")
    (out / "model").unlink()
    (out / "model").symlink_to(tmp_path / "elsewhere")
    for call in (distill, estimate):
        with pytest.raises(InputError, match="model is a symbolic link") as e:
            call(_cfg(corpus, out, recipe_file, store=store, export=True))
        assert e.value.where == str(out / "model")
    assert not (tmp_path / "elsewhere").exists()
    (out / "model").unlink()
    distill(_cfg(corpus, out, recipe_file, store=store, export=True))
    # a link to a whole export, with the export recorded done: the evaluation wrote its card through it (a probe)
    shutil.move(out / "model", tmp_path / "elsewhere")
    (out / "model").symlink_to(tmp_path / "elsewhere")
    for call in (distill, estimate):
        with pytest.raises(InputError, match="model is a symbolic link"):
            call(_cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True))
    (out / "model").unlink()
    shutil.move(tmp_path / "elsewhere", out / "model")
    # an export folder that still tells one, with a file the export did not write: refused inside the export step,
    # after the run recorded it undone, naming an --overwrite kd distill lacks; the dry run planned it
    (out / "model" / "model.safetensors").unlink()
    (out / "model" / "extra.txt").write_text("mine")
    state = (out / "distill.json").read_bytes()
    for call in (distill, estimate):
        with pytest.raises(InputError, match=f"holds 1 file\\(s\\) {NOT_ITS} extra.txt"):
            call(_cfg(corpus, out, recipe_file, store=store, export=True))
    assert (out / "distill.json").read_bytes() == state
    (out / "model" / "extra.txt").unlink()
    # a stage that lost its config.json or a tokenizer file (what loads it): trained again, with the steps after it;
    # the dry run, for the chosen stage, exported the damaged stage and was refused ("no trained student here").
    # A file edited, not deleted, stopped every rerun with the load's checksum refusal, "retrain it", which kd distill
    # has no spelling for (a probe): the same
    chosen = json.loads((out / "choice.json").read_text())["chosen"]
    edits = {f"stages/{chosen}/config.json": Path.unlink, "stages/two/tokenizer/tokenizer.json": Path.unlink,
             f"stages/{chosen}/tokenizer/tokenizer.json": lambda p: p.write_text(p.read_text() + " "),
             "stages/two/model.safetensors": lambda p: p.write_bytes(p.read_bytes()[:-1] + b"!"),
             # (its config.json edited, same weights: the stage stayed, and the export was made from it: a probe)
             "stages/two/config.json": lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "edited": 1}))}
    for gone, edit in edits.items():
        edit(out / gone)
        stage = gone.split("/")[1]
        plan = {s.name: s.detail for s in estimate(_cfg(corpus, out, recipe_file, store=store, export=True)).steps}
        names = list(plan)
        assert [n for n, d in plan.items() if d != "done"] == names[names.index(f"train stage {stage}"):], plan
        distill(_cfg(corpus, out, recipe_file, store=store, export=True))
        for name in ("two", "one"):
            assert (out / "stages" / name / "model.safetensors").read_bytes() == \
                (uninterrupted / "stages" / name / "model.safetensors").read_bytes()
        assert (out / gone).read_bytes() == (uninterrupted / gone).read_bytes()
        assert (out / "model" / "model.safetensors").read_bytes() == exported
    # choice.json is the choose step's work: damaged (it was "a file is not valid JSON" naming a line of it, not the
    # file; nested past the parser's recursion, or not UTF-8, a traceback) or edited to name another stage (the run
    # said it chose that stage, exit 0, its export another's: a probe), the choice is made again, and what follows
    made = (out / "choice.json").read_bytes()
    edited = json.dumps(json.loads(made) | {"chosen": "two"}).encode()
    for damaged in (b'{"x', b"[" * 100_000, b'{"chosen": "\xff"}', edited):
        (out / "choice.json").write_bytes(damaged)
        plan = {s.name: s.detail for s in estimate(_cfg(corpus, out, recipe_file, store=store, export=True)).steps}
        assert [n for n, d in plan.items() if d != "done"] == ["choose on STS-B dev", "export"], plan
        distill(_cfg(corpus, out, recipe_file, store=store, export=True))
        assert (out / "choice.json").read_bytes() == made
        assert (out / "model" / "model.safetensors").read_bytes() == exported
    # a run recorded before choice.json's sha256 was: a damaged one is refused naming it, the fix redoes the step
    state = json.loads((out / "distill.json").read_text())
    del state["files"]["choose on STS-B dev"]
    (out / "distill.json").write_text(json.dumps(state))
    record = json.loads(made)
    nan = json.dumps(record | {"sts_dev": dict.fromkeys(record["sts_dev"], float("nan"))}).encode()
    for damaged in (b'{"x', edited.replace(b'"two"', b'"nine"'), edited, nan):  # (each was taken: probes)
        (out / "choice.json").write_bytes(damaged)
        for call in (distill, estimate):
            with pytest.raises(InputError, match="choice.json is not the choice kd distill writes") as e:
                call(_cfg(corpus, out, recipe_file, store=store))
            assert e.value.where == str(out / "choice.json") and "the rerun chooses the stage again" in e.value.fix
    (out / "choice.json").unlink()
    assert distill(_cfg(corpus, out, recipe_file, store=store)).chosen == \
        json.loads((uninterrupted / "choice.json").read_text())["chosen"]


def test_an_empty_out_or_store_is_refused(tmp_path, corpus, recipe_file, monkeypatch):
    """`-o ""` was the working folder (a whole run written into it); `--store ""` was recorded as it."""
    monkeypatch.chdir(tmp_path)
    for args in (["--out", ""], ["-o", "x", "--store", " "], ["-o", "x", "--reuse", ""], ["-o", "x", "--teacher", ""],
                 ["-o", "x", "--start", " "]):
        res = CliRunner().invoke(app, ["distill", str(corpus), "--recipe", str(recipe_file), *args])
        assert res.exit_code == 2 and f"{args[-2]} is empty" in res.output, res.output
    for teacher in (",", f"{corpus},"):  # (an empty entry of the list was an AttributeError)
        res = CliRunner().invoke(app, ["distill", str(corpus), "--recipe", str(recipe_file), "-o", "x", "-t", teacher])
        assert res.exit_code == 2 and "has an empty entry" in " ".join(res.output.split()), res.output
    # `--recipe ""` ran the default recipe (a real teacher, minutes); an empty corpus path was "not found" unnamed
    for args in (["distill", str(corpus), "-o", "x", "--recipe", ""], ["distill", "", "-o", "x", "--recipe", "r"]):
        res = CliRunner().invoke(app, args)
        said = " ".join(res.output.split())
        assert res.exit_code == 2 and ("--recipe is empty" in said or "INPUTS is empty" in said), said
    assert list(tmp_path.iterdir()) == []


def test_a_rerun_deletes_and_writes_through_nothing_that_is_not_its_own(uninterrupted, corpus, recipe_file, tmp_path):
    """What a sixth probe found kd distill deleting or writing that was not its own, each refused now before any work,
    by the run and its dry run alike, with everything left as it was: a link inside --out written through (the card
    and report.md overwrote a user's file outside it; a stage folder as a link was a traceback); a run record naming
    a stage "../../x" (that folder, outside --out, was deleted) or a file outside --out; in an export folder that lost
    the file telling it one, a card or README.md the user edited, another kd command's output, or a user's file named
    like kd's record of one (each deleted with the folder)."""
    from kd.apps.distill.plan import estimate
    from kd.common.outputs import write_text

    store = str(uninterrupted / "store")
    out, saved, mine = tmp_path / "run", tmp_path / "saved", tmp_path / "mine.txt"
    distill(_cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True))
    shutil.copytree(out, saved)  # (a run continues only in the folder it was made in: each case starts from a copy)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")

    def record(edit):
        state = json.loads((out / "distill.json").read_text())
        edit(state)
        (out / "distill.json").write_text(json.dumps(state))

    cases = {
        "report.md is a symbolic link": lambda: ((out / "report.md").unlink(), (out / "report.md").symlink_to(mine)),
        "model/README.md is a symbolic link": lambda: ((out / "model" / "README.md").unlink(),
                                                       (out / "model" / "README.md").symlink_to(mine)),
        "stages/two is a symbolic link": lambda: (shutil.move(out / "stages" / "two", tmp_path / "two"),
                                                  (out / "stages" / "two").symlink_to(tmp_path / "two"),
                                                  (out / "stages" / "one" / "config.json").unlink()),
        "distill.json is not the record": lambda: record(lambda d: d["stages"].update({"../../victim": {}})),
        "distill.json is not the record ": lambda: record(lambda d: d["files"]["export"].update(
            {"../victim/keep.txt": "0" * 64})),
        f"{NOT_ITS} README.md": lambda: (out / "model" / "README.md").write_text("my card"),
        f"{NOT_ITS} README.md ": lambda: (out / "onnx" / "README.md").write_text("my notes"),
        f"{NOT_ITS} vecs.txt": lambda: write_text(out / "model" / "vecs.txt", "vectors", "kd embed"),
        f"{NOT_ITS} .modules.json.kd.json": lambda: (out / "model" / ".modules.json.kd.json").write_text("mine"),
        f"{NOT_ITS} .kd-tmp-notes.txt": lambda: (out / "model" / ".kd-tmp-notes.txt").write_text("mine"),
    }
    lock_link = tmp_path / "fresh" / ".kd-distill.lock"  # a new --out holding a link where the lock goes (a probe)
    lock_link.parent.mkdir()
    lock_link.symlink_to(tmp_path / "made-outside")
    for call in (distill, estimate):
        with pytest.raises(InputError, match=r"\.kd-distill\.lock is a symbolic link"):
            call(_cfg(corpus, lock_link.parent, recipe_file, store=store))
    assert not (tmp_path / "made-outside").exists()
    for refusal, change in cases.items():
        shutil.rmtree(out)
        shutil.copytree(saved, out)
        mine.write_text("mine")
        if NOT_ITS in refusal:  # (the export folder lost the file telling it one: the rerun exports it again)
            (out / "model" / "modules.json").unlink()
        change()
        before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and not p.is_symlink()}
        for call in (distill, estimate):
            with pytest.raises(InputError, match=refusal.strip()):
                call(_cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True))
        after = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and not p.is_symlink()}
        assert after == before, refusal
        if (tmp_path / "two").exists():
            shutil.rmtree(tmp_path / "two")


def test_the_run_record_is_never_written_through_a_link(tmp_path):
    """A link made at distill.json's temp name while a run went on: the record was written onto the link's target,
    outside --out, and the link moved onto distill.json (a probe)."""
    from kd.apps.distill.run import _write_json

    theirs = tmp_path / "theirs.txt"
    theirs.write_text("mine")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".distill.json.tmp").symlink_to(theirs)
    _write_json(tmp_path / "out" / "distill.json", {"done": []})
    assert theirs.read_text() == "mine" and not (tmp_path / "out" / "distill.json").is_symlink()
    assert json.loads((tmp_path / "out" / "distill.json").read_text()) == {"done": []}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["distill.json"]


def test_another_runs_record_gives_only_its_own_finished_stages(uninterrupted, tmp_path):
    """Another run's distill.json is read to copy the stages it shares: a stage named "../../x" there, or its stages/
    as a link, had a folder outside the run copied as this run's stage, exit 0; one of its stages whose tokenizer or
    config.json was edited since was copied as trained (probes)."""
    from kd.apps.distill.shared_stages import finished_stage

    owner = tmp_path / "a" / "b" / "run"
    shutil.copytree(uninterrupted, owner)
    state = json.loads((owner / "distill.json").read_text())
    key = state["stages"]["one"]["key"]
    assert finished_stage(owner, state, key) == owner / "stages" / "one"
    shutil.copytree(owner / "stages" / "one", tmp_path / "x")
    forged = state | {"stages": {"../../../../x": {"key": key}}, "done": [*state["done"], "train stage ../../../../x"]}
    assert (owner / "stages" / "../../../../x").resolve() == tmp_path / "x"
    assert finished_stage(owner, forged, key) is None
    config = owner / "stages" / "one" / "config.json"  # its weights as trained, its config not (a probe)
    kept = config.read_text()
    config.write_text(json.dumps({**json.loads(kept), "edited": 1}))
    assert finished_stage(owner, state, key) is None
    # ... and so it was under a record of its files left out, emptied, or another stage's (a probe)
    files = state["files"]
    for record in ({k: v for k, v in files.items() if k != "train stage one"}, files | {"train stage one": {}},
                   files | {"train stage one": files["train stage two"]}):
        assert finished_stage(owner, state | {"files": record}, key) is None
    assert finished_stage(owner, {k: v for k, v in state.items() if k != "files"}, key) is None
    config.write_text(kept)
    # a record of another shape holds no stage (a list there was a traceback in every run beside it: a probe)
    for odd in ([1, 2], state | {"files": ["train stage one"]}, state | {"files": {"train stage one": 7}}):
        assert finished_stage(owner, odd, key) is None
    assert finished_stage(owner, state, key) == owner / "stages" / "one"
    shutil.move(owner / "stages", tmp_path / "stages")  # stages/ a link: a folder outside the run was copied (probe)
    (owner / "stages").symlink_to(tmp_path / "stages")
    assert finished_stage(owner, state, key) is None
    (owner / "stages").unlink()
    shutil.move(tmp_path / "stages", owner / "stages")
    tok = owner / "stages" / "one" / "tokenizer" / "tokenizer.json"
    tok.write_text(tok.read_text() + " ")
    assert finished_stage(owner, state, key) is None


def test_a_step_undone_is_undone_on_disk_before_it_is_redone(uninterrupted, corpus, recipe_file, tmp_path,
                                                            monkeypatch):
    """A step whose work is gone was undone in memory only: killed while the export was done again (model/ written,
    onnx/ not yet), the next run found model/modules.json, skipped the export and the evaluation, and left kd export's
    card as the model's, exit 0 (a probe)."""
    from kd.apps.distill import run as distill_run

    out, store = tmp_path / "run", str(uninterrupted / "store")
    distill(_cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True))
    card = (out / "model" / "README.md").read_bytes()
    shutil.rmtree(out / "model")
    real = distill_run.export_student

    def killed_before_onnx(src, fmt, folder, **kw):
        if fmt == "onnx":
            raise KeyboardInterrupt  # (as a kill there: the state is not written after it)
        return real(src, fmt, folder, **kw)

    monkeypatch.setattr(distill_run, "export_student", killed_before_onnx)
    with pytest.raises(KeyboardInterrupt):
        distill(_cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True))
    monkeypatch.undo()
    assert "export" not in json.loads((out / "distill.json").read_text())["done"]
    distill(_cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True))
    assert (out / "model" / "README.md").read_bytes() == card
    (out / "report.md").unlink()  # its step is redone: every rerun stopped reading it (a probe)
    distill(_cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True))
    assert (out / "report.md").is_file() and (out / "model" / "README.md").read_bytes() == card
    (out / "model" / "README.md").unlink()  # the card: the export is whole without it, the evaluation writes it
    distill(_cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True))
    assert (out / "model" / "README.md").read_bytes() == card
    for gone in ("README.md", "model.safetensors"):  # (the card's sidecar, left behind, is kd's: not a user's file)
        (out / "model" / gone).unlink()
    distill(_cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True))
    assert (out / "model" / "README.md").read_bytes() == card and (out / "model" / "model.safetensors").is_file()
    # a report edited into other JSON was kept as the run's report, one not JSON "done" in the dry run (a probe)
    from kd.apps.distill.plan import estimate
    from kd.common.outputs import is_kd_file

    cfg = _cfg(corpus, out, recipe_file, store=store, export=True, evaluate=True)
    for name, damaged in (("report.json", b"[1, 2]"), ("report.json", b"[" * 100_000), ("report.md", b"\xff")):
        (out / name).write_bytes(damaged)
        for call in (distill, estimate):
            with pytest.raises(InputError, match=f"{name} is not the report kd distill wrote") as e:
                call(cfg)
            assert e.value.fix == f"delete {out / name}: the rerun evaluates the chosen student again"
        assert (out / name).read_bytes() == damaged
        (out / name).unlink()
        assert distill(cfg).report["level"] == "sts" and is_kd_file(out / name)
    # ... and so it is when an earlier step is to be done again (it was written over: a probe)
    (out / "report.md").write_text((out / "report.md").read_text() + "my note\n")
    (out / "choice.json").unlink()
    for call in (distill, estimate):
        with pytest.raises(InputError, match="report.md is not the report kd distill wrote"):
            call(cfg)
    assert (out / "report.md").read_text().endswith("my note\n")
    (out / "report.md").unlink()
    distill(cfg)
    # a folder where a record goes (or its sidecar, or the lock): the dry run planned, the run failed naming a temp
    # file; distill.json a folder was "not a kd distill run" (probes)
    for name in ("choice.json", "report.md", ".report.md.kd.json", ".kd-distill.lock", "distill.json"):
        kept = (out / name).read_bytes() if (out / name).is_file() else None
        (out / name).unlink(missing_ok=True)
        (out / name).mkdir()
        (out / name / "mine.txt").write_text("mine")
        # distill.json is the run's record: "the rerun writes it again" was false (the rerun, the folder moved
        # away, was refused as "not a kd distill run": a probe)
        said = "keeps its run's record: without the record" if name == "distill.json" else "writes that file"
        for call in (distill, estimate):
            with pytest.raises(InputError, match=f"{name} is a folder, where kd distill {said}") as e:
                call(cfg)
        assert (out / name / "mine.txt").read_text() == "mine"
        assert name != "distill.json" or e.value.fix.startswith("put the run's distill.json back in its place (move")
        shutil.rmtree(out / name)
        if kept is not None:
            (out / name).write_bytes(kept)
    distill(cfg)
    (tmp_path / "elsewhere").mkdir()  # a link to a folder there: named as the link it is (it was "is a folder")
    for name in ("distill.json", ".report.md.kd.json"):
        kept = (out / name).read_bytes()
        (out / name).unlink()
        (out / name).symlink_to(tmp_path / "elsewhere")
        for call in (distill, estimate):
            with pytest.raises(InputError, match=re.escape(name) + r" is a link to a folder \(") as e:
                call(cfg)
            assert e.value.fix.startswith(f"remove the link {out / name}" if name != "distill.json" else
                                          f"put the run's distill.json back in its place (remove the link {out / name}")
        (out / name).unlink()
        (out / name).write_bytes(kept)
    side = out / ".report.md.kd.json"  # a link to a file there: its copy would be replaced by kd's record (a probe)
    kept = side.read_bytes()
    side.unlink()
    (tmp_path / "elsewhere" / "side.json").write_bytes(kept)
    side.symlink_to(tmp_path / "elsewhere" / "side.json")
    with pytest.raises(InputError, match="is a symbolic link") as e:
        estimate(cfg)
    assert e.value.fix == f"remove the link {side} (the rerun writes the file or folder again)"
    side.unlink()
    side.write_bytes(kept)
    # distill.json a link to a file or to nothing: "remove the link" then "not a kd distill run", or that refusal
    # alone, naming no link (a probe)
    kept = (out / "distill.json").read_bytes()
    (tmp_path / "record.json").write_bytes(kept)
    for target, said in ((tmp_path / "record.json", f"a symbolic link to {tmp_path / 'record.json'}"),
                         (tmp_path / "gone.json", f"a symbolic link to nothing ({tmp_path / 'gone.json'})")):
        (out / "distill.json").unlink()
        (out / "distill.json").symlink_to(target)
        for call in (distill, estimate):
            with pytest.raises(InputError, match=re.escape(f"distill.json is {said}, where kd distill keeps")) as e:
                call(cfg)
            assert e.value.fix.startswith("put the run's distill.json in place of the link")
    (out / "distill.json").unlink()
    (out / "distill.json").write_bytes(kept)
    fresh = tmp_path / "fresh"  # a new --out holding only a folder at distill.json: moved away, the run starts there
    (fresh / "distill.json").mkdir(parents=True)
    with pytest.raises(InputError, match="distill.json is a folder, where kd distill writes that file"):
        estimate(replace(cfg, out=str(fresh)))
    (fresh / "distill.json").rmdir()
    estimate(replace(cfg, out=str(fresh)))


def test_a_teacher_whose_weights_or_config_changed_since_its_pass_is_refused(uninterrupted, corpus, recipe_file,
                                                                             tiny_teacher, tmp_path):
    """A teacher folder rewritten in place after its pass: a rerun computed what it computes from the new weights
    (with two teachers, their weights' choice) and trained every stage on the old ones' vectors, exit 0 (a probe)."""
    from kd.apps.distill.plan import estimate

    teacher, out = tmp_path / "t", tmp_path / "run"
    shutil.copytree(tiny_teacher, teacher)
    cfg = _cfg(corpus, out, recipe_file, teacher=f"tt={teacher}", reuse=str(uninterrupted / "store"))
    distill(cfg)
    (out / "choice.json").unlink()
    other = build_tiny_bert(tmp_path / "other", seed=5)
    shutil.copy(other / "model.safetensors", teacher / "model.safetensors")
    for call in (distill, estimate):
        with pytest.raises(InputError, match=r"the teacher model's weights \(tt\) changed since its vectors") as e:
            call(cfg)
        assert e.value.where == str(teacher)
    assert not (out / "choice.json").exists()
    shutil.copy(tiny_teacher / "model.safetensors", teacher / "model.safetensors")
    config = (teacher / "config.json").read_text()  # the same weights computing another function
    (teacher / "config.json").write_text(config.replace('"gelu"', '"relu"'))
    for call in (distill, estimate):
        with pytest.raises(InputError, match=r"the teacher model's config.json settings \(tt\) changed since") as e:
            call(cfg)
        assert e.value.where == str(teacher) and e.value.fix.startswith("restore its config.json settings")
    (teacher / "config.json").write_text(config)
    assert distill(cfg).chosen == json.loads((uninterrupted / "choice.json").read_text())["chosen"]


def test_a_corpus_edited_since_its_store_was_made_is_refused(uninterrupted, corpus, recipe_file, tmp_path):
    """A run records its corpus by its paths: edited after the teacher's pass, a rerun (and its dry run) read the old
    store and said "distilled", exit 0 (a probe). Refused now, naming the change; restored, the run is the same."""
    from kd.apps.distill.plan import estimate

    mine, out = tmp_path / "corpus.txt", tmp_path / "run"
    shutil.copy(corpus, mine)
    reuse = str(uninterrupted / "store")  # (its vectors copied: no teacher pass)
    distill(_cfg(mine, out, recipe_file, reuse=reuse))
    state = (out / "distill.json").read_bytes()
    with mine.open("a", encoding="utf-8") as f:
        f.write("A brand new sentence about the harbour at night.\n")
    for call in (distill, estimate):
        with pytest.raises(InputError, match="the corpus changed since this run's store was made: ") as e:
            call(_cfg(mine, out, recipe_file, reuse=reuse))
        assert e.value.where == str(out) and f"--reuse {out / 'store'}" in e.value.fix
    assert (out / "distill.json").read_bytes() == state
    shutil.copy(corpus, mine)
    assert distill(_cfg(mine, out, recipe_file, reuse=reuse)).chosen


def test_a_run_s_teacher_and_recipe_are_the_files_they_name(uninterrupted, corpus, recipe_file, tiny_teacher, tmp_path,
                                                             monkeypatch):
    """--teacher was recorded as typed and compared as text: the same folder spelt otherwise was "another run", a
    relative name meaning another folder from elsewhere was the same run; `recipe=Path(...)` or `teacher=Path(...)`
    from Python was a traceback, `--recipe file:///...` "not found"; a damaged distill.json a traceback."""
    store = str(uninterrupted / "store")
    out = tmp_path / "run"
    distill(_cfg(corpus, out, recipe_file, teacher=str(tiny_teacher), store=store))
    state = (out / "distill.json").read_bytes()
    assert json.loads(state)["identity"]["teacher"] == f"teacher={tiny_teacher.resolve()}"
    other = build_tiny_bert(tmp_path / "elsewhere" / tiny_teacher.name, seed=9)
    monkeypatch.chdir(tiny_teacher.parent)
    for teacher, recipe in ((tiny_teacher, recipe_file), (f"{tiny_teacher}/", recipe_file.as_uri()),
                            (tiny_teacher.as_uri(), str(recipe_file)), (tiny_teacher.name, recipe_file)):
        distill(DistillConfig([str(corpus)], out, recipe=recipe, teacher=teacher, store=store, evaluate=False,
                              export=False, progress=False))
        assert (out / "distill.json").read_bytes() == state, teacher
    monkeypatch.chdir(other.parent)  # the same name here is another folder: another run
    with pytest.raises(InputError, match=f"teacher was 'teacher={tiny_teacher.resolve()}', now 'teacher={other}'"):
        distill(_cfg(corpus, out, recipe_file, teacher=tiny_teacher.name, store=store))
    link, linked = tmp_path / "corpus-link.txt", tmp_path / "linked"  # a corpus symlink pointed at another file
    link.symlink_to(corpus)
    distill(_cfg(link, linked, recipe_file, teacher=str(tiny_teacher), store=store))
    link.unlink()
    link.symlink_to(shutil.copy(corpus, tmp_path / "copy.txt"))
    with pytest.raises(InputError, match="inputs was") as e:  # (the fix said "run with the same options": a probe)
        distill(_cfg(link, linked, recipe_file, teacher=str(tiny_teacher), store=store))
    assert e.value.fix.startswith("pass the corpus files the run read"), e.value.fix
    record = json.loads(state)
    for damaged in ("[1, 2]", '{"identity": 5}', '{"identity": {}, "done": 7}', "{", '{"identity": {}, "done": []}',
                    json.dumps(record | {"stages": 5}), json.dumps(record | {"files": {"export": 5}}),
                    "[" * 100_000):  # (past the parser's recursion: a traceback)
        (out / "distill.json").write_text(damaged)
        with pytest.raises(InputError, match="is not the record kd distill writes") as e:
            distill(_cfg(corpus, out, recipe_file, teacher=str(tiny_teacher), store=store))
        assert e.value.where == str(out / "distill.json") and "--store" in e.value.fix
    (out / "distill.json").write_text(json.dumps(record | {"identity": record["identity"] | {"store": "file://h/x"}}))
    with pytest.raises(InputError, match="records a path kd cannot read") as e:  # (the fix said --overwrite)
        distill(_cfg(corpus, out, recipe_file, teacher=str(tiny_teacher), store=store))
    assert e.value.fix == "pass a new --out"
    # an older kd's record: its paths and teachers as typed where the run began (here: tmp_path, `-o run -t t`)
    (tmp_path / "t").symlink_to(tiny_teacher)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t").symlink_to(other)
    older = record["identity"] | {"out": "run", "teacher": "t"}
    (out / "distill.json").write_text(json.dumps(record | {"identity": older}))
    monkeypatch.chdir(tmp_path / "sub")  # `t` here is another teacher: it was the same run (a probe)
    with pytest.raises(InputError, match="teacher was"):
        distill(_cfg(corpus, Path("../run"), recipe_file, teacher="t", store=store))
    distill(_cfg(corpus, Path("../run"), recipe_file, teacher=str(tiny_teacher), store=store))
    (out / "distill.json").write_bytes(state)


def test_the_dry_run_times_training_steps_after_their_warm_up():
    """A stage's rate is the last WINDOW calibration steps' (metrics records hold the mean rows/s since the start):
    the first steps' one-off costs stay out of it. The mean since the start (what the plan took before) made
    tiny6's 100k dry run say 21 rows/s, 76.8 min for its cosine stage; the stage ran at 44 rows/s in 36 min."""
    from kd.apps.distill.plan import CALIBRATION_STEPS, WINDOW, steady_rate

    seconds = [3.0] * 5 + [0.25] * (CALIBRATION_STEPS - 5)  # warm-up, then a 64-row step every 0.25 s
    records, elapsed = [], 0.0
    for step, s in enumerate(seconds, start=1):
        elapsed += s
        if step % WINDOW == 0:
            records.append({"step": step, "rows": 64 * step, "rows_per_s": 64 * step / elapsed, "loss": 0.5})
    records.append({"step": CALIBRATION_STEPS, "val_loss": 0.4})  # a validation record carries no rate
    assert steady_rate(records) == pytest.approx(64 / 0.25)
    assert steady_rate(records[:1]) == pytest.approx(64 * 5 / 15.0)  # one record: all there is


def test_the_python_dry_run_prints_as_its_plan(tmp_path, corpus, recipe_file):
    """The replayed probe: `print(kd.distill(..., dry_run=True).table())` showed `<rich.table.Table object>`; the
    plan itself now prints as the CLI's table, and nothing is written."""
    import kd

    plan = kd.distill(corpus, tmp_path / "planned", recipe=str(recipe_file), evaluate=False, dry_run=True)
    text = str(plan)
    assert "precompute the teacher" in text and "total" in text and "object at" not in text
    assert not (tmp_path / "planned").exists()


def test_a_whole_run_exports_a_served_student_with_its_card_and_suite(tmp_path, corpus, tiny_teacher, monkeypatch):
    """Export and evaluation included: the sentence-transformers folder encodes like the chosen student, its
    card carries the suite table, and the report has a row per model with every suite column. Then the dry run's
    suite estimate knows the teacher's and the start model's vectors are cached, and only then."""
    stages = STAGES.format(steps=10).split("[[stage]]")[1]
    start = build_tiny_bert(tmp_path / "start", seed=3)  # another model of the same tokenizer
    recipe = write_recipe(tmp_path / "r.toml", tiny_teacher, "[[stage]]" + stages, start=start)
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(tmp_path / "run"), "--recipe", str(recipe),
                                   "--no-progress", "--suite"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "run"
    report = json.loads((out / "report.json").read_text())
    names = [m["name"] for m in report["models"]]
    chosen = json.loads((out / "choice.json").read_text())["chosen"]
    # the chosen student, the start model, the baseline (unless it is the chosen one), the teacher
    assert len(names) == (3 if chosen == "baseline" else 4) and names[1].endswith("(start)"), names
    assert any(n.startswith("baseline") for n in names), names
    keys = {c["key"] for c in report["columns"]}
    assert {"sts_spearman", "lee_pearson", "retrieval_recall", "probe_accuracy", "documents_f1"} <= keys, keys
    card = (out / "model" / "README.md").read_text()
    assert "| two | start |" in card and "| baseline | start |" in card and f"Chosen: **{chosen}**" in card
    assert "$" not in card.split("## Training")[0]
    from sentence_transformers import SentenceTransformer

    from kd.student.saved import load

    texts = ["the market fell", "a dog runs in the park"]
    served = SentenceTransformer(str(out / "model"), device="cpu").encode(texts)
    mine = load(out / "stages" / chosen).encode(texts)
    assert abs(served - mine).max() < 1e-4
    assert (out / "onnx").is_dir()
    # a re-export (a resumed run whose choice changed) replaces kd's own card, which is no user file
    from kd.student.exporters import export_student

    export_student(out / "stages" / "two", "sentence-transformers", out / "model", overwrite=True)
    _suite_estimate_reads_the_cache(tmp_path, corpus, recipe, monkeypatch)


def _suite_estimate_reads_the_cache(tmp_path: Path, corpus: Path, recipe: Path, monkeypatch) -> None:
    """After a run, the suite's text lists (`suite_text_sets`, the ones the dry run looks up) are exactly the ones
    kd eval cached for both reference models: the estimate is the student's encoding alone, neither model
    loaded. With an empty cache both are loaded and timed."""
    from kd.apps.distill import plan as distill_plan
    from kd.apps.distill.run import _Run
    from kd.apps.eval.suite_tasks import suite_text_sets

    cfg = DistillConfig([str(corpus)], str(tmp_path / "again"), recipe=str(recipe), progress=False)
    cal, n, timed = _Run(cfg, cfg.plan()), sum(map(len, suite_text_sets())), []

    def reference_rate(_cal, role):
        timed.append(role)
        return 2.0, 50.0

    monkeypatch.setattr(distill_plan, "_reference_rate", reference_rate)
    warm = distill_plan._evaluate(cal, 100.0, "evaluate the suite")
    assert timed == [] and warm.seconds == pytest.approx(n / 100.0), warm
    assert warm.detail.endswith(f"teacher ({n:,} cached), start ({n:,} cached)"), warm.detail
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "empty-cache"))
    cold = distill_plan._evaluate(cal, 100.0, "evaluate the suite")
    assert timed == ["teacher", "start"] and cold.seconds == pytest.approx(n / 100.0 + 2 * (2.0 + n / 50.0))


def test_a_missing_corpus_records_no_run(tmp_path, corpus, recipe_file):
    """The corrected command must not be refused as 'another run': nothing is recorded before the inputs pass."""
    out = tmp_path / "run"
    with pytest.raises(InputError, match="not found|no file"):
        distill(_cfg(tmp_path / "nosuch.txt", out, recipe_file))
    assert not (out / "distill.json").exists()


def _store_files(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*"))
            if p.is_file() and "locks" not in p.parts}


def test_a_run_on_another_runs_store_computes_nothing_and_copies_the_stages_it_shares(
        tmp_path, uninterrupted, corpus, tiny_teacher, monkeypatch):
    """--store: a second recipe on the same corpus pays no teacher pass (the expensive part) and copies the stages
    the store's run finished with the same settings, training only those that differ; the result is the run the
    recipe gives on a store of its own, byte for byte."""
    from kd.apps.distill import plan as distill_plan

    second = STAGES.format(steps=30).replace('"relational:25:mode=kl"]', '"relational:25:mode=kl"]\nseed = 7')
    recipe = write_recipe(tmp_path / "second.toml", tiny_teacher, second, start=tiny_teacher)  # "two" the same
    store = uninterrupted / "store"
    before = _store_files(store)
    out = tmp_path / "second"
    # a calibration sample smaller than the corpus, as on any real corpus: it once went into --store (refused there
    # as another corpus; when the sample was the whole corpus, silently precomputed into it)
    monkeypatch.setattr(distill_plan, "SAMPLE_ROWS", 64)
    # on a loaded machine (as CI's), where the plan's calibration measures at 1 thread: it once left the process
    # at 1, and keyed the stages at 1 thread, unlike the 2-thread run that trained them: nothing was found to copy
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    threads = torch.get_num_threads()
    res = CliRunner().invoke(app, ["distill", *_args(corpus, out, recipe), "--store", str(store), "--dry-run"])
    assert torch.get_num_threads() == threads
    plan = " ".join(res.output.split())
    assert res.exit_code == 0 and plan.count("already in the store") == 2, plan  # only their load is estimated
    assert plan.count("copied from") == 2 and f"{uninterrupted.name}/stages/two" in plan, plan  # and the baseline
    assert _store_files(store) == before and not out.exists()
    proc = _kd(_args(corpus, out, recipe) + ["--store", str(store)])
    assert proc.wait() == 0, proc.stderr.read().decode()
    assert _store_files(store) == before and not (out / "store").exists()
    stages = json.loads((out / "distill.json").read_text())["stages"]
    assert stages["two"]["copied_from"] == str(uninterrupted / "stages" / "two") and "copied_from" not in stages["one"]
    assert _weights(out)["stages/two/model.safetensors"] == _weights(uninterrupted)["stages/two/model.safetensors"]
    assert _weights(out)["stages/one/model.safetensors"] != _weights(uninterrupted)["stages/one/model.safetensors"]
    res = CliRunner().invoke(app, ["distill", *_args(corpus, tmp_path / "third", recipe), "--store", str(store),
                                   "--dry-run"])  # a run beside `second` on the same store: nothing left to train
    plan = " ".join(res.output.split())
    assert f"{uninterrupted.name}/stages/two" in plan and "second/stages/one" in plan, plan
    alone = tmp_path / "alone"  # the same recipe, its own store: every stage trained
    proc = _kd(_args(corpus, alone, recipe))
    assert proc.wait() == 0, proc.stderr.read().decode()
    assert "stages" in json.loads((alone / "distill.json").read_text()) and _weights(alone) == _weights(out)
    with pytest.raises(InputError, match="store was"):  # the same OUT on its own store is another run
        distill(_cfg(corpus, out, recipe))
    # a link beside --out is no run beside it (one to a run elsewhere had its stages recorded as copied from the
    # link: a probe); the run it names is no longer beside `third`, so its stage "one" is to train
    (tmp_path / "far").mkdir()
    shutil.move(out, tmp_path / "far" / "second")
    (tmp_path / "lnk").symlink_to(tmp_path / "far" / "second")
    res = CliRunner().invoke(app, ["distill", *_args(corpus, tmp_path / "third", recipe), "--store", str(store),
                                   "--dry-run"])
    plan = " ".join(res.output.split())
    assert res.exit_code == 0 and plan.count("copied from") == 2 and "lnk/stages" not in plan, plan


def test_a_store_link_to_a_missing_store_is_refused_as_that(uninterrupted, corpus, recipe_file, tmp_path):
    """out/store may be a link (to where the store was moved); one to a folder gone was refused as a link kd distill
    does not allow, and its rerun, or a store made there, a traceback (a probe)."""
    from kd.apps.distill.plan import estimate

    out = tmp_path / "run"
    distill(_cfg(corpus, out, recipe_file, reuse=str(uninterrupted / "store")))  # its own store, every row copied
    shutil.move(out / "store", tmp_path / "moved")
    (out / "store").symlink_to(tmp_path / "gone")
    state = (out / "distill.json").read_bytes()
    for call in (distill, estimate):
        with pytest.raises(InputError, match="store is a symbolic link to .*gone, which is missing") as e:
            call(_cfg(corpus, out, recipe_file))
        assert "point the link at the run's store" in e.value.fix
    assert not (tmp_path / "gone").exists() and (out / "distill.json").read_bytes() == state
    (out / "store").unlink()  # a chain of links names its end; a link to a file is no store either (a probe)
    (tmp_path / "hop").symlink_to(tmp_path / "gone")
    (tmp_path / "file").write_text("not a store")
    (tmp_path / "la").symlink_to(tmp_path / "lb")  # a loop of links
    (tmp_path / "lb").symlink_to(tmp_path / "la")
    for target, said in ((tmp_path / "hop", f"{tmp_path / 'gone'}, which is missing"),
                         (tmp_path / "file", f"{tmp_path / 'file'}, which is not a folder"),
                         (tmp_path / "la", "which is a link in a loop of links")):
        (out / "store").unlink(missing_ok=True)
        (out / "store").symlink_to(target)
        for call in (distill, estimate):
            with pytest.raises(InputError, match=f"store is a symbolic link to .*{re.escape(said)}"):
                call(_cfg(corpus, out, recipe_file))
    # to a folder of other files (or such a folder in its place): refused before the run's record is touched (its
    # precompute refused it after every step was recorded undone: a probe)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    (out / "store").unlink()
    (out / "store").symlink_to(tmp_path / "mine")
    for call in (distill, estimate):
        with pytest.raises(InputError, match=r"store \(a symbolic link to .*mine\) holds files but no kd store") as e:
            call(_cfg(corpus, out, recipe_file))
        assert "point the link at the run's store" in e.value.fix
    (out / "store").unlink()
    shutil.move(tmp_path / "mine", out / "store")
    for call in (distill, estimate):
        with pytest.raises(InputError, match="^store holds files but no kd store") as e:
            call(_cfg(corpus, out, recipe_file))
        assert e.value.fix.startswith(f"move {out / 'store'} away")  # (it said "choose a new --out": a probe)
    assert (out / "distill.json").read_bytes() == state and (out / "store" / "notes.txt").read_text() == "keep"
    shutil.rmtree(out / "store")
    (out / "store").symlink_to(tmp_path / "moved")  # where it was moved: the run is whole
    assert {s.detail for s in estimate(_cfg(corpus, out, recipe_file)).steps} == {"done"}


def test_a_stage_killed_before_its_first_checkpoint_may_still_be_copied(tmp_path):
    """A kill during a stage's head fit leaves its lock and first metrics (a seed run met it): the stage has nothing
    to resume, so another run's finished stage with its key is copied in (it was trained again, for hours); a stage
    with a checkpoint or a student is never replaced."""
    stage = tmp_path / "stages" / "cosine"
    assert untouched(stage)
    stage.mkdir(parents=True)
    (stage / ".kd-train.lock").write_text("")
    (stage / "metrics.jsonl").write_text('{"step": 0, "head_fit": {"rows": 8192}}\n')
    assert untouched(stage)
    for kept in ("checkpoint.pt", "model.safetensors", "notes.txt"):
        (stage / kept).write_bytes(b"x")
        assert not untouched(stage), kept
        (stage / kept).unlink()


def test_a_stage_key_holds_what_the_weights_depend_on(monkeypatch):
    """Options that change the weights, the start, the tables read and the code change the key; where the stage is
    written and how the run reports do not."""
    from kd.apps.distill import shared_stages as S
    from kd.student.train_config import TrainConfig

    base = TrainConfig("s", "o", arch="transformer-init", objectives=["cosine"]).to_json()
    reads = {"store": "/s", "mpnet": {"table": {"shards": {"0": {"sha256": "a"}}}, "files": {}}}
    key = S.stage_key(base, None, reads)
    assert S.stage_key(base | {"out": "elsewhere", "progress": False}, None, reads) == key
    for changed in (base | {"lr": 3e-5}, base | {"seed": 1}, base | {"objectives": ["cosine", "relational:25"]}):
        assert S.stage_key(changed, None, reads) != key
    assert S.stage_key(base, "a-stage-key", reads) != key
    assert S.stage_key(base, None, reads | {"mpnet": {"table": {"shards": {"0": {"sha256": "b"}}}}}) != key
    monkeypatch.setattr(S, "code_digest", lambda: "other code")
    assert S.stage_key(base, None, reads) != key


@pytest.mark.parametrize("where", ["inside --out", "a folder of other files", "a student", "another corpus's"])
def test_a_wrong_store_is_refused_before_anything_is_recorded(tmp_path, uninterrupted, corpus, recipe_file, where):
    """Refused before distill.json is written: the corrected command then starts, not 'other settings'."""
    out = tmp_path / "run"
    store = {"inside --out": out / "stages", "a folder of other files": tmp_path / "mine",
             "a student": uninterrupted / "stages" / "one", "another corpus's": uninterrupted / "store"}[where]
    if where == "a folder of other files":
        store.mkdir()
        (store / "notes.txt").write_text("mine", encoding="utf-8")
    if where == "another corpus's":
        corpus = tmp_path / "other.txt"
        corpus.write_text("A different corpus.\nWith two sentences.\n", encoding="utf-8")
    for dry in ([], ["--dry-run"]):
        res = CliRunner().invoke(app, ["distill", *_args(corpus, out, recipe_file), "--store", str(store), *dry])
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and "--store" in text, res.output
        if where == "another corpus's":
            assert "another corpus" in text and "other.txt is not one of the store's inputs" in text, text
        assert not out.exists()


AS_GIVEN = {"teacher": None, "start": None}  # --teacher and --start not given: the recipe's (_Run.given_teachers)


def test_a_run_is_the_same_run_when_only_its_recipe_s_words_change(tmp_path, tiny_teacher, recipe_file):
    """A run's identity holds what its recipe makes it do, not the file's bytes: a newer kd that rewords a preset's
    comments or description or adds [measured] sizes (as the corpus-size runs did to tiny6.toml, leaving a
    40-minute teacher pass that would not resume) still resumes it; a changed stage option is another run. A run
    recorded before the digest (its `recipe_sha256`, the file's bytes) resumes while the file is unchanged."""
    import hashlib

    path = tmp_path / "r.toml"
    path.write_text(recipe_file.read_text(encoding="utf-8"), encoding="utf-8")
    cfg = DistillConfig(inputs=["corpus.txt"], out=str(tmp_path / "run"), recipe=str(path))
    state = tmp_path / "run" / "distill.json"
    before = cfg.identity(R.load(str(path)), AS_GIVEN)
    old_format = {k: v for k, v in before.items() if k != "recipe_digest"} | {
        "recipe_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert cfg.difference(old_format, R.load(str(path)), AS_GIVEN, state) is None
    text = path.read_text(encoding="utf-8").replace('description = "test"', '# reworded\ndescription = "other"')
    path.write_text(text + "\n[measured]\nrows = [1000]\nbeat_baseline = [false]\n", encoding="utf-8")
    assert cfg.difference(before, R.load(str(path)), AS_GIVEN, state) is None
    # the bytes changed: nothing to compare but them
    key, was, now = cfg.difference(old_format, R.load(str(path)), AS_GIVEN, state)
    assert key == "recipe_sha256" and was == old_format["recipe_sha256"] and now != was
    path.write_text(text.replace("max_steps = 30", "max_steps = 31", 1), encoding="utf-8")
    key, was, now = cfg.difference(before, R.load(str(path)), AS_GIVEN, state)
    assert key == "recipe_digest" and was == before["recipe_digest"] and now != was


def test_a_run_begun_before_an_option_existed_resumes_at_its_default(tmp_path, recipe_file):
    """A kd that adds an option (as --seed was added) still resumes the runs an older kd began, which ran as the
    option's default does; a value other than the default is another run."""
    recipe = R.load(str(recipe_file))
    cfg = DistillConfig(inputs=["corpus.txt"], out=str(tmp_path / "run"), recipe=str(recipe_file))
    older = {k: v for k, v in cfg.identity(recipe, AS_GIVEN).items() if k != "seed"}
    state = tmp_path / "run" / "distill.json"
    assert cfg.difference(older, recipe, AS_GIVEN, state) is None
    assert DistillConfig(inputs=["corpus.txt"], out=str(tmp_path / "run"), recipe=str(recipe_file),
                         seed=5).difference(older, recipe, AS_GIVEN, state) == ("seed", 0, 5)


def _teacher_rows(store: Path) -> dict[str, dict[int, bytes]]:
    """Each teacher table's rows: id -> the row's stored values, as bytes."""
    s = Store.open(store)
    out = {}
    for name in (t for t in s.manifest.tables if t.startswith("teachers/")):
        t = s.read_table(name)
        cols = [c for c in t.column_names if c != "id"]
        out[name] = {i: repr([t[c][k].as_py() for c in cols]).encode() for k, i in enumerate(t["id"].to_pylist())}
    return out


def test_a_grown_corpus_with_reuse_encodes_only_its_new_rows(tmp_path, uninterrupted, corpus, recipe_file, sentences):
    """--reuse: a grown corpus (the first run's sentences and more) copies the teacher's and the start model's rows
    that the first run's store holds, bit for bit, and encodes only the new ones; the dry run counts them so; a rerun
    without --reuse is the same run (a copied row is the row it saves computing)."""
    from kd.apps.distill.plan import estimate

    grown = tmp_path / "grown.txt"
    grown.write_text("\n".join(sentences[:230]) + "\n", encoding="utf-8")
    old = uninterrupted / "store"
    n_old = Store.open(old).read_table("texts", ["id"]).num_rows
    out = tmp_path / "run"
    plan = estimate(_cfg(grown, out, recipe_file, reuse=str(old)))
    details = [s.detail for s in plan.steps if s.name.startswith("precompute")]  # the teacher, the start model
    assert len(details) == 2 and all(f", {n_old:,} copied from --reuse" in d for d in details), details
    assert not out.exists()
    distill(_cfg(grown, out, recipe_file, reuse=str(old)))
    n_new = Store.open(out / "store").read_table("texts", ["id"]).num_rows - n_old
    assert n_new >= 60
    rows = json.loads((out / "distill.json").read_text())["rows"]
    assert rows == {"precompute the teacher": {"encoded": n_new, "copied": n_old},
                    "precompute the start model": {"encoded": n_new, "copied": n_old}}, rows
    then, now = _teacher_rows(old), _teacher_rows(out / "store")
    assert set(then) == set(now) and all(now[t][i] == v for t in then for i, v in then[t].items())
    before = _weights(out)
    distill(_cfg(grown, out, recipe_file))  # not another run: nothing trained again, nothing refused
    assert _weights(out) == before


@pytest.mark.parametrize("where", ["not a store", "the run's own store", "no such folder", "a run's folder"])
def test_a_wrong_reuse_is_refused_before_anything_is_recorded(tmp_path, uninterrupted, corpus, recipe_file, where):
    out, store = tmp_path / "run", tmp_path / "store"
    reuse = {"not a store": uninterrupted / "stages", "the run's own store": store,
             "no such folder": tmp_path / "nowhere", "a run's folder": uninterrupted}[where]
    said = {"not a store": "no kd store here", "the run's own store": "the run's own store",
            "no such folder": "no such folder", "a run's folder": f"pass {uninterrupted / 'store'}, that run's store"}
    for dry in ([], ["--dry-run"]):
        res = CliRunner().invoke(app, ["distill", *_args(corpus, out, recipe_file), "--store", str(store),
                                       "--reuse", str(reuse), *dry])
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and f"--reuse {reuse}" in text and said[where] in text, res.output
        assert not out.exists()


def test_a_reuse_store_the_run_refuses_is_refused_by_its_dry_run_too(tmp_path, uninterrupted, corpus):
    """A --reuse store holding the run's model with other settings (here another teacher's weights under the same
    table name) is refused by the dry run as by the run, which it once planned as rows to copy; the refused run
    resumes once --reuse is dropped (it is not part of the run's identity)."""
    other = build_tiny_bert(tmp_path / "other-bert", seed=1)
    recipe = write_recipe(tmp_path / "r.toml", other, STAGES.format(steps=3), start=other)
    out = tmp_path / "run"
    for dry in (["--dry-run"], []):
        res = CliRunner().invoke(app, ["distill", *_args(corpus, out, recipe), "--reuse", str(uninterrupted / "store"),
                                       *dry])
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and "with other settings (" in text and "weights_sha256" in text, res.output
        assert dry == [] or not out.exists()
    assert not list((out / "store").rglob("*.parquet"))  # nothing copied, nothing half-written
    distill(_cfg(corpus, out, recipe))
    assert json.loads((out / "distill.json").read_text())["rows"]["precompute the teacher"]["copied"] == 0
