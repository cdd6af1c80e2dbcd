"""apps.distill.step_files: the one record of a step's files and the one comparison with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kd.apps.distill import step_files


def _run_folder(tmp_path: Path) -> tuple[Path, dict]:
    run = tmp_path / "run"
    (run / "stages" / "one" / "tokenizer").mkdir(parents=True)
    (run / "stages" / "one" / "config.json").write_text('{"hidden_act": "gelu"}\n')
    (run / "stages" / "one" / "tokenizer" / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}\n')
    (run / "stages" / "one" / ".kd-train.lock").write_text("")
    files = step_files.record(run, (run / "stages" / "one" / "config.json", run / "stages" / "one" / "tokenizer"))
    return run, {"files": {"train stage one": files}}


def test_a_record_names_every_file_with_its_sha256_and_reads_back(tmp_path: Path) -> None:
    run, state = _run_folder(tmp_path)
    files = state["files"]["train stage one"]
    assert sorted(files) == ["stages/one/config.json", "stages/one/tokenizer/tokenizer.json"]  # no dotfile
    assert all(len(sha) == 64 for sha in files.values())
    assert step_files.recorded(state, "train stage one") == files
    assert step_files.first_changed(run, files) is None
    assert step_files.recorded(state, "export") is None


def test_a_file_gone_is_found_before_any_file_is_hashed(tmp_path: Path) -> None:
    run, state = _run_folder(tmp_path)
    files = step_files.recorded(state, "train stage one")
    (run / "stages" / "one" / "config.json").write_text('{"hidden_act": "relu"}\n')
    assert step_files.first_changed(run, files) == (run / "stages/one/config.json", "is not as it was written")
    (run / "stages" / "one" / "tokenizer" / "tokenizer.json").unlink()  # recorded after config.json: found first
    assert step_files.first_changed(run, files) == (run / "stages/one/tokenizer/tokenizer.json", "is gone")
    (run / "stages" / "one" / "tokenizer" / "tokenizer.json").mkdir()  # a folder in its place is no file
    assert step_files.first_changed(run, files) == (run / "stages/one/tokenizer/tokenizer.json", "is gone")


def test_a_record_of_names_only_compares_by_name(tmp_path: Path) -> None:
    run, state = _run_folder(tmp_path)
    old = {"files": {"train stage one": sorted(state["files"]["train stage one"])}}  # a kd from before 2026-11-30
    files = step_files.recorded(old, "train stage one")
    assert set(files.values()) == {None}
    (run / "stages" / "one" / "config.json").write_text("{}\n")
    assert step_files.first_changed(run, files) is None
    (run / "stages" / "one" / "config.json").unlink()
    assert step_files.first_changed(run, files) == (run / "stages/one/config.json", "is gone")


@pytest.mark.parametrize("files", [
    {"../outside.txt": "0" * 64}, {"/etc/passwd": "0" * 64}, {"stages/one/config.json": 7}, {"": "0" * 64},
    ["stages/../../x"], "stages/one/config.json", None,
])
def test_a_record_kd_never_writes_is_no_record(files: object) -> None:
    assert not step_files.well_formed(files)
    assert step_files.recorded({"files": {"train stage one": files}}, "train stage one") is None
    assert step_files.recorded({"files": ["train stage one"]}, "train stage one") is None
