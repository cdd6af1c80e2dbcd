"""`kd demo --quick`: the real MiniLM teacher, precompute -> train-student -> eval, in one folder (< 3 min)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from kd.cli import app
from kd.storage.validate import check


@pytest.mark.slow
def test_quick_demo_runs_the_whole_workflow(tmp_path, monkeypatch):
    out = tmp_path / "demo"
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))  # busy: the demo runs at 1 thread
    threads = torch.get_num_threads()
    res = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    # and leaves the process's count as it found it: a stage's key holds it (apps.distill.shared_stages), and a
    # demo that left 1 made the distill tests after it in the suite key their stages unlike the runs they had trained
    assert torch.get_num_threads() == threads
    assert str(out) in res.output.replace("\n", "")  # the folder is named at the end
    for part in ("corpus/leipzig-news.txt", "store/manifest.json", "students/static/model.safetensors",
                 "students/bilstm/model.safetensors", "report.json", "report.md", "plots/sts_scatter.png",
                 "plots/quality_speed.png"):
        assert (out / part).exists(), part
    assert check(str(out / "store"))[1] == []  # a valid store
    report = json.loads((out / "report.json").read_text())
    rows = {m["name"]: m["metrics"] for m in report["models"]}
    assert set(rows) == {"minilm", "static", "bilstm"}
    # MiniLM on the first 200 STS-B dev pairs (easy captions) scores ~93; 30-step students are well below.
    assert rows["minilm"]["sts_spearman"] > 85
    for tier in ("static", "bilstm"):
        assert 0 < rows[tier]["sts_spearman"] < rows["minilm"]["sts_spearman"]
        assert rows[tier]["sent_per_s_b256"] > rows["minilm"]["sent_per_s_b256"]
        assert rows[tier]["params_m"] < rows["minilm"]["params_m"]
        assert f"{rows[tier]['sts_spearman']:.2f}" in (out / "report.md").read_text()
    best = max(("static", "bilstm"), key=lambda t: rows[t]["sts_spearman"])
    said = " ".join(res.output.split())
    assert report["info"]["demo_pick"] == best and f"best STS-B dev: the {best} student" in said
    # `kd demo` after `kd demo --quick` in one folder: its corpus was rewritten and its store refused the run (exit
    # 2, a fix about --add-to); the quick students would have been kept as the full demo's. Refused before any work
    # now, naming the sizes; by default the two never share a folder.
    weights = {t: (out / "students" / t / "model.safetensors").read_bytes() for t in ("static", "bilstm")}
    res = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), "--no-progress"])  # the same: reused
    assert res.exit_code == 0 and res.output.count("nothing to do") == 2, res.output
    assert {t: (out / "students" / t / "model.safetensors").read_bytes() for t in weights} == weights
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".kd-" not in p.name}
    res = CliRunner().invoke(app, ["demo", "--out", str(out), "--no-progress"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "a kd demo of another corpus size (400 sentences there, 6,000 now)" in said, said
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".kd-" not in p.name} == before
    # a demo file edited in another encoding: refused naming it (it was a UnicodeDecodeError naming no file)
    news = out / "corpus" / "leipzig-news.txt"
    kept = news.read_bytes()
    news.write_bytes(kept.replace(b"e", b"\xe9", 1))
    before[news] = news.read_bytes()
    res = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), "--no-progress"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "whose corpus was edited (leipzig-news.txt)" in said, said
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".kd-" not in p.name} == before
    news.write_bytes(kept)
    before[news] = kept
    (out / "corpus" / "wordnet-glosses.txt").unlink()  # (it was "another corpus size")
    del before[out / "corpus" / "wordnet-glosses.txt"]
    res = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), "--no-progress"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "whose corpus lacks wordnet-glosses.txt" in said, said
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".kd-" not in p.name} == before
    (out / "corpus").rename(out / "kept")  # corpus/ a file: a FileExistsError traceback, --overwrite too (a probe)
    (out / "corpus").write_text("mine")
    for extra in ([], ["--overwrite"]):
        res = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), "--no-progress", *extra])
        said = " ".join(res.output.split())
        assert res.exit_code == 2 and "the demo's corpus/ is not a folder here" in said, said
    assert (out / "corpus").read_text() == "mine"
    from kd.apps.demo.config import DemoConfig

    assert (DemoConfig().out, DemoConfig(quick=True).out) == ("kd-demo", "kd-demo-quick")


def test_demo_checks_its_inputs_before_any_stage(tmp_path, monkeypatch):
    """A missing evaluation set stops the demo at once with exit 2, before a store is written."""
    from kd.apps.eval import tasks

    monkeypatch.setattr(tasks, "BUNDLE", tmp_path / "no-bundle")
    monkeypatch.setenv("KD_SHARED", str(tmp_path / "no-shared"))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "demo"
    res = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "data file not found" in res.output and "stsb/sts-dev.csv" in res.output
    assert not (out / "store").exists()


def test_demo_refuses_a_file_as_output(tmp_path):
    f = tmp_path / "taken"
    f.write_text("mine")
    res = CliRunner().invoke(app, ["demo", "--quick", "--out", str(f), "--no-progress"])
    assert res.exit_code == 2 and "not a folder" in res.output
    assert f.read_text() == "mine"


def test_quick_demo_refuses_epochs_it_would_not_train(tmp_path):
    """--quick trains a fixed 30 steps: `--epochs 2` beside it was dropped without a word (a probe)."""
    out = tmp_path / "demo"
    res = CliRunner().invoke(app, ["demo", "--quick", "--epochs", "2", "--out", str(out), "--no-progress"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "--epochs 2 with --quick" in said and "drop --quick" in said, said
    assert not out.exists()
