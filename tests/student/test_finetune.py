"""Task teachers and task fine-tuning: finetune-teacher -> precompute -> DSE / DvBERT -> kd finetune (SRA, SRA+KD).

The task is learnable by a tiny random BERT in a few steps: a pair is "pos" when b is a shuffle of a's
words, "neg" when b's words come from another part of the vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import WORDS
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from task_pairs import write_pairs
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError, KdError
from kd.common.ids import row_ids
from kd.common.tasks import LabelSet, Task, read_task, task_columns
from kd.pipeline.backends.loading import load_teacher
from kd.pipeline.precompute import precompute
from kd.pipeline.teacher.finetune import TeacherFinetuneConfig, finetune_teacher
from kd.storage.store import Store
from kd.student import load
from kd.student.finetune import FinetuneConfig, finetune, load_task_model
from kd.student.trainer import TrainConfig, train

PAIRS = dict(pair_columns="a,b", label_column="quality")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pairs")
    return {"train": write_pairs(d / "train.tsv", 160, 0), "dev": write_pairs(d / "dev.tsv", 60, 1), "root": d}


@pytest.fixture(scope="module")
def teachers(data, tiny_teacher) -> dict:
    """Two cross-encoders fine-tuned from the same tiny BERT with two seeds (DvBERT's two teachers)."""
    out = {}
    for seed in (0, 1):
        out[f"ce{seed}"] = finetune_teacher(TeacherFinetuneConfig(
            str(tiny_teacher), Task.pair_classification, [str(data["train"])], str(data["root"] / f"ce{seed}"),
            dev=[str(data["dev"])], epochs=4, lr=3e-3, warmup=0, batch_size=8, seed=seed, progress=False, **PAIRS))
    return out


@pytest.fixture(scope="module")
def store(data, teachers, tiny_teacher) -> Path:
    """Pair store over the training file: the bi-encoder's per-side mean, both cross-encoders' logits."""
    path = data["root"] / "store"
    precompute([str(data["train"])], str(path), [f"tiny={tiny_teacher}"], outputs=["mean"], progress=False, **PAIRS)
    precompute([str(data["train"])], str(path), [f"ce0={teachers['ce0'].out}", f"ce1={teachers['ce1'].out}"],
               outputs=["logits"], progress=False, **PAIRS)
    return path


def _train_student(store: Path, out: Path, objective: str) -> list[dict]:
    train(TrainConfig(str(store), str(out), arch="bilstm", objectives=[objective], target="tiny.mean",
                      embed_dim=16, hidden_dim=16, batch_size=16, epochs=8, lr=1e-2, val_percent=0.0,
                      log_every=1, progress=False))
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if "loss" in ln]


@pytest.fixture(scope="module")
def dse_student(store, data) -> tuple[Path, list[dict]]:
    out = data["root"] / "dse"
    return out, _train_student(store, out, "pair")


def test_finetune_teacher_learns_and_saves_a_teacher_checkpoint(teachers):
    s = teachers["ce0"]
    assert s.label_names == ["neg", "pos"] and s.train_rows == 160 and s.steps == 80
    assert s.dev_metrics["accuracy"] >= 90, s.history
    saved = json.loads((Path(s.out) / "dev_metrics.json").read_text())
    assert saved["dev_metrics"] == s.dev_metrics and saved["best_epoch"] == s.best_epoch
    cfg = json.loads((Path(s.out) / "config.json").read_text())
    assert cfg["architectures"][0].endswith("ForSequenceClassification")
    assert cfg["id2label"] == {"0": "neg", "1": "pos"}
    t = load_teacher(s.out)
    assert t.has_head and t.label_names == ["neg", "pos"]


def test_teacher_round_trips_into_a_pair_store_with_logits(store, data, teachers):
    st = Store.open(str(store))
    assert st.manifest.pairs and {"teachers/ce0", "teachers/ce1", "teachers/tiny"} <= set(st.manifest.tables)
    meta = st.table("teachers/ce0").meta
    assert meta["label_names"] == ["neg", "pos"] and "logits" in st.table("teachers/ce0").columns
    texts = st.read_table("texts", ["id", "text_a", "text_b", "label"])
    logits = np.array(st.read_table("teachers/ce0", ["logits"]).column("logits").to_pylist())
    gold = LabelSet(("neg", "pos")).encode(texts.column("label").to_pylist())
    assert (logits.argmax(1) == gold).mean() >= 0.9  # the stored logits are the fine-tuned teacher's
    # kd finetune finds training rows by these ids, computed from the file alone
    rows = read_task(str(data["train"]), Task.pair_classification, task_columns(Task.pair_classification, **PAIRS))
    assert rows.ids.tolist() == texts.column("id").to_pylist() == row_ids(rows.texts).tolist()
    direct = load_teacher(teachers["ce0"].out).encode(rows.texts[:8])["logits"]
    np.testing.assert_allclose(direct, logits[:8], atol=1e-4)


