"""kd eval end to end on a tiny random teacher, its store and a tiny student trained from it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_file
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from typer.testing import CliRunner

from kd.apps.eval import tasks
from kd.apps.eval.run import COLUMNS, EvalConfig, Measure, evaluate
from kd.cli import app
from kd.pipeline.precompute import precompute
from kd.student.trainer import TrainConfig, train

STS_PAIRS = 60


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_teacher, sentences) -> dict[str, Path]:
    """A store of real sentences plus the first STS-B dev pairs' texts, and a student trained on it."""
    root = tmp_path_factory.mktemp("eval")
    sts = tasks.load_stsb("dev").head(STS_PAIRS)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(sentences[:200] + sts.a + sts.b) + "\n", encoding="utf-8")
    store = root / "store"
    precompute([str(corpus)], str(store), [f"tiny={tiny_teacher}"], outputs=["mean"], shard_rows=150,
               progress=False)
    student = root / "student"
    train(TrainConfig(str(store), str(student), arch="bilstm", embed_dim=16, hidden_dim=16, max_steps=15,
                      batch_size=16, val_percent=5.0, progress=False))
    return {"root": root, "store": store, "student": student, "teacher": tiny_teacher}


@pytest.fixture(scope="module")
def report(setup):
    shared_file("sst2", "sentiment-train")  # a probe sample smaller than the bundled one reads the shared data
    r = setup["root"]
    cfg = EvalConfig(
        students=[str(setup["student"])], store=str(setup["store"]), measures=list(Measure),
        max_pairs=STS_PAIRS, cluster_scale=0.1, probe_train_rows=300, agreement_rows=10_000, k=5,
        sts_split="dev", retrieval_articles=100,  # dev: the pairs in the store (the suite alone would take test)
        speed_b1=8, speed_big=64, json_path=str(r / "report.json"), markdown_path=str(r / "report.md"),
        plot_dir=str(r / "plots"), progress=False, cache=False,  # "from the model" even where KD_CACHE persists
    )
    return evaluate(cfg)


def test_one_row_per_model_and_a_number_in_every_column(report):
    assert [(m.name, m.kind) for m in report.models] == [("tiny", "teacher"), ("student", "student")]
    assert [c.key for c in report.columns] == [c.key for c in COLUMNS]
    for m in report.models:
        for c in report.columns:
            v = m.metrics[c.key]
            assert isinstance(v, float) and math.isfinite(v), (m.name, c.key, v)


def test_teacher_is_its_own_reference_and_student_is_not(report):
    teacher, student = report.models
    assert teacher.metrics["cos_to_teacher"] == pytest.approx(1.0, abs=1e-5)
    assert teacher.metrics["neighbour_recall"] == 1.0
    assert student.metrics["neighbour_recall"] < 1.0
    assert student.metrics["params_m"] < teacher.metrics["params_m"]
    assert 0 < student.metrics["embedding_params_m"] < student.metrics["params_m"]


def test_teacher_vectors_come_from_the_store_when_it_holds_the_texts(report, setup):
    # Agreement uses store rows; STS pairs were put in the store, SST-2 and the clustering set were not.
    assert report.info["agreement"].startswith("320 rows of the store (of 320)")
    assert report.info["sts"].endswith("from the store")
    assert report.info["probe"].endswith("from the model")
    # The stored vectors give the same STS score as running the teacher now.
    live = evaluate(EvalConfig(teacher=f"tiny={setup['teacher']}", target="mean", measures=[Measure.sts],
                               max_pairs=STS_PAIRS, baseline=False, progress=False, cache=False))
    assert live.info["sts"].endswith("from the model")
    assert live.models[0].metrics["sts_spearman"] == pytest.approx(report.models[0].metrics["sts_spearman"],
                                                                   abs=1e-3)


def test_json_and_markdown_carry_the_numbers_of_the_table(report, setup):
    data = json.loads((setup["root"] / "report.json").read_text())
    md = (setup["root"] / "report.md").read_text().splitlines()
    header = [h.strip() for h in md[0].strip("|").split("|")]
    assert header[2:] == [c["header"] for c in data["columns"]]
    for i, m in enumerate(data["models"]):
        cells = [x.strip() for x in md[2 + i].strip("|").split("|")]
        assert cells[:2] == [m["name"], m["kind"]]
        for col, cell in zip(report.columns, cells[2:]):
            # a collapsed model (the 15-step BiLSTM here is one) carries its JSON reason beside one number
            cell = cell.removesuffix(f" (collapsed: {m['collapsed']})") if m["collapsed"] else cell
            assert cell == col.fmt.format(m["metrics"][col.key])  # same number, same rounding
            assert float(cell) == pytest.approx(m["metrics"][col.key], abs=0.51)
    assert data["models"][1]["details"]["cluster"]["threshold"] > 0


