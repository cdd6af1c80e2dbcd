"""What a user sees (issue 40, "Output"): kd's own step lines for slow steps, none of transformers' and Hugging
Face's logs and bars unless --verbose, `kd info` readable at 80 columns, teacher-name errors that say what is
accepted and where kd looked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_tiny_bert
from rich.console import Console
from typer.testing import CliRunner

from kd.cli import app
from kd.common import quiet
from kd.common.errors import KdError
from kd.common.progress import Bar, showing, step, within
from kd.pipeline.teacher.resolve import resolve_teacher

HF_NOISE = ("LOAD REPORT", "Loading weights", "Writing model shards")


@pytest.fixture
def clean_env(monkeypatch):
    """The silencing writes environment variables: each test starts from none and leaves none behind."""
    for key in (*quiet._HF_ENV, quiet.VERBOSE_ENV):
        monkeypatch.delenv(key, raising=False)
    yield
    quiet._loud_imported()  # the next test sees the libraries' defaults again


# --- (1) step lines ------------------------------------------------------------------------------------------
def test_a_step_prints_a_start_and_a_done_line_when_progress_is_on(capsys):
    with step("unpacking mpnet"):
        pass
    err = capsys.readouterr().err
    assert "unpacking mpnet ..." in err and "unpacking mpnet: done in" in err


def test_a_bar_inside_a_step_of_a_whole_run_names_that_step(capsys):
    """kd distill's log: each training line says which step of the run it belongs to, not just "train"."""
    with within("[4/9] train stage six-layer"), Bar("train", total=10, unit="steps", every=0) as bar:
        bar.advance(5, loss=0.25)
    with Bar("train", total=10, unit="steps", every=0) as bar:  # outside: the bar's own label alone
        bar.advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("[4/9] train stage six-layer · train: 5/10 steps (50.0%)"), lines
    assert "loss 0.25" in lines[0] and lines[-1].startswith("train: 1/10 steps"), lines


def test_a_step_is_silent_when_progress_is_off(capsys):
    with step("unpacking mpnet", enabled=False):
        pass
    with showing(False), step("exporting"):
        pass
    assert capsys.readouterr().err == ""


def test_a_failed_step_has_no_done_line(capsys):
    with pytest.raises(RuntimeError), step("exporting"):
        raise RuntimeError("boom")
    assert "done" not in capsys.readouterr().err


def test_precompute_shows_loading_the_teacher_only_with_progress(tmp_path, tiny_teacher, sentences, capsys):
    from kd.pipeline.precompute import precompute

    src = tmp_path / "in.txt"
    src.write_text("\n".join(sentences[:6]) + "\n", encoding="utf-8")
    precompute([str(src)], str(tmp_path / "a"), [f"tiny={tiny_teacher}"], backend="torch", progress=True)
    assert "loading teacher tiny" in capsys.readouterr().err
    precompute([str(src)], str(tmp_path / "b"), [f"tiny={tiny_teacher}"], backend="torch", progress=False)
    assert "loading teacher" not in capsys.readouterr().err


# --- (2) Hugging Face's own output ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pooler_less(tmp_path_factory) -> Path:
    """A checkpoint without pooler weights, like all-mpnet-base-v2: AutoModel reports pooler.dense MISSING."""
    from transformers import BertConfig, BertModel

    path = build_tiny_bert(tmp_path_factory.mktemp("teachers") / "no-pooler")
    BertModel(BertConfig.from_pretrained(path), add_pooling_layer=False).save_pretrained(path)
    return path


def _kd(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (*quiet._HF_ENV, quiet.VERBOSE_ENV)}
    return subprocess.run([sys.executable, "-m", "kd", *args], capture_output=True, text=True, env=env, cwd=tmp,
                          timeout=300)


def test_kd_hides_transformers_load_report_unless_verbose(tmp_path, pooler_less):
    src = tmp_path / "in.txt"
    src.write_text("the market fell\nthe dog runs\n", encoding="utf-8")
    args = ["precompute", str(src), "-t", f"t={pooler_less}", "--backend", "torch", "--no-progress"]
    quiet_run = _kd(*args, "-o", str(tmp_path / "a"), tmp=tmp_path)
    assert quiet_run.returncode == 0, quiet_run.stderr
    assert not any(noise in quiet_run.stderr for noise in HF_NOISE), quiet_run.stderr
    loud = _kd("--verbose", *args, "-o", str(tmp_path / "b"), tmp=tmp_path)
    assert loud.returncode == 0, loud.stderr
    assert "LOAD REPORT" in loud.stderr and "pooler.dense.weight" in loud.stderr, loud.stderr