def test_dse_objective_reduces_loss_through_the_trainer(dse_student):
    _, recs = dse_student
    first, last = np.mean([r["loss"] for r in recs[:3]]), np.mean([r["loss"] for r in recs[-3:]])
    assert last < 0.5 * first, (first, last)


def test_dvbert_objective_reduces_loss_through_the_trainer(store, data):
    recs = _train_student(store, data["root"] / "dvbert", "multi-teacher")
    assert recs[0]["multi-teacher:1"] > 0
    first, last = np.mean([r["loss"] for r in recs[:3]]), np.mean([r["loss"] for r in recs[-3:]])
    assert last < 0.8 * first, (first, last)


def test_kd_finetune_with_and_without_store_predicts_through_python(dse_student, store, data, teachers):
    base, _ = dse_student
    common = dict(task="pair-classification", train=[str(data["train"])], dev=[str(data["dev"])], epochs=3,
                  lr=3e-3, batch_size=16, hidden=32, progress=False, **PAIRS)
    plain = finetune(FinetuneConfig(str(base), out=str(data["root"] / "sra"), **common))
    kd = finetune(FinetuneConfig(str(base), out=str(data["root"] / "sra-kd"), kd_store=str(store),
                                 kd_teacher="ce0", kd_weight=1.0, **common))
    assert plain.kd_teacher is None and kd.kd_teacher == "ce0" and kd.label_names == ["neg", "pos"]
    rows = read_task(str(data["dev"]), Task.pair_classification, task_columns(Task.pair_classification, **PAIRS))
    train_rows = read_task(str(data["train"]), Task.pair_classification,
                           task_columns(Task.pair_classification, **PAIRS))
    teacher_logits = np.array(Store.open(str(store)).read_table("teachers/ce0", ["logits"]).column("logits")
                              .to_pylist())
    gaps = {}
    for s in (plain, kd):
        model = load_task_model(s.out)
        pred = model.predict(rows.texts)
        assert set(pred) <= {"neg", "pos"}
        acc = 100 * float(np.mean(pred == np.array(rows.labels, dtype=object)))
        assert acc == pytest.approx(s.dev_metrics["accuracy"], abs=1e-6)  # saved and reloaded = best epoch
        assert model.evaluate(rows.texts, rows.labels)["accuracy"] == pytest.approx(acc)
        gaps[s.out] = float(np.mean((model.outputs(train_rows.texts) - teacher_logits) ** 2))
        assert load(s.out).encode(["a cat"]).shape == (1, 32)  # still a student folder
    assert kd.dev_metrics["accuracy"] >= 80
    assert gaps[kd.out] < gaps[plain.out]  # SRA+KD pulled the head's outputs towards the teacher's logits


def test_pair_regression_teacher_and_student(data, tiny_teacher, dse_student):
    train_file = write_pairs(data["root"] / "scores.tsv", 96, 2, score=True)
    t = finetune_teacher(TeacherFinetuneConfig(
        str(tiny_teacher), "pair-regression", str(train_file), str(data["root"] / "ce-reg"), dev=str(train_file),
        epochs=2, lr=3e-3, warmup=0, batch_size=16, progress=False, **PAIRS))
    assert t.label_names is None and set(t.dev_metrics) == {"spearman", "pearson", "n"}
    teacher = load_teacher(t.out)
    assert teacher.label_names == ["score"]
    rows = read_task(str(train_file), Task.pair_regression, task_columns(Task.pair_regression, **PAIRS))
    y = rows.scores()
    # the score head starts at the mean score, so even a short run predicts on the labels' scale
    assert abs(teacher.encode(rows.texts)["logits"][:, 0].mean() - y.mean()) < 0.75
    s = finetune(FinetuneConfig(str(dse_student[0]), "pair-regression", str(train_file), str(data["root"] / "reg"),
                                max_steps=4, batch_size=16, progress=False, **PAIRS))
    pred = load_task_model(s.out).predict(rows.texts)
    assert pred.dtype == np.float32 and pred.shape == (len(rows),)
    assert abs(pred.mean() - y.mean()) < 0.75


