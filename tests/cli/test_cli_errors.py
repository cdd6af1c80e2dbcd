"""Every option a user can get wrong: exit code 2, a message naming the option, nothing written."""

from __future__ import annotations

import pytest
import torch
from conftest import precompute_news
from typer.testing import CliRunner

from kd.cli import app
from kd.common.hardware import resolve_device


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_teacher, sentences):
    return precompute_news(tmp_path_factory.mktemp("cli"), tiny_teacher, sentences, 60, 30)


@pytest.mark.parametrize("flag,value", [("--shard-rows", "0"), ("--shard-rows", "-5"), ("--max-length", "0"),
                                        ("--num-shards", "0"), ("--batch-tokens", "0")])
def test_precompute_refuses_bad_numbers_before_writing(tmp_path, tiny_teacher, flag, value):
    src = tmp_path / "in.txt"
    src.write_text("the market fell\nthe dog runs\n")
    out = tmp_path / "out"
    res = _run("precompute", str(src), "-t", str(tiny_teacher), "-o", str(out), flag, value, "--no-progress")
    assert res.exit_code == 2 and flag.lstrip("-").split("-")[0] in res.output, res.output
    assert not out.exists()


def test_precompute_refuses_a_file_as_out_and_a_dotdot_teacher(tmp_path, tiny_teacher):
    src = tmp_path / "in.txt"
    src.write_text("the market fell\n")
    res = _run("precompute", str(src), "-t", str(tiny_teacher), "-o", str(src), "--no-progress")
    assert res.exit_code == 2 and "existing file" in res.output and src.read_text() == "the market fell\n"
    res = _run("precompute", str(src), "-t", f"..={tiny_teacher}", "-o", str(tmp_path / "o"), "--no-progress")
    assert res.exit_code == 2 and "invalid teacher name" in res.output and not (tmp_path / "o").exists()


def test_cuda_without_cuda(tmp_path, tiny_teacher, store, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    src = tmp_path / "in.txt"
    src.write_text("the market fell\n")
    res = _run("precompute", str(src), "-t", str(tiny_teacher), "-o", str(tmp_path / "o"), "--device", "cuda",
               "--no-progress")
    assert res.exit_code == 2 and "no CUDA device" in res.output
    res = _run("train-student", "--shards", str(store), "--out", str(tmp_path / "s"), "--device", "cuda",
               "--max-steps", "1", "--no-progress")
    assert res.exit_code == 2 and "no CUDA device" in res.output


def test_each_torchrun_rank_takes_its_own_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    for local, want in (("0", "cuda:0"), ("3", "cuda:3"), ("5", "cuda:1")):
        monkeypatch.setenv("LOCAL_RANK", local)
        assert str(resolve_device(None)) == want
    monkeypatch.delenv("LOCAL_RANK")
    assert str(resolve_device(None)) == "cuda:0" and str(resolve_device("cpu")) == "cpu"


def test_train_student_refuses_bad_percentages(store, tmp_path):
    for v in ("-5", "100", "250"):
        res = _run("train-student", "--shards", str(store), "--out", str(tmp_path / "s"), "--val-percent", v,
                   "--no-progress")
        assert res.exit_code == 2 and "--val-percent" in res.output
    assert not (tmp_path / "s").exists()


def test_index_and_search_arguments(store):
    res = _run("index", str(store), "--table", "tiny", "--column", "mean", "--kind", "bogus")
    assert res.exit_code == 2 and "'--kind'" in res.output and "'hnsw'" in res.output  # refused at parse time
    res = _run("search", str(store), "stocks", "--teacher", "tiny", "-k", "0")
    assert res.exit_code == 2 and "'-k'" in res.output


def test_index_without_table_or_column_picks_the_teachers_default(store):
    res = _run("index", str(store))
    assert res.exit_code == 0, res.output
    assert "teachers/tiny.mean" in res.output  # the tiny teacher has no sentence output: mean
    res = _run("index", str(store), "--column", "cls")
    assert res.exit_code == 0 and "teachers/tiny.cls" in res.output


def test_a_store_given_relative_then_absolute_is_the_same_store(tmp_path, tiny_teacher, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("the market fell\nthe dog runs\nprices rose\n")
    monkeypatch.chdir(tmp_path)
    first = _run("precompute", "in.txt", "-t", str(tiny_teacher), "-o", "st", "--no-progress")
    assert first.exit_code == 0, first.output
    again = _run("precompute", str(src), "-t", str(tiny_teacher), "-o", str(tmp_path / "st"), "--no-progress")
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output


@pytest.mark.parametrize("extra", [[], ["--kd-store", "STORE"]])
def test_finetune_kd_alpha_needs_a_store_and_a_value_in_0_1(tmp_path, extra):
    out = tmp_path / "ft"
    args = ["finetune", "--student", str(tmp_path / "s"), "--task", "classification", "--train", "t.tsv",
            "--out", str(out), "--kd-alpha", "1.5" if extra else "0.5", *extra]
    res = _run(*args)
    assert res.exit_code == 2 and "--kd-alpha" in res.output, res.output
    assert not out.exists()
