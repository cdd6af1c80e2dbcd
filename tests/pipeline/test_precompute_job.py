"""kd precompute as one job: options checked when the job is built, one store whichever way it is started, and
modules that use each other's public names only (job -> plan -> shards -> engines -> precompute)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError
from kd.pipeline.engines.plan import ShardPlan, Unit, plan_units
from kd.pipeline.job import PrecomputeJob
from kd.pipeline.precompute import precompute, run
from kd.storage import Store
from kd.storage.manifest import Manifest, ShardRecord, TableRecord


@pytest.mark.parametrize("bad, match", [
    (dict(shard_rows=0), "--shard-rows 0"),
    (dict(batch_tokens=10**12), "--batch-tokens"),
    (dict(segment="paragraphs"), "--segment 'paragraphs' is not one of none, sentences"),
    (dict(teachers=[]), "no teacher given"),
    (dict(dtype="int4"), "int4"),
    (dict(engine="spark"), "--engine 'spark' is not one of local, ray"),
    (dict(workers=2), "only applies to --engine ray"),
    (dict(backend="torch", quantize="int8"), "--quantize int8 needs an exporting backend"),
])
def test_a_bad_option_fails_when_the_job_is_built(tmp_path, bad, match):
    """The inputs and the teacher do not exist: reading or loading either would raise another error first."""
    out = tmp_path / "store"
    given = dict(inputs=[str(tmp_path / "missing.txt")], out=str(out), teachers=["no-such-teacher"]) | bad
    with pytest.raises((InputError, ValueError), match=match):
        PrecomputeJob(**given)
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_a_built_job_cannot_be_changed_past_its_checks(tmp_path, tiny_teacher):
    job = PrecomputeJob([str(tmp_path / "s.txt")], str(tmp_path / "st"), [str(tiny_teacher)], outputs=["mean"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.shard_rows = 0  # type: ignore[misc]
    assert job.inputs == (str(tmp_path / "s.txt"),) and job.outputs == ("mean",)  # lists became tuples


def _records(path: Path) -> tuple[dict, dict]:
    m = Store.open(path).manifest
    return {name: t.shards for name, t in m.tables.items()}, m.extras["files"]


def test_run_the_keyword_wrapper_and_the_cli_write_the_same_store(tmp_path, tiny_teacher, sentences):
    src = tmp_path / "s.txt"
    src.write_text("\n".join(sentences[:45]) + "\n", encoding="utf-8")
    opts = dict(shard_rows=20, outputs=["mean", "cls"], dedup=True, progress=False)
    s = run(PrecomputeJob([str(src)], str(tmp_path / "job"), [f"tiny={tiny_teacher}"], **opts))
    assert (s.rows_total, s.shards_written) == (45, 3)  # 3 shards of 20 rows (texts and tiny's in each)
    precompute([str(src)], str(tmp_path / "kw"), [f"tiny={tiny_teacher}"], **opts)
    r = CliRunner().invoke(app, ["precompute", str(src), "-t", f"tiny={tiny_teacher}", "-o", str(tmp_path / "cli"),
                                 "--shard-rows", "20", "--outputs", "mean,cls", "--dedup", "--no-progress"])
    assert r.exit_code == 0, r.output
    tables, files = _records(tmp_path / "job")
    assert sorted(tables) == ["teachers/tiny", "texts"] and len(tables["teachers/tiny"]) == 3
    assert _records(tmp_path / "kw") == (tables, files)  # same shards: rows, bytes, sha256
    assert _records(tmp_path / "cli") == (tables, files)


def test_the_local_order_is_shard_by_shard_and_covers_only_owned_shards():
    plan = ShardPlan(num_rows=50, shard_rows=10)  # 5 shards; writer 1 of 2 owns 1 and 3
    rec = ShardRecord("f", 10, 1, "x")
    done = Manifest({"fingerprint": "f", "num_shards": 5}, {
        "texts": TableRecord("texts", shards={1: rec}), "teachers/b": TableRecord("teacher", shards={3: rec})})
    left = plan_units(done, plan, ["a", "b"], plan.owned(1, 2))
    assert left.texts == [3] and left.units == [Unit("a", 1), Unit("a", 3), Unit("b", 1)]
    assert left.shard_major() == [(1, "a"), (1, "b"), (3, None), (3, "a")]
    assert (left.rows, left.shards, left.skipped) == (30, 2, 0)  # both owned shards have something left
    done = Manifest({"fingerprint": "f", "num_shards": 5}, {
        "texts": TableRecord("texts", shards={1: rec}), "teachers/a": TableRecord("teacher", shards={1: rec}),
        "teachers/b": TableRecord("teacher", shards={1: rec, 3: rec})})
    left = plan_units(done, plan, ["a", "b"], plan.owned(1, 2))
    assert (left.texts, left.units, left.shards, left.skipped) == ([3], [Unit("a", 3)], 1, 1)  # shard 1 is whole


PRECOMPUTE = ("job", "engines/plan", "engines/shards", "engines/local", "engines/ray_pool", "precompute")


def test_precompute_modules_import_no_private_names_from_each_other():
    """Each module uses the others' public names only, even in an import inside a function (the Ray engine
    imported precompute's `_save_teacher_files`, `_span`, ...). Cycles: tests/test_architecture.py."""
    for stem in PRECOMPUTE:
        for node in ast.walk(ast.parse((ROOT / "pipeline" / f"{stem}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kd."):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"pipeline/{stem}.py imports {private} from {node.module}"
