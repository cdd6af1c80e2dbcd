"""`kd eval`'s and `kd demo`'s tables fit an 80-column terminal (issue 49), every value whole.

Before, rich squeezed the 11 columns of the default measures into 80 by cutting every cell: "82.…", "all…".
Now the table splits into several (the model and kind columns repeated), headers one word a line.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kd.apps.demo import run as demo
from kd.apps.eval import run as E
from kd.apps.eval.config import DEFAULT_MEASURES, SUITE, Measure
from kd.apps.eval.run import COLUMNS, EvalReport, ModelResult
from kd.cli import app

VALUES = dict(sts_spearman=82.13, mrpc_accuracy=71.42, mrpc_f1=80.95, lee_pearson=64.31, probe_accuracy=79.82,
              cluster_f1=41.07, documents_f1=36.52, retrieval_recall=0.873, retrieval_mrr=0.701,
              cos_to_teacher=0.912, neighbour_recall=0.634, sent_per_s_b1=84.0, sent_per_s_b256=412.0,
              latency_ms=11.9, params_m=22.71, embedding_params_m=11.72, disk_mb=90.9)


def _report(measures) -> EvalReport:
    cols = [c for c in COLUMNS if c.measure in measures]
    models = [ModelResult("all-MiniLM-L6-v2", "teacher"), ModelResult("static-student-8k", "student"),
              ModelResult("bilstm-512", "student"), ModelResult("model2vec (potion-base-8M)", "baseline")]
    for m in models:
        m.metrics.update(VALUES)
    models[2].metrics["lee_pearson"] = None
    models[2].empty["lee_pearson"] = "not measured: the student has no word pieces"
    return EvalReport(models, cols, {"sts": "stsb dev, 1500 pairs, teacher vectors from the cache"})


def _check(output: str, report: EvalReport) -> None:
    lines = output.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n" + output
    assert "…" not in output, "\n" + output
    for m in report.models:  # every value whole, every model named whole
        assert any(m.name in line for line in lines), m.name
        for c in report.columns:
            assert report.cell(m, c) in output, (m.name, c.header)


@pytest.mark.parametrize("measures", [DEFAULT_MEASURES, (*SUITE, Measure.speed)], ids=["default", "suite"])
def test_eval_table_fits_80_columns(monkeypatch, measures):
    report = _report(measures)
    monkeypatch.setattr(E, "evaluate", lambda cfg: report)
    res = CliRunner().invoke(app, ["eval", "--student", "s", "--teacher", "t"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    _check(res.output, report)


def test_demo_table_fits_80_columns(monkeypatch, tmp_path):
    report = _report([Measure.sts, Measure.speed])
    result = demo.DemoResult(tmp_path, tmp_path / "store", {"static": tmp_path, "bilstm": tmp_path}, report,
                             "static", {"precompute": 31.0, "train": 95.0, "eval": 40.0})
    monkeypatch.setattr(demo, "run_demo", lambda cfg: result)
    res = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "demo")], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    table = res.output[:res.output.index("demo finished")]  # the closing line is prose, soft-wrapped
    _check(table, report)


def test_a_wide_terminal_keeps_one_table():
    from rich.console import Console
    from rich.table import Table

    assert isinstance(_report(DEFAULT_MEASURES).rich_table(200), Table)
    assert Console(width=200).measure(_report(DEFAULT_MEASURES).rich_table(200)).maximum <= 200
