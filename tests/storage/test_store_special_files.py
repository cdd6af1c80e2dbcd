"""A store file that is a named pipe or a device is refused before it is opened (issue 48's third probe: a FIFO in
place of a shard or manifest.json blocked every reader forever; /dev/zero was read until memory ran out)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

READERS = {"validate": ["validate", "{s}"], "query": ["query", "{s}", "SELECT count(*) FROM texts"],
           "info": ["info", "{s}"]}


@pytest.fixture(scope="module")
def real(tmp_path_factory, tiny_teacher, sentences) -> Path:
    from kd.pipeline.precompute import precompute

    root = tmp_path_factory.mktemp("special")
    (root / "news.txt").write_text("\n".join(sentences[:60]) + "\n", encoding="utf-8")
    precompute([str(root / "news.txt")], str(root / "store"), [f"tiny={tiny_teacher}"], outputs=["mean"],
               shard_rows=30, progress=False)
    return root / "store"


def _kd(args: list[str]) -> subprocess.CompletedProcess:
    # a subprocess with a timeout: on the old code the FIFO cases block in open() and this fails instead of hanging
    return subprocess.run([sys.executable, "-m", "kd", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def _replace(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("where", ["shard", "manifest"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_pipe_or_device_in_a_store_is_refused_unopened(real, tmp_path, kind, where, reader):
    store = Path(shutil.copytree(real, tmp_path / "s"))
    target = store / ("manifest.json" if where == "manifest" else "teachers/tiny/part-00001.parquet")
    if where == "manifest":  # the fragments would rebuild the manifest: leave only the one file
        shutil.rmtree(store / "manifests")
    _replace(target, kind)
    res = _kd([a.format(s=store) for a in READERS[reader]])
    out = res.stdout + res.stderr
    if where == "shard" and reader == "info":  # info reads the manifest alone: nothing to refuse, nothing blocked
        assert res.returncode == 0, out
        return
    assert res.returncode in (1, 2) if reader == "validate" else res.returncode == 2, out  # validate: 1 = problems
    assert "Traceback" not in out and ("not a regular file" in out or "named pipe" in out or "device" in out), out


@pytest.mark.parametrize("value", [10**9, -1, "12", True])
def test_a_teacher_config_of_an_impossible_shape_is_refused_before_it_is_built(tmp_path, tiny_teacher, value):
    """transformers builds every layer config.json names before reading the weights: 1e9 layers never returned."""
    import json

    teacher = Path(shutil.copytree(tiny_teacher, tmp_path / "t"))
    cfg = json.loads((teacher / "config.json").read_text())
    cfg["num_hidden_layers"] = value
    (teacher / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "in.txt").write_text("The market fell sharply on Monday.\nRain is expected later.\n")
    res = _kd(["precompute", str(tmp_path / "in.txt"), "-t", f"t={teacher}", "--backend", "torch", "-o",
               str(tmp_path / "out"), "--no-progress"])
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "num_hidden_layers" in out and "config.json" in out and "Traceback" not in out, out
    assert not (tmp_path / "out").exists()
