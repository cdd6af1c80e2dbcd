"""The cross-teacher tests' teachers and store (module fixtures: a test module takes one by assigning it to a name of
its own, and builds its own), and the train-student command they train on it with.

The store: real news sentences through two tiny random BERTs of different widths and vocabularies,
"small" (32-d, 2 layers, the init output) and "big" (48-d, 3 layers, extra words in its vocabulary).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import Result
from conftest import build_tiny_bert
from typer.testing import CliRunner

from kd.cli import app
from kd.pipeline.precompute import precompute


@pytest.fixture(scope="module")
def teachers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """"small" and "big": two tiny random BERTs of different widths, depths and vocabularies."""
    root = tmp_path_factory.mktemp("xteachers")
    return {"small": build_tiny_bert(root / "small"),
            "big": build_tiny_bert(root / "big", hidden=48, layers=3, seed=3, extra_words=("stocks", "##ing"))}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, teachers: dict[str, Path], sentences: list[str]) -> Path:
    """160 news sentences through both teachers, in 2 shards, and small's init output (layers 0 and 1)."""
    root = tmp_path_factory.mktemp("xstore")
    (root / "news.txt").write_text("\n".join(sentences[:160]) + "\n", encoding="utf-8")
    specs = [f"{k}={v}" for k, v in teachers.items()]
    precompute([str(root / "news.txt")], str(root / "store"), specs, shard_rows=80, progress=False)
    s = precompute([str(root / "news.txt")], str(root / "store"), [specs[0]], outputs=["init"], keep_layers="0,1",
                   shard_rows=80, progress=False)
    assert s.shards_written == 0 and s.vocab_written == ["small layers 0,1"]
    return root / "store"


def train(store: Path, out: Path, *args: str, steps: int = 30) -> Result:
    """`kd train-student` on `store` into `out` for `steps` steps, no validation split; `args` added."""
    return CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(out), "--max-steps",
                                    str(steps), "--val-percent", "0", "--batch-size", "16", "--log-every", "1",
                                    "--no-progress", *args])
