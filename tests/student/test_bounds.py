"""Bounds before work (issue 41, item 3): what can only be checked against memory, the store or the teacher is
checked before the first row is encoded, the first step is trained or the model is built."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store, tiny_bert_config
from typer.testing import CliRunner

from kd.cli import app
from kd.common import hardware
from kd.common.errors import InputError, KdError
from kd.student import models
from kd.student import trainer as T
from kd.student.models import StudentConfig, build_student, parameter_count

SMALL = ["--embed-dim", "8", "--hidden-dim", "8", "--batch-size", "8", "--max-steps", "1", "--no-progress"]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bounds")
    return make_store(root / "store", rows=40, shards=2, tmp=root)


def _train(store: Path, out: Path, *args: str):
    return CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(out), *SMALL, *args])


@pytest.fixture()
def no_build(monkeypatch):
    """Any attempt to build a student fails the test (so a refusal is proven to come before it)."""
    def refuse(self, cfg):
        raise AssertionError("a student was built")

    monkeypatch.setattr(models.Student, "__init__", refuse)


# --- (a) model size against memory ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["bilstm", "bigru", "cnn", "ffn", "transformer", "static", "transformer-init"])
@pytest.mark.parametrize(("pooling", "out_dim", "embed_dim"), [("mean", 24, 16), ("attentive", 32, 32)])
def test_the_estimate_is_the_built_models_parameter_count(arch, pooling, out_dim, embed_dim):
    cfg = StudentConfig(arch=arch, vocab_size=90, embed_dim=embed_dim, hidden_dim=32, num_layers=3, pooling=pooling,
                        out_dim=out_dim, max_length=20, ffn_dim=40, kernel_sizes=(2, 3, 5),
                        bert=tiny_bert_config(hidden=32, layers=2, vocab=90) if arch == "transformer-init" else None)
    assert parameter_count(cfg) == build_student(cfg).num_parameters()


def test_a_student_too_large_for_memory_is_refused_before_it_is_built(store_path, tmp_path, monkeypatch, no_build):
    monkeypatch.setattr(hardware, "available_memory", lambda: 1024)  # 1 KiB left: less than any student
    with pytest.raises(KdError) as e:
        T.train(T.TrainConfig(str(store_path), str(tmp_path / "api"), arch="ffn", embed_dim=8, hidden_dim=8,
                              max_steps=1, progress=False))
    assert "GiB" in e.value.what and "parameters" in e.value.what and "--layers" in e.value.where
    assert "--hidden-dim" in e.value.fix
    assert not (tmp_path / "api").exists()
    res = _train(store_path, tmp_path / "cli", "--arch", "ffn")
    assert res.exit_code == 2 and "0.0 GiB of available memory" in res.output, res.output
    assert not (tmp_path / "cli").exists()


def test_the_issue_case_is_refused_by_its_size(store_path, tmp_path, no_build):
    """`--layers 128 --hidden-dim 16384`: ~1.4e11 parameters, terabytes to train, on any machine."""
    res = _train(store_path, tmp_path / "huge", "--arch", "transformer", "--layers", "128", "--hidden-dim", "16384")
    assert res.exit_code == 2 and "GiB" in res.output and "--layers 128 --hidden-dim 16384" in res.output, res.output


def test_building_or_loading_checks_the_weights_alone(monkeypatch):
    cfg = StudentConfig(arch="ffn", vocab_size=1000, embed_dim=100, hidden_dim=100, out_dim=100)
    need = models.memory_needed(cfg, training=False)
    assert need == int(parameter_count(cfg) * 4 * models.ACTIVATION_MARGIN) < models.memory_needed(cfg, True)
    monkeypatch.setattr(hardware, "available_memory", lambda: need)
    build_student(cfg)  # fits exactly
    monkeypatch.setattr(hardware, "available_memory", lambda: need - 1)
    with pytest.raises(KdError, match="weights"):
        build_student(cfg)


# --- (b) manifest counts against the shards ------------------------------------------------------------------


def _forge(store: Path, **inputs: int) -> None:
    for m in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        d["inputs"].update(inputs)
        m.write_text(json.dumps(d))


@pytest.mark.parametrize("forged", [{"num_rows": 10**12}, {"rows_per_shard": 10**15},
                                    {"num_rows": 10**12, "rows_per_shard": 10**15}])
def test_forged_counts_are_reported_by_validate_and_not_printed_by_info(store_path, tmp_path, forged):
    import shutil

    store = Path(shutil.copytree(store_path, tmp_path / "store"))
    _forge(store, **forged)
    res = CliRunner().invoke(app, ["validate", str(store)])
    assert res.exit_code == 1 and "problem" in res.output and "manifest.json" in res.output, res.output
    assert any(f"{v:,}" in res.output for v in forged.values())
    res = CliRunner().invoke(app, ["info", str(store)])
    assert res.exit_code == 0 and re.search(r"rows +unknown: the manifest's counts disagree", res.output), res.output


def test_a_sound_store_has_no_count_problem(store_path):
    res = CliRunner().invoke(app, ["validate", str(store_path)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["info", str(store_path)])
    assert "40 in 2 shard(s) of 20" in res.output and "disagree" not in res.output


@pytest.mark.parametrize("forged", [{"rows_per_shard": 10**15}, {"rows_per_shard": 15}])
def test_a_store_with_a_forged_plan_is_refused_by_precompute_and_repair_and_left_unchanged(tiny_teacher, sentences,
                                                                                           tmp_path, forged):
    """Both records forged alike: precompute is refused at once, writing nothing (it had rewritten its fragment,
    then reported a manifest/fragment disagreement that --repair could not mend); --repair says it cannot
    restore the plan; --overwrite writes the store again."""
    from conftest import precompute_news

    store = precompute_news(tmp_path, tiny_teacher, sentences, rows=60, shard_rows=20)
    _forge(store, **forged)
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file() and "locks" not in p.parts}
    args = ["precompute", str(tmp_path / "news.txt"), "-t", f"tiny={tiny_teacher}", "--shard-rows", "20",
            "-o", str(store), "--no-progress"]
    res = CliRunner().invoke(app, args)
    # (a plan below the shard records' rows is refused as a damaged record when read; above them, as a plan)
    assert res.exit_code == 2 and "disagree on" not in res.output, res.output
    assert re.search(r"damaged row plan|shards.0.rows is 20, not a whole number in \[0, 15\]", res.output), res.output
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert res.exit_code == 2 and re.search(r"--repair cannot (restore|rebuild)", res.output), res.output
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file() and "locks" not in p.parts} == before
    res = CliRunner().invoke(app, [*args, "--overwrite"])
    assert res.exit_code == 0, res.output
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0


# --- (c) options checked against the store and the teacher before any work -----------------------------------


def test_keep_layers_beyond_the_teacher_is_refused_before_encoding(tiny_teacher, tmp_path, monkeypatch):
    from kd.pipeline.engines import local as local_engine
    from kd.pipeline.precompute import precompute

    def no_rows(*a, **kw):
        raise AssertionError("the rows were encoded")

    monkeypatch.setattr(local_engine, "write", no_rows)
    src = tmp_path / "in.txt"
    src.write_text("the cat runs\nthe dog sees a bird\n", encoding="utf-8")
    with pytest.raises(InputError, match="--keep-layers '99': layers are numbered 0..1"):
        precompute([str(src)], str(tmp_path / "store"), [f"tiny={tiny_teacher}"], outputs=["mean", "init"],
                   keep_layers="99", backend="torch", progress=False)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(("spec", "expect"), [("cosine:nan", "not finite"), ("cosine:inf", "not finite"),
                                              ("cosine:-1", "negative"), ("cosine:0", "every objective has weight 0")])
def test_bad_objective_weights_are_refused_before_any_step(store_path, tmp_path, spec, expect):
    res = _train(store_path, tmp_path / "s", "--arch", "ffn", "--objective", spec)
    assert res.exit_code == 2 and expect in res.output and spec in res.output, res.output
    assert not (tmp_path / "s").exists()  # no empty student folder left behind


def test_a_zero_weight_beside_a_positive_one_trains(store_path, tmp_path):
    res = _train(store_path, tmp_path / "s", "--arch", "ffn", "--objective", "cosine", "--objective", "mse:0")
    assert res.exit_code == 0, res.output


def test_the_parser_refuses_a_non_finite_weight():
    from kd.student.objectives import parse_objective

    for text in ("mse:nan", "mse:-inf", "mse:1e999"):
        with pytest.raises(KdError, match="not finite|negative"):
            parse_objective(text)


@pytest.mark.parametrize("args", [("--objective", "logits"), ("--target", "tiny.nope"), ("--target", "other.mean")])
def test_objective_and_column_names_are_checked_against_the_store_before_training(store_path, tmp_path, args,
                                                                                  no_build):
    res = _train(store_path, tmp_path / "s", "--arch", "ffn", *args)
    assert res.exit_code == 2 and any(w in res.output for w in ("available", "teachers in the store")), res.output
    assert not (tmp_path / "s").exists()


def test_options_that_would_be_silently_unused_are_refused():
    """--pooling on a static student (its encode and exports average whatever it trained with) and
    --keep-layers without the init output it chooses for."""
    from kd.pipeline.job import PrecomputeJob
    from kd.student.train_config import TrainConfig

    for pooling in ("cls", "max"):
        with pytest.raises(InputError, match=f"--pooling {pooling} does not apply to --arch static"):
            TrainConfig("S", "O", arch="static", pooling=pooling)
    TrainConfig("S", "O", arch="bilstm", pooling="max")  # other archs pool as asked
    with pytest.raises(InputError, match="--keep-layers chooses the layers of the init output"):
        PrecomputeJob(["a.txt"], "out", ["minilm"], outputs=["mean"], keep_layers="2")
    PrecomputeJob(["a.txt"], "out", ["minilm"], outputs=["mean", "init"], keep_layers="2")


def test_a_run_failing_before_its_first_checkpoint_leaves_no_folder(store_path, tmp_path, monkeypatch):
    """It left the folder it created with its lock (and metrics), so the same command, rerun once the cause was
    fixed, asked for --overwrite."""
    def fail(run, st, batch):
        raise KdError("a failure inside step 1", "here", "nothing")

    monkeypatch.setattr(T, "_train_step", fail)
    res = _train(store_path, tmp_path / "st")
    assert res.exit_code == 2 and "step 1" in res.output and not (tmp_path / "st").exists(), res.output
    monkeypatch.undo()
    res = _train(store_path, tmp_path / "st")
    assert res.exit_code == 0 and (tmp_path / "st" / "config.json").is_file(), res.output
    (tmp_path / "mine").mkdir()  # a folder the user made is theirs: kept, whatever fails in it
    monkeypatch.setattr(T, "_train_step", fail)
    assert _train(store_path, tmp_path / "mine").exit_code == 2 and (tmp_path / "mine").is_dir()


@pytest.mark.parametrize("files", [
    {"config.json": '{"model_type": "bert", "hidden_size": 32}', "model.safetensors": "weights"},  # a checkpoint
    {"config.json": '{"mine": 1}', "README.md": "my project\n", "metrics.jsonl": '{"step": 1}\n'},
    {"keep.txt": "notes\n"}])
def test_train_student_never_writes_into_a_folder_of_files_kd_did_not_write(store_path, tmp_path, files):
    """The probe's W48/W51: a copied checkpoint folder as -o was refused with "holds a student ... pass
    --overwrite", the refused run left its lock there (which made the folder "a student"), and the --overwrite it
    suggested then replaced the checkpoint's weights. W33/W34: a folder of the user's own files was written into.
    Now every such folder is refused, with and without --overwrite, and left exactly as it was."""
    folder = tmp_path / "theirs"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    for extra in ((), ("--overwrite",)):
        res = _train(store_path, folder, *extra)
        assert res.exit_code == 2 and "new --out" in res.output and any(
            why in res.output for why in ("kd did not write", "written by kd train-student")), res.output
        assert {p.name: p.read_text() for p in folder.iterdir()} == files  # no lock, no metrics, nothing replaced
    res = _train(store_path, tmp_path / "mine")  # kd's own student: --overwrite still replaces it
    assert res.exit_code == 0 and _train(store_path, tmp_path / "mine", "--overwrite").exit_code == 0


def test_the_same_command_after_it_finished_has_nothing_to_do(store_path, tmp_path, monkeypatch):
    """The replayed probe's IT_TERM_14: a kill that came after the run had finished, then the same command again,
    was refused ("holds a student ... pass --overwrite"). The same command now finds its student and exits 0
    without training; other options are refused naming them."""
    out = tmp_path / "st"
    assert _train(store_path, out).exit_code == 0
    before = (out / "model.safetensors").read_bytes()
    monkeypatch.setattr(T, "_train", lambda cfg, d: (_ for _ in ()).throw(AssertionError("trained again")))
    res = _train(store_path, out, "--no-progress")  # how it is shown is not what it trains
    assert res.exit_code == 0 and (out / "model.safetensors").read_bytes() == before, res.output
    monkeypatch.undo()
    res = _train(store_path, out, "--lr", "0.5")
    assert res.exit_code == 2 and "trained with other options (lr:" in res.output and "--overwrite" in res.output


def test_a_refused_run_leaves_no_lock_in_a_folder_whose_config_only_mentions_kd(store_path, tmp_path):
    """The replayed probe's N06: a user's config.json holding {"meta": {"format": "kd-student"}} passed for a kd
    student's (the check looked anywhere in the first bytes), and the refused run left `.kd-train.lock`, after which
    the folder counted as a student."""
    folder = tmp_path / "theirs"
    folder.mkdir()
    (folder / "config.json").write_text('{"meta": {"format": "kd-student"}}')
    (folder / "README.md").write_text("mine\n")
    for extra in ((), ("--overwrite",)):
        assert _train(store_path, folder, *extra).exit_code == 2
        assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json"]
