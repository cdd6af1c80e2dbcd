"""Several teachers as one target (issue 51): `--target big.mean:0.7,small.mean:0.3`.

The store: real news sentences through two tiny random BERTs of different widths (small 32-d, big 48-d), each
teacher's own vectors stored; the combined target is built when rows are read, never stored.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import build_tiny_bert
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from typer.testing import CliRunner

from kd.cli import app
from kd.pipeline.precompute import precompute
from kd.student.target import combine, parse_target

TARGET = "big.mean:0.7,small.mean:0.3"


@pytest.fixture(scope="module")
def store(tmp_path_factory, sentences) -> Path:
    root = tmp_path_factory.mktemp("ensemble")
    teachers = {"small": build_tiny_bert(root / "small"), "big": build_tiny_bert(root / "big", hidden=48, layers=3,
                                                                                 seed=3)}
    (root / "news.txt").write_text("\n".join(sentences[:160]) + "\n", encoding="utf-8")
    precompute([str(root / "news.txt")], str(root / "store"), [f"{k}={v}" for k, v in teachers.items()],
               shard_rows=80, progress=False)
    return root / "store"


def _train(store: Path, out: Path, *args: str, steps: int = 40):
    return CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(out), "--max-steps",
                                    str(steps), "--val-percent", "0", "--batch-size", "16", "--log-every", "1",
                                    "--arch", "ffn", "--no-progress", *args])


def _stored(store: Path, teacher: str) -> dict[int, np.ndarray]:
    from kd.storage.store import Store

    t = Store.open(store).read_table(f"teachers/{teacher}", ["id", "mean"])
    return dict(zip(t["id"].to_pylist(), np.stack(t["mean"].to_numpy(zero_copy_only=False))))


def test_the_combined_target_is_the_weighted_concatenation_of_unit_vectors(store):
    """What a training batch holds: sqrt(0.7) big/|big| beside sqrt(0.3) small/|small|, from the stored vectors; so
    the cosine of two rows is 0.7 cos_big + 0.3 cos_small, and each teacher's own columns are not carried along."""
    from kd.storage.store import Store
    from kd.student import data as D
    from kd.student.models import StudentConfig
    from kd.student.objectives.base import Context

    st = Store.open(store)
    ctx = Context.from_manifest(st.manifest, StudentConfig(), TARGET)
    key = ctx.embedding_target()[0]
    assert ctx.shape(key) == (80,) and ctx.part_teacher(key) == "big"
    cfg = D.DataConfig(str(store), [key], "big", batch_size=32, val_percent=0.0, combined=ctx.ensemble)
    plan = D.build_plan(st, cfg)
    big, small = _stored(store, "big"), _stored(store, "small")
    rows = 0
    for batch in D.train_batches(st, plan, 0, 0):
        ids = batch["id"].tolist()
        want = combine([np.stack([big[i] for i in ids]), np.stack([small[i] for i in ids])], [0.7, 0.3])
        np.testing.assert_allclose(batch[key].numpy(), want, rtol=1e-6, atol=1e-7)
        assert "big.mean" not in batch and "small.mean" not in batch
        got = batch[key].numpy()
        cos = got[0] @ got[1]
        unit = {n: v / np.linalg.norm(v, axis=1, keepdims=True) for n, v in
                (("big", np.stack([big[i] for i in ids[:2]])), ("small", np.stack([small[i] for i in ids[:2]])))}
        assert cos == pytest.approx(0.7 * unit["big"][0] @ unit["big"][1] + 0.3 * unit["small"][0] @ unit["small"][1],
                                    abs=1e-5)
        rows += len(ids)
    assert rows == 160