def test_single_text_classification_teacher_and_student(data, tiny_teacher, dse_student):
    rng = np.random.default_rng(3)
    lines = ["sentence\tsentiment"] + [
        f"{' '.join(rng.choice(WORDS[20:40] if good else WORDS[40:], 4))}\t{'good' if good else 'bad'}"
        for good in rng.random(64) < 0.5]
    path = data["root"] / "sentiment.tsv"
    path.write_text("\n".join(lines) + "\n")
    cols = dict(text_column="sentence", label_column="sentiment")
    t = finetune_teacher(TeacherFinetuneConfig(str(tiny_teacher), "classification", str(path),
                                               str(data["root"] / "clf"), max_steps=3, progress=False, **cols))
    assert t.label_names == ["bad", "good"] and t.steps == 3
    assert load_teacher(t.out).encode(["the cat"])["logits"].shape == (1, 2)
    s = finetune(FinetuneConfig(str(dse_student[0]), "classification", str(path), str(data["root"] / "clf-st"),
                                dev=str(path), epochs=4, lr=3e-3, batch_size=8, progress=False, **cols))
    assert s.dev_metrics["accuracy"] >= 90, s.history
    assert set(load_task_model(s.out).predict(["cat dog", "blue red"])) <= {"good", "bad"}
    with pytest.raises(InputError, match="pass strings"):
        load_task_model(s.out).predict([("a", "b")])


def test_errors_are_clear(data, store, dse_student, tmp_path):
    with pytest.raises(InputError, match="no --pair-columns"):
        task_columns(Task.pair_regression)
    with pytest.raises(InputError, match="at least two classes"):
        LabelSet.fit(["x", "x"])
    # a store precomputed from other rows than the training file
    with pytest.raises(KdError, match="training rows are not in the --kd-store"):
        finetune(FinetuneConfig(str(dse_student[0]), "pair-classification", str(data["dev"]), str(tmp_path / "x"),
                                kd_store=str(store), kd_teacher="ce0", progress=False, **PAIRS))
    with pytest.raises(KdError, match="exactly one teacher with logits"):
        finetune(FinetuneConfig(str(dse_student[0]), "pair-classification", str(data["train"]), str(tmp_path / "y"),
                                kd_store=str(store), progress=False, **PAIRS))
    bad = tmp_path / "bad.tsv"
    bad.write_text("quality\ta\tb\nhigh\tx\ty\n")
    with pytest.raises(InputError, match="not a number"):
        read_task(str(bad), Task.pair_regression, task_columns(Task.pair_regression, **PAIRS))


def test_cli_finetune_and_errors(data, dse_student, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["finetune", "--student", str(dse_student[0]), "--task", "pair-classification",
                              "--train", str(data["train"]), "--pair-columns", "a,b", "--label-column", "quality",
                              "--out", str(tmp_path / "cli"), "--max-steps", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "fine-tuned student written to" in res.stdout
    assert load_task_model(tmp_path / "cli").predict([("a", "b")]).shape == (1,)
    res = runner.invoke(app, ["finetune-teacher", "--base", "minilm", "--task", "regression", "--train",
                              str(data["train"]), "--out", str(tmp_path / "t")])
    assert res.exit_code == 2 and "'--task'" in res.output and "'pair-regression'" in res.output  # at parse time


def test_real_task_files_read_as_the_bench_reads_them():
    from conftest import shared_file

    mrpc = read_task(str(shared_file("mrpc", "msr_paraphrase_train.txt")), Task.pair_classification,
                     task_columns(Task.pair_classification, pair_columns="#1 String,#2 String",
                                  label_column="Quality"))  # a .txt with a byte-order mark, read by header
    assert len(mrpc) == 4076 and LabelSet.fit(mrpc.labels).names == ("0", "1")
    assert mrpc.texts[0][0].startswith("Amrozi accused his brother")
    sts = read_task(str(shared_file("stsb", "sts-dev.csv")), Task.pair_regression,
                    task_columns(Task.pair_regression, pair_columns="5,6", label_column="4"))
    assert len(sts) == 1500 and sts.scores()[0] == 5.0