def test_plots_are_written(report, setup):
    pngs = sorted(p.name for p in (setup["root"] / "plots").iterdir() if not p.name.startswith("."))
    assert pngs == ["quality_speed.png", "sts_scatter.png"]  # beside them only their hidden kd sidecars
    assert all((setup["root"] / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_cli_prints_the_table_and_writes_json(setup, tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["eval", "--student", str(setup["student"]), "--store", str(setup["store"]),
                                   "--task", "sts", "--task", "agreement", "--max-pairs", "30", "--json", str(out),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "STS ρ×100" in res.output and "student" in res.output
    rows = json.loads(out.read_text())["models"]
    assert set(rows[0]["metrics"]) == {"sts_spearman", "cos_to_teacher"}


def test_students_are_scored_on_gold_labels_without_a_teacher(report, setup):
    """Issue 49: STS-B (and every gold-label task, and speed) needs no teacher; before, kd eval refused to run
    ("no teacher to compare with"). The student's score is the one it gets beside the teacher."""
    alone = evaluate(EvalConfig(students=[str(setup["student"])], measures=[Measure.sts, Measure.probe,
                                                                            Measure.speed],
                                max_pairs=STS_PAIRS, sts_split="dev", probe_train_rows=300, speed_b1=8, speed_big=64,
                                progress=False, cache=False))
    assert [(m.name, m.kind) for m in alone.models] == [("student", "student")]
    student = report.models[1]
    assert alone.models[0].metrics["sts_spearman"] == pytest.approx(student.metrics["sts_spearman"], abs=1e-9)
    assert alone.models[0].metrics["probe_accuracy"] == pytest.approx(student.metrics["probe_accuracy"], abs=1e-9)
    assert math.isfinite(alone.models[0].metrics["params_m"])
    assert alone.info["sts"].endswith("no teacher") and "baseline" in alone.info


def test_default_measures_without_a_teacher_leave_agreement_out_and_say_why(setup):
    res = CliRunner().invoke(app, ["eval", "--student", str(setup["student"]), "--max-pairs", "30",
                                   "--no-progress", "--no-baseline"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "STS ρ×100" in res.output and "cos to teacher" not in res.output
    assert "not run: agreement and neighbours compare with a teacher" in " ".join(res.output.split())


def test_cli_errors_are_clear(setup):
    res = CliRunner().invoke(app, ["eval", "--student", str(setup["student"]), "--task", "agreement"])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "--task agreement compares each student with a teacher" in out, out
    assert "--teacher" in out
    res = CliRunner().invoke(app, ["eval"])
    assert res.exit_code == 2 and "nothing to evaluate" in res.output
    res = CliRunner().invoke(app, ["eval", "--store", str(setup["store"]), "--task", "bogus"])
    assert res.exit_code == 2 and "bogus" in res.output


def test_pair_file_loader_reads_mrpc_and_index_columns():
    shared_file("mrpc", "msr_paraphrase_test.txt"), shared_file("stsb", "sts-dev.csv")  # read by path below
    mrpc = tasks.load_pairs("mrpc/msr_paraphrase_test.txt", "Quality")
    assert len(mrpc.a) == 1725 and set(np.unique(mrpc.scores)) == {0.0, 1.0}
    sts = tasks.load_pairs("stsb/sts-dev.csv", "4")
    ref = tasks.load_stsb("dev")
    assert sts.a == ref.a and sts.b == ref.b and np.array_equal(sts.scores, ref.scores)


def test_agreement_texts_with_a_store_is_refused_not_ignored(tmp_path):
    from kd.common.errors import InputError

    with pytest.raises(InputError, match="--agreement-texts is for runs without --store"):
        EvalConfig(store=str(tmp_path / "s"), agreement_texts=str(tmp_path / "t.txt"))


@pytest.mark.parametrize("case", ["one pair", "no texts"])
def test_too_few_pairs_or_texts_are_refused_not_scored_undefined(setup, tmp_path, case):
    """One scored pair or an empty --agreement-texts gave "—" with exit 0, blamed on constant vectors (the probe's
    I049, I053)."""
    teacher = f"tiny={setup['teacher']}"
    if case == "one pair":
        (tmp_path / "p.tsv").write_text("a\tb\tscore\nhello world\thi world\t3\n", encoding="utf-8")
        args = ["--pairs", str(tmp_path / "p.tsv"), "--text-columns", "a,b", "--score-column", "score", "--task", "sts"]
        expect = "a Spearman correlation needs at least 2"
    else:
        (tmp_path / "t.txt").write_text("\n  \n", encoding="utf-8")
        args = ["--agreement-texts", str(tmp_path / "t.txt"), "--task", "agreement"]
        expect = "agreement needs at least 2"
    res = CliRunner().invoke(app, ["eval", "--student", str(setup["student"]), "--teacher", teacher, *args,
                                   "--no-baseline", "--no-cache", "--no-progress"])
    assert res.exit_code == 2 and expect in res.output and "fix:" in res.output, res.output


@pytest.mark.parametrize("score, texts, says", [
    ("2", "a,b", "--score-column 2 is a column's index (a file without a header) and --text-columns a,b names"),
    ("score", "a,a", "--text-columns names the same column twice ('a,a')"),  # every pair a text with itself
    ("score", "a, a ", "--text-columns names the same column twice"),
    ("score", "0,1", "no column '0' (columns: ['a', 'b', 'score'])"),  # the re-probe: "KeyError: '0'" on row 2
    ("score", "A,a", "no column 'A'"),
])
def test_pair_columns_that_cannot_be_read_as_given_are_refused(setup, tmp_path, score, texts, says):
    """The seventh probe: an index score column with named text columns ended in int('a')'s traceback; the same
    column twice scored every pair as a text with itself ("undefined on these vectors", exit 0)."""
    pairs = tmp_path / "p.tsv"
    pairs.write_text("a\tb\tscore\nthe cat\ta dog\t1\nx y\tz w\t2\nmore words\tand more\t3\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["eval", "--student", str(setup["student"]), "--teacher", f"tiny={setup['teacher']}",
                                   "--pairs", str(pairs), "--text-columns", texts, "--score-column", score,
                                   "--task", "sts", "--no-baseline", "--no-cache", "--no-progress"])
    assert res.exit_code == 2 and says in res.output and "fix:" in res.output, res.output
