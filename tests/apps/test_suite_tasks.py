"""The `kd eval` suite beyond STS-B (issue 39): MRPC, Lee, title retrieval: loaders, metrics, the suite run."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from conftest import shared_file
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store
from typer.testing import CliRunner

from kd.apps.eval import metrics, tasks
from kd.apps.eval.run import COLUMNS, SUITE, EvalConfig, Measure, evaluate, expand_measures
from kd.cli import app
from kd.common.errors import InputError

SUITE_KEYS = [c.key for c in COLUMNS if c.measure in SUITE]


@pytest.fixture
def no_shared(tmp_path, monkeypatch):
    """KD_SHARED points to an empty folder: only the bundled sets exist."""
    monkeypatch.setenv("KD_SHARED", str(tmp_path))
    monkeypatch.chdir(tmp_path)


# --- loaders ----------------------------------------------------------------------------------------------------

def test_lee_is_50_documents_and_a_symmetric_human_matrix(no_shared):
    lee = tasks.load_lee()
    assert len(lee.docs) == 50 and all(len(d) > 200 for d in lee.docs)
    assert lee.sims.shape == (50, 50) and np.array_equal(lee.sims, lee.sims.T)
    assert np.all(np.diag(lee.sims) == 1.0) and lee.sims.min() >= 0.0 and lee.sims.max() <= 1.0
    assert lee.sims[1, 0] == lee.sims[0, 1] > 0  # the file's lower triangle is 0: it was filled from the upper


def test_mrpc_splits_have_the_documented_sizes():
    shared_file("mrpc", "msr_paraphrase_train.txt")
    train, test = tasks.load_mrpc("train"), tasks.load_mrpc("test")
    assert (len(train.a), len(test.a)) == (4076, 1725) and len(train.b) == 4076
    assert set(train.scores) == {0.0, 1.0} and 0.6 < train.scores.mean() < 0.7  # 68 % paraphrases
    with pytest.raises(InputError, match="unknown MRPC split"):
        tasks.load_mrpc("dev")


def test_mrpc_without_shared_data_says_where_to_point(no_shared):
    with pytest.raises(InputError, match="data file not found") as e:
        tasks.load_mrpc("test")
    assert "KD_SHARED" in str(e.value)


def test_retrieval_sample_is_bundled_distinct_and_prefix_stable(no_shared):
    r = tasks.load_title_retrieval()
    assert len(r.queries) == len(r.docs) == tasks.RETRIEVAL_ARTICLES == 1000
    assert len(set(r.queries)) == 1000 and len(set(r.docs)) == 1000
    assert all(q.strip() for q in r.queries) and min(len(d) for d in r.docs) >= tasks.RETRIEVAL_MIN_LEAD
    assert tasks.load_title_retrieval(100) == r.head(100)  # a smaller sample is a prefix: no shared data needed
    with pytest.raises(InputError, match="data file not found"):
        tasks.load_title_retrieval(1001)  # beyond the bundle: the shared corpus


def test_bundled_suite_sets_equal_what_the_shared_data_gives():
    shared_file("lee-docsim", "lee.cor")
    news = shared_file("corpus", "news_articles.csv")
    lee, lee_shared = tasks.load_lee(), tasks.load_lee(bundle=False)
    assert lee.docs == lee_shared.docs and np.array_equal(lee.sims, lee_shared.sims)
    r = tasks.load_title_retrieval()
    assert r == tasks.load_title_retrieval(bundle=False)
    # Each title's document is its own article's lead: the relevance is the data's, not a model's.
    with open(news, encoding="utf-8", newline="") as f:
        text = {" ".join(row["title"].replace('"?', '"').split()): " ".join(row["text"].replace('"?', '"').split())
                for row in csv.DictReader(f)}
    assert all(text[q].startswith(d[:80]) for q, d in zip(r.queries, r.docs))


# --- metrics ----------------------------------------------------------------------------------------------------

def test_a_perfect_retriever_scores_one():
    x = np.random.default_rng(0).normal(size=(30, 8))
    s = metrics.retrieval_scores(x, x.copy(), k=10)
    assert (s.recall_at_k, s.mrr) == (1.0, 1.0)


def test_retrieval_ranks_are_counted_by_hand():
    docs = np.eye(3)
    queries = np.array([[0.5, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # query 0's document ranks second
    s = metrics.retrieval_scores(queries, docs, k=1)
    assert s.recall_at_k == pytest.approx(2 / 3) and s.mrr == pytest.approx((0.5 + 1 + 1) / 3)
    assert metrics.retrieval_scores(queries, docs, k=2).recall_at_k == 1.0


def test_a_collapsed_model_ranks_last_not_first():
    same = np.ones((20, 4))
    s = metrics.retrieval_scores(same, same, k=10)
    assert s.recall_at_k == 0.0 and s.mrr == pytest.approx(1 / 20)
    bad = same.copy()
    bad[3, 0] = np.nan
    assert math.isnan(metrics.retrieval_scores(bad, same).mrr)


def test_threshold_classifier_on_separable_scores_is_perfect():
    sims = np.array([0.9, 0.85, 0.8, 0.3, 0.2, 0.1])
    y = np.array([1, 1, 1, 0, 0, 0])
    t = metrics.best_threshold(sims, y)
    assert 0.3 < t < 0.8
    res = metrics.pair_classification(sims, y, sims[::-1], y[::-1])
    assert (res.train_accuracy, res.accuracy, res.f1) == (100.0, 100.0, 100.0)


def test_threshold_is_chosen_on_train_not_test():
    train = np.array([0.9, 0.6, 0.4, 0.1])  # separable anywhere in (0.4, 0.6): the midpoint 0.5
    test = np.array([0.45, 0.9, 0.2, 0.3])  # separable at 0.4, but the train threshold misses the 0.45 paraphrase
    y = np.array([1, 1, 0, 0])
    res = metrics.pair_classification(train, y, test, y)
    assert res.threshold == pytest.approx(0.5)
    assert res.accuracy == pytest.approx(75.0) and res.f1 == pytest.approx(200 / 3)


def test_tied_similarities_are_never_split():
    t = metrics.best_threshold(np.array([0.5, 0.5, 0.5, 0.1]), np.array([1, 0, 1, 0]))
    assert 0.1 < t <= 0.5  # all three tied pairs positive (3 of 4 right); no cut can split them
    assert metrics.binary_f1(np.array([1, 1, 0, 0]), np.array([1, 0, 1, 0])) == pytest.approx(0.5)
    assert metrics.binary_f1(np.zeros(3), np.zeros(3)) == 0.0


def test_matrix_pearson_on_known_matrices():
    x = np.random.default_rng(1).normal(size=(12, 5))
    cos = metrics.cosine_matrix(x, x)
    assert metrics.matrix_pearson(x, cos) == pytest.approx(100.0)
    assert metrics.matrix_pearson(x, -cos) == pytest.approx(-100.0)
    lower_only = np.tril(np.random.default_rng(2).normal(size=(12, 12)), -1)
    assert metrics.matrix_pearson(x, lower_only + cos) == pytest.approx(100.0)  # only the upper triangle is read
    assert math.isnan(metrics.matrix_pearson(np.ones((12, 5)), cos))  # constant similarities: undefined


def test_brown_documents_are_whole_files_past_every_models_length_grouped_by_genre(no_shared):
    """The long-document task: one document a Brown file, 400+ words (~520 tokens: every model truncates), files
    split 1:2 into dev and test by a seed, each split holding all 15 genres, no file on both sides."""
    docs = tasks.load_cluster_set(tasks.ClusterSet.brown_documents)
    assert (len(docs.dev_texts), len(docs.test_texts)) == (167, 333)  # the Brown corpus' 500 files
    assert len(set(docs.dev_groups)) == len(set(docs.test_groups)) == 15
    words = [len(t.split()) for t in docs.dev_texts + docs.test_texts]
    assert min(words) >= tasks.DOCUMENT_WORDS and max(words) < tasks.DOCUMENT_WORDS + 100  # whole sentences
    assert not set(docs.dev_texts) & set(docs.test_texts)
    passages = tasks.load_cluster_set(tasks.ClusterSet.brown_genres)  # the passages' set is unchanged by it
    assert (len(passages.dev_texts), len(passages.test_texts)) == (668, 1332)


# --- the suite in kd eval -----------------------------------------------------------------------------------------

def test_suite_expands_to_its_measures_in_order():
    assert expand_measures([Measure.speed, "suite", Measure.sts]) == [Measure.speed, *SUITE]
    assert SUITE_KEYS == ["sts_spearman", "mrpc_accuracy", "mrpc_f1", "lee_pearson", "probe_accuracy",
                          "cluster_f1", "documents_f1", "retrieval_recall", "retrieval_mrr"]


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    from kd.student.trainer import TrainConfig, train

    root = tmp_path_factory.mktemp("suite")
    store = make_store(root / "store", rows=60, shards=1, tmp=root)
    return train(TrainConfig(str(store), str(root / "bilstm"), embed_dim=16, hidden_dim=16, max_steps=3,
                             batch_size=16, progress=False))


def test_suite_reports_every_column_beside_the_teacher_and_mrpc_as_not_run(no_shared, tiny_teacher, student,
                                                                           tmp_path):
    cfg = EvalConfig(students=[str(student)], teacher=f"tiny={tiny_teacher}", measures=[Measure.suite],
                     max_pairs=40, retrieval_articles=60, baseline=False, progress=False,
                     markdown_path=str(tmp_path / "r.md"))
    report = evaluate(cfg)
    assert [c.key for c in report.columns] == SUITE_KEYS
    assert [(m.name, m.kind) for m in report.models] == [("tiny", "teacher"), ("bilstm", "student")]
    for m in report.models:
        for key in SUITE_KEYS:
            if key.startswith("mrpc"):
                assert key not in m.metrics
                assert report.cell(m, next(c for c in COLUMNS if c.key == key)).startswith("— [")
            else:
                assert math.isfinite(m.metrics[key]), (m.name, key)
        assert 0.0 <= m.metrics["retrieval_recall"] <= 1.0 and 1 / 60 <= m.metrics["retrieval_mrr"] <= 1.0
        assert m.details["mrpc"].startswith("not run: MRPC data not found")
        assert (m.name, m.details["mrpc"]) in report.empty_notes()
    assert "stsb-test, 40 pairs" in report.info["sts"]  # the suite's STS is the test split
    assert "60 news titles" in report.info["retrieval"]
    md = (tmp_path / "r.md").read_text()
    assert "KD_SHARED" in md and "— [1]" in md


def test_mrpc_runs_on_the_shared_data(tiny_teacher):
    shared_file("mrpc", "msr_paraphrase_test.txt")
    report = evaluate(EvalConfig(teacher=f"tiny={tiny_teacher}", measures=[Measure.mrpc], max_pairs=50,
                                 baseline=False, progress=False))
    (teacher,) = report.models
    assert 0.0 <= teacher.metrics["mrpc_accuracy"] <= 100.0 and 0.0 <= teacher.metrics["mrpc_f1"] <= 100.0
    assert teacher.details["mrpc"]["train_accuracy"] >= 50.0  # the best cut is at least "all one class"
    assert "50 train pairs" in report.info["mrpc"] and "50 test pairs" in report.info["mrpc"]


def test_cli_runs_lee_and_reports_mrpc_as_not_run(no_shared, tiny_teacher, tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["eval", "--teacher", f"tiny={tiny_teacher}", "--task", "lee", "--task", "mrpc",
                                   "--no-baseline", "--no-progress", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "MRPC data not found" in res.output
    (row,) = json.loads(out.read_text())["models"]
    assert math.isfinite(row["metrics"]["lee_pearson"]) and "mrpc_accuracy" not in row["metrics"]
    assert "KD_SHARED" in row["details"]["mrpc"]