def test_a_student_learns_the_combined_target_and_is_served_at_its_width(store, tmp_path, sentences):
    from kd import student

    res = _train(store, tmp_path / "s", "--target", TARGET, "--objective", "cosine", "--objective", "relational:5",
                 "--lr", "3e-3", steps=80)
    assert res.exit_code == 0, res.output
    info = json.loads((tmp_path / "s" / "config.json").read_text())
    assert info["target"] == ["ensemble.target"]
    model = student.load(tmp_path / "s")
    big, small = _stored(store, "big"), _stored(store, "small")
    from kd.storage.store import Store

    t = Store.open(store).read_table("texts", ["id", "text"])
    ids, texts = t["id"].to_pylist()[:64], t["text"].to_pylist()[:64]
    want = combine([np.stack([big[i] for i in ids]), np.stack([small[i] for i in ids])], [0.7, 0.3])
    got = model.encode(texts)
    assert got.shape == (64, 80)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1)
    assert cos.mean() > 0.6, cos.mean()  # near the combined target, a space neither teacher has alone
    from kd.student.exporters import export_student
    from kd.student.st_load import load_exported

    export_student(tmp_path / "s", "sentence-transformers", tmp_path / "st")
    served = load_exported(tmp_path / "st").encode(texts[:8])  # (an ffn export: sentence-transformers' built-ins)
    assert served.shape == (8, 80)
    np.testing.assert_allclose(served, model.encode(texts[:8]), atol=1e-5)  # the export serves the same 80-d vectors


def test_new_weights_train_again_from_the_same_store(store, tmp_path):
    """Weights live in the training options, not in the store: other weights read the same shards (the store's
    files are untouched) and give another student."""
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    a = _train(store, tmp_path / "a", "--target", "big.mean:0.7,small.mean:0.3", steps=10)
    b = _train(store, tmp_path / "b", "--target", "big.mean:0.2,small.mean:0.8", steps=10)
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before
    from kd import student

    va, vb = (student.load(tmp_path / n).encode(["stocks rose"]) for n in "ab")
    assert not np.allclose(va, vb)


@pytest.mark.parametrize("target,says", [
    ("big.mean:0,small.mean:0", "sum to 0"),
    ("big.mean:-1,small.mean:2", "negative"),
    ("big.mean:nan,small.mean:1", "not finite"),
    ("big.mean:x,small.mean:1", "not a number"),
    ("big.mean:0.5,nope.mean:0.5", "'nope' is not in the store"),
    ("big.mean:0.5,small.nothing:0.5", "small.nothing is not in the store"),
    ("big.mean,big.mean", "twice"),
    ("big.mean:1,,small.mean:1", "empty part"),
    ("ensemble.target:1,big.mean:1", "kd's name for a combined target"),
])
def test_bad_combined_targets_are_clear_errors(store, tmp_path, target, says):
    res = _train(store, tmp_path / "s", "--target", target, steps=2)
    assert res.exit_code == 2, res.output
    assert says in res.output and "Traceback" not in res.output
    assert not (tmp_path / "s" / "config.json").exists()