def test_hushed_libraries_write_no_model_shards_bar_and_verbose_restores_it(tmp_path, capfd, clean_env):
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=8))
    quiet.set_verbose(False)
    model.save_pretrained(tmp_path / "a")
    assert "Writing model shards" not in capfd.readouterr().err
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # children (Ray workers) inherit it
    quiet.set_verbose(True)
    model.save_pretrained(tmp_path / "b")
    assert "Writing model shards" in capfd.readouterr().err
    assert quiet.verbose()


# --- (3) kd info at 80 columns -------------------------------------------------------------------------------
LONG_BACKEND = (" openvino int8 (static) float32, min cosine 0.9912; auto: CPU, OpenVINO installed, its int8 "
                "dot products (VNNI) make static int8 the fastest recipe measured on this machine")


@pytest.fixture(scope="module")
def two_teacher_store(tmp_path_factory, tiny_teacher, sentences) -> Path:
    from kd.pipeline.precompute import precompute

    root = tmp_path_factory.mktemp("info80")
    src = root / "news.txt"
    src.write_text("\n".join(sentences[:12]) + "\n", encoding="utf-8")
    teachers = [f"tiny={tiny_teacher}", f"minilm-distilled-news-l6={tiny_teacher}"]
    precompute([str(src)], str(root / "store"), teachers, shard_rows=6, backend="torch", progress=False)
    return root / "store"


def test_kd_info_fits_80_columns(two_teacher_store, monkeypatch):
    import kd.storage.info as info
    from kd.storage.store import Store

    monkeypatch.setattr(info, "backend_details", lambda meta: LONG_BACKEND)
    console = Console(width=80, record=True)
    console.print(info.summary_table(str(two_teacher_store)))
    text = console.export_text()
    lines = text.splitlines()
    names = Store.open(str(two_teacher_store)).manifest.tables
    assert len(names) >= 3
    for name in names:  # whole, on one line: never "teachers/min…"
        assert any(name in line for line in lines), (name, text)
    assert "…" not in text and max(map(len, lines)) <= 80
    # the head (7 lines), the table (5 + one per table), each table's name, columns, model and backend (2 lines)
    assert len(lines) <= 12 + 6 * len(names), text
    assert "min cosine 0.9912" in text


def test_kd_info_cli_keeps_table_names_whole(two_teacher_store):
    res = CliRunner().invoke(app, ["info", str(two_teacher_store)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "teachers/minilm-distilled-news-l6" in res.output and "teachers/tiny" in res.output
    # the format version is the manifest's (a float store is version 1), not this kd's newest
    assert '"format_version": 1' in (two_teacher_store / "manifest.json").read_text()
    assert re.search(r"format version\s+1\b", res.output), res.output


# --- (4) teacher-name errors ---------------------------------------------------------------------------------
@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hf-hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_bert_base_missing_from_the_hf_cache_says_so_and_how_to_fix(empty_hf_cache):
    with pytest.raises(KdError) as e:
        resolve_teacher("bert-base")
    err = e.value
    assert "bert-base (bert-base-uncased) is not in the Hugging Face cache" in err.what
    assert "not an alias" not in str(err) and "unknown" not in str(err)
    assert str(empty_hf_cache) in err.where
    assert "Hugging Face cache" in err.fix and "--teacher bert-base=/path/to/bert-base-uncased" in err.fix


def test_an_unknown_teacher_lists_the_accepted_names_and_where_kd_looked(empty_hf_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KdError) as e:
        resolve_teacher("no-such-teacher")
    err = e.value
    assert "unknown teacher 'no-such-teacher'" in err.what
    assert str(tmp_path / "no-such-teacher") in err.where and str(empty_hf_cache) in err.where
    for accepted in ("minilm", "mpnet", "bert-base", "checkpoint folder", "NAME="):
        assert accepted in err.fix, accepted


def test_the_cli_prints_the_teacher_error_with_exit_2(empty_hf_cache, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("the market fell\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["precompute", str(src), "-t", "bert-base", "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and "is not in the Hugging Face cache" in res.output, res.output
    assert str(empty_hf_cache) in res.output and not (tmp_path / "o").exists()
