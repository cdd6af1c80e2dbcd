"""Forging a real store the way an attacker with write access would (issue 48 probe): change a shard's values or a
recorded file, then re-forge every checksum, size and ids digest in manifest.json and every fragment, so that only
the check under test can catch the change. Shared by the reliability tests of stores and their readers."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kd.cli import app
from kd.storage import fs
from kd.storage.alignment import table_digest

TEACHER = "teachers/tiny"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, tiny_teacher: Path, sentences: list[str]) -> Path:
    """The module's sound store (real_store), built once: a test module takes it as `real = store_forgery.real`."""
    return real_store(tmp_path_factory.mktemp("forgery"), tiny_teacher, sentences)


@pytest.fixture
def store(real: Path, tmp_path: Path) -> Path:
    """A copy of `real` for one test to forge."""
    return Path(shutil.copytree(real, tmp_path / "store"))


def real_store(root: Path, teacher: Path, sentences: list[str]) -> Path:
    """The sound store every forgery starts from: 90 news sentences, 3 shards, cls + mean + vocab of `teacher`."""
    from kd.pipeline.precompute import precompute

    (root / "news.txt").write_text("\n".join(sentences[:90]) + "\n", encoding="utf-8")
    precompute([str(root / "news.txt")], str(root / "store"), [f"tiny={teacher}"], shard_rows=30,
               outputs=["cls", "mean", "vocab"], progress=False)
    return root / "store"


def init_store(tmp_path: Path, teacher: Path, sentences: list[str]) -> Path:
    """A sound store holding `teacher`'s init output (what a transformer-init student starts from): 60 sentences."""
    from kd.pipeline.precompute import precompute

    corpus = tmp_path / "news.txt"
    corpus.write_text("\n".join(sentences[:60]) + "\n", encoding="utf-8")
    precompute([str(corpus)], str(tmp_path / "store"), [f"tiny={teacher}"], shard_rows=30, outputs=["mean", "init"],
               progress=False)
    return tmp_path / "store"


def manifests(store: Path) -> list[Path]:
    return [store / "manifest.json", *sorted((store / "manifests").glob("*.json"))]


def edit_manifests(store: Path, edit: Callable[[dict], None]) -> None:
    """Apply `edit` to manifest.json and every fragment alike (so they still merge)."""
    for p in manifests(store):
        d = json.loads(p.read_text())
        edit(d)
        p.write_text(json.dumps(d, indent=1))


def rewrite_shard(store: Path, table: str, k: int, change: Callable[[pa.Table], pa.Table], rows: bool = False) -> None:
    """Shard k of `table` rewritten by `change`, its bytes, sha256 and ids digest re-forged in every manifest
    (`rows`: its row count too)."""
    path = store / f"{table}/part-{k:05d}.parquet"
    new = change(pq.read_table(path))
    write_forged(store, table, k, fs.parquet_bytes(new), new, rows)


def write_forged(store: Path, table: str, k: int, data: bytes, new: pa.Table, rows: bool = False) -> None:
    """`data` (the Parquet bytes of `new`) as shard k of `table`, every manifest's record of it re-forged."""
    (store / f"{table}/part-{k:05d}.parquet").write_bytes(data)

    def fix(d: dict) -> None:
        rec = d["tables"].get(table)
        if rec is None or str(k) not in rec["shards"]:
            return
        rec["shards"][str(k)].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                                     **({"rows": new.num_rows} if rows else {}))
        if str(k) in rec.get("ids", {}):
            rec["ids"][str(k)] = table_digest(new)

    edit_manifests(store, fix)


def swap_text(store: Path, row: int, text: str) -> None:
    """Texts shard 0's row `row` holds `text`, its id (and every digest) kept: an id no longer its text's hash."""
    def swap(t: pa.Table) -> pa.Table:
        texts = t["text"].to_pylist()
        texts[row] = text
        return set_column(t, "text", texts)

    rewrite_shard(store, "texts", 0, swap)


def rewrite_file(store: Path, rel: str, data: bytes) -> None:
    """A file the manifest records a sha256 for (`extras.files`), replaced and its sha256 re-forged."""
    (store / rel).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    edit_manifests(store, lambda d: d["extras"].get("files", {}).__setitem__(rel, sha)
                   if rel in d["extras"].get("files", {}) else None)


def set_column(table: pa.Table, column: str, values: list | pa.Array) -> pa.Table:
    """`table` with `column` replaced (its field, and so its type and nullability, kept)."""
    i = table.column_names.index(column)
    return table.set_column(i, table.schema.field(i), pa.array(values, type=table.schema.field(i).type)
                            if isinstance(values, list) else values)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def validate(store: Path):
    return CliRunner().invoke(app, ["validate", str(store)])


def train(store: Path, out: Path, *args: str):
    return CliRunner().invoke(app, ["train-student", "-s", str(store), "-o", str(out), "--arch", "bilstm",
                                    "--embed-dim", "8", "--hidden-dim", "8", "--max-steps", "1", "--no-progress",
                                    *args])


def index(store: Path):
    return CliRunner().invoke(app, ["index", str(store), "--column", "mean"])


def refused(res, *said: str) -> None:
    """A kd error (exit 2, what/where/fix, no traceback) saying every one of `said`."""
    assert res.exit_code == 2, res.output
    assert all(s in res.output for s in said), res.output
    assert "Traceback" not in res.output and "fix:" in res.output, res.output