def test_teachers_of_different_row_sets_are_refused(store, tmp_path):
    """A teacher that has not finished (a shard missing) holds other rows than the texts: refused before a step."""
    forged = shutil.copytree(store, tmp_path / "store")
    for m in [forged / "manifest.json", *(forged / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        d["tables"]["teachers/small"]["shards"].pop("1", None)
        m.write_text(json.dumps(d))
    res = _train(forged, tmp_path / "s", "--target", TARGET, steps=2)
    assert res.exit_code == 2, res.output
    assert "teachers/small" in res.output and "incomplete" in res.output


def test_the_target_text_round_trips():
    t = parse_target(" big.mean:0.7, small:0.3")
    assert str(t) == "big.mean:0.7,small:0.3" and t.shares() == pytest.approx([0.7, 0.3])
    assert str(parse_target("big.mean")) == "big.mean" and not parse_target("big.mean").combined
    assert parse_target("a:2,b:2").shares() == [0.5, 0.5]


# --------------------------------------------------------------------------------------------------
# kd distill with several teachers

RECIPE = """description = "two teachers as one target"
teacher = ["{a}", "{b}"]
target = "mean"
{weights}
[outputs]
teacher = ["mean", "vocab"]

[[stage]]
name = "static"
from = "teacher"
arch = "static"
embed_dim = 16
objectives = ["cosine"]
epochs = 1
batch_size = 32
val_percent = 0
"""


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("two")
    return build_tiny_bert(root / "a"), build_tiny_bert(root / "b", hidden=48, layers=3, seed=3)


@pytest.fixture()
def corpus(tmp_path, sentences) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(sentences[:120]) + "\n", encoding="utf-8")
    return path


def _recipe(tmp_path: Path, two: tuple[Path, Path], weights: str = "") -> Path:
    path = tmp_path / "two.toml"
    path.write_text(RECIPE.format(a=two[0], b=two[1], weights=weights), encoding="utf-8")
    return path


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_distill_chooses_the_weights_on_dev_and_new_weights_need_no_teacher_pass(tmp_path, corpus, two):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(out), "--recipe", str(_recipe(tmp_path, two)),
                                   "--no-export"])
    assert res.exit_code == 0, res.output
    chosen = json.loads((out / "weights.json").read_text())
    assert chosen["teachers"] == ["teacher", "teacher2"] and len(chosen["candidates"]) == 11
    assert sum(chosen["weights"]) == pytest.approx(1.0)
    dev = chosen["sts_dev"]
    assert dev["ensemble"] >= max(dev["teacher"], dev["teacher2"])  # the grid holds each teacher alone
    said = " ".join(res.output.split())
    assert f"teacher alone: STS-B dev {dev['teacher']:.2f}" in said and f"STS-B dev {dev['ensemble']:.2f}" in said
    args = json.loads((out / "stages" / "static" / "training_args.json").read_text())
    parts = [f"{t}.mean:{w:g}" for t, w in zip(chosen["teachers"], chosen["weights"]) if w > 0]
    assert args["target"] == ",".join(parts)
    # resumed after the weights step, its dry run was refused naming a weights.json in its own temp folder (a probe)
    weights, trained = (out / "weights.json").read_bytes(), (out / "stages" / "static" / "model.safetensors")
    shutil.rmtree(out / "stages" / "static")
    argv = ["distill", str(corpus), "-o", str(out), "--recipe", str(_recipe(tmp_path, two)), "--no-export"]
    res = CliRunner().invoke(app, [*argv, "--dry-run"])
    assert res.exit_code == 0 and "train stage static" in res.output, res.output
    # weights.json is the weights step's work: damaged or edited (a traceback, or a stage trained on its numbers:
    # 1e308 twice trained to NaN, exit 0), the weights are chosen again, and the stage trained on them
    for damaged in (b"[" * 100_000, b'{"weights": [1e308, 1e308]}', b'{"weights": [-1, 2]}'):
        (out / "weights.json").write_bytes(damaged)
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 0 and "weights.json is not as it was written" in " ".join(res.output.split())
        assert (out / "weights.json").read_bytes() == weights and trained.is_file()
        assert json.loads((out / "stages" / "static" / "training_args.json").read_text())["target"] == args["target"]
    # a run recorded before weights.json's sha256 was: a damaged one is refused naming it, the fix redoes its step
    state = json.loads((out / "distill.json").read_text())
    del state["files"]["choose the teacher weights on STS-B dev"]
    (out / "distill.json").write_text(json.dumps(state))
    record = json.loads(weights)
    swapped = json.dumps(record | {"teachers": record["teachers"][::-1]}).encode()
    no_candidate = json.dumps(record | {"weights": [5.0, 1.0]}).encode()  # (these two were trained on: a probe)
    for damaged in (b"[" * 100_000, b'{"weights": [1]}', b'{"weights": [1e308, 1e308]}', b'{"weights": ["a", 1]}',
                    b'{"weights": [Infinity, 1]}', b'{"weights": [NaN, 1]}', swapped, no_candidate):
        (out / "weights.json").write_bytes(damaged)
        for extra in ([], ["--dry-run"]):
            res = CliRunner().invoke(app, [*argv, *extra])
            said = " ".join(res.output.split())
            assert res.exit_code == 2 and "weights.json is not the teachers' weights" in said, said
            assert "the rerun chooses the weights again" in said, said
    (out / "weights.json").unlink()
    assert CliRunner().invoke(app, argv).exit_code == 0 and (out / "weights.json").read_bytes() == weights

    # other weights on the same store: the teachers are not run again (the store's files are untouched), the stage
    # is trained again (another target, so another stage key: not copied) onto the new combined target
    before = _files(out / "store")
    again = tmp_path / "again"
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(again), "--recipe", str(_recipe(tmp_path, two)),
                                   "--store", str(out / "store"), "--weights", "0.5,0.5", "--no-export"])
    assert res.exit_code == 0, res.output
    assert _files(out / "store") == before
    assert not (again / "weights.json").exists() and "copied" not in res.output
    args = json.loads((again / "stages" / "static" / "training_args.json").read_text())
    assert args["target"] == "teacher.mean:0.5,teacher2.mean:0.5"
    from kd import student

    assert student.load(again / "stages" / "static").encode(["stocks rose"]).shape == (1, 80)


@pytest.mark.parametrize("extra,says", [
    (["--weights", "1"], "1 weights for 2 teachers"),
    (["--weights", "0,0"], "positive sum"),
    (["--weights", "0.5,x"], "not a list of numbers"),
    (["--weights", "-1,2"], "positive sum"),
])
def test_bad_distill_weights_are_clear_errors(tmp_path, corpus, two, extra, says):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(out), "--recipe", str(_recipe(tmp_path, two)),
                                   *extra])
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.output.split()) and not out.exists()


@pytest.mark.parametrize("weights,says", [
    ("weights = [0.5]", "1 weights for 2 teachers"),
    ("weights = [0, 0]", "positive sum"),
    ('weights = ["a", 1]', "list of numbers"),
])
def test_bad_recipe_weights_are_clear_errors(tmp_path, two, weights, says):
    from kd.apps.distill import recipe as R
    from kd.common.errors import InputError

    with pytest.raises(InputError, match=says):
        R.load(str(_recipe(tmp_path, two, weights)))


def test_a_teacher_named_twice_and_weights_for_one_teacher_are_refused(tmp_path, corpus, two):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(out), "--student", "static", "--teacher",
                                   f"{two[0]},{two[0]}"])
    assert res.exit_code == 2 and "a teacher is given twice" in res.output, res.output
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(out), "--student", "static", "--weights", "1"])
    assert res.exit_code == 2 and "several teachers" in res.output, res.output


def test_the_dry_run_prints_each_teachers_dev_score_and_the_ensembles(tmp_path, corpus, two):
    out = tmp_path / "planned"
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(out), "--recipe", str(_recipe(tmp_path, two)),
                                   "--dry-run", "--no-evaluate", "--no-export"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "teacher alone: STS-B dev" in said and "teacher2 alone: STS-B dev" in said and "ensemble" in said
    assert "choose the teacher weights" in said and not out.exists()


def test_the_grid_holds_each_teacher_alone_and_ties_keep_the_first():
    from kd.apps.distill.teacher_weights import choose, simplex

    assert len(simplex(2)) == 11 and len(simplex(3)) == 66
    assert all(sum(w) == pytest.approx(1.0) for w in simplex(3))
    rng = np.random.default_rng(0)
    gold = rng.normal(size=200)
    good, noise = gold + 0.5 * rng.normal(size=200), rng.normal(size=200)
    c = choose(["good", "noise"], np.stack([good, noise]), gold)
    assert c.weights[0] > c.weights[1] and c.alone["good"] > c.alone["noise"]
    same = choose(["a", "b"], np.stack([good, good]), gold)  # every weighting scores alike: the first teacher alone
    assert same.weights == (1.0, 0.0)
    assert c.target("sentence") == ",".join(f"{n}.sentence:{w:g}" for n, w in zip(c.teachers, c.weights))
