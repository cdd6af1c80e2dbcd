"""kd precompute --engine ray: the same store as one process, a dead worker's unit retried, a killed driver resumed.

The tests that run Ray share one local runtime (2 CPUs, started once for the module) and skip when ray is not
installed; the option checks and the pure planners run without it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, shared_file
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError, KdError, StoreError
from kd.pipeline.engines.plan import ShardPlan, Unit, plan_units
from kd.pipeline.engines.ray_pool import plan_workers
from kd.pipeline.job import RayOptions
from kd.pipeline.job import ray_options as options
from kd.pipeline.precompute import precompute
from kd.storage import Store
from kd.storage.manifest import Manifest, ShardRecord, TableRecord
from kd.storage.schema import arrow_to_vectors
from kd.storage.validate import validate

ROWS, SHARD_ROWS = 240, 40  # 6 shards: 6 units for 2 workers


def _corpus(path: Path, rows: int, name: str = "news") -> str:
    lines = shared_file("corpus", f"eng_{name}_2016_10K-sentences.txt").read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(x.split("\t", 1)[1] for x in lines[:rows]) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def ray_runtime():
    ray = pytest.importorskip("ray", reason="kd precompute --engine ray needs ray (pip install 'kd[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_teacher):
    """The corpus and its one-process store (one torch thread, as each Ray worker here)."""
    root = tmp_path_factory.mktemp("ray-ref")
    src = _corpus(root / "news.txt", ROWS)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        precompute([src], str(root / "one"), [f"tiny={tiny_teacher}"], shard_rows=SHARD_ROWS, backend="torch",
                   progress=False)
    finally:
        torch.set_num_threads(n)
    return src, Store.open(root / "one")


def _assert_same_store(got: Store, want: Store) -> None:
    assert validate(got) == []
    for name in ("texts", "teachers/tiny"):
        a, b = got.read_table(name), want.read_table(name)
        assert a.column_names == b.column_names and a.num_rows == b.num_rows
        assert a["id"].equals(b["id"]), name
        for c in a.column_names:
            if "list" in str(a[c].type):
                np.testing.assert_allclose(arrow_to_vectors(a[c]), arrow_to_vectors(b[c]), atol=1e-5, err_msg=c)
            else:
                assert a[c].equals(b[c]), (name, c)
        assert got.table(name).meta == want.table(name).meta
        assert sorted(got.table(name).shards) == sorted(want.table(name).shards)
        assert [r.rows for r in got.table(name).shards.values()] == [r.rows for r in want.table(name).shards.values()]
    assert got.table("texts").shards == want.table("texts").shards  # same bytes, same checksums
    assert got.manifest.extras["files"] == want.manifest.extras["files"]  # tokenizer + input embeddings
    assert os.listdir(Path(got.root) / "manifests") == ["writer-00000-of-00001.json"]


def _temps(store: Path) -> list[str]:
    return [str(p) for p in store.rglob("*.tmp-*")]


# --- with a Ray runtime ----------------------------------------------------------------------------------------

def test_ray_store_equals_the_one_process_store(ray_runtime, reference, tiny_teacher, tmp_path):
    src, one = reference
    out = tmp_path / "ray"
    args = ["precompute", src, "-t", f"tiny={tiny_teacher}", "--shard-rows", str(SHARD_ROWS), "-o", str(out),
            "--engine", "ray", "--backend", "torch", "--workers", "2", "--no-progress"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "wrote 6 shard(s)" in r.output and f"{ROWS} rows encoded" in r.output
    got = Store.open(out)
    _assert_same_store(got, one)
    assert got.table("teachers/tiny").shards == one.table("teachers/tiny").shards  # bit-identical at 1 thread
    assert CliRunner().invoke(app, ["validate", str(out)]).exit_code == 0
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "nothing to do" in again.output


def test_the_driver_bar_counts_rows_per_worker(ray_runtime, reference, tiny_teacher, tmp_path):
    src, _ = reference
    r = CliRunner().invoke(app, ["precompute", src, "-t", f"tiny={tiny_teacher}", "--shard-rows", str(SHARD_ROWS),
                                 "-o", str(tmp_path / "s"), "--engine", "ray", "--backend", "torch", "--workers", "2"])
    assert r.exit_code == 0, r.output
    last = [x for x in r.output.splitlines() if x.startswith("precompute (") and "workers" in x][-1]
    counts = dict(w.split("=") for w in last.split("workers ")[1].split())
    assert set(counts) <= {"w1", "w2"} and counts, last  # (a fast worker may take every unit of a tiny job)
    assert sum(int(n.replace(",", "")) for n in counts.values()) == ROWS, last  # every row, per worker


def test_a_dead_worker_unit_is_retried_and_committed_once(ray_runtime, reference, tiny_teacher, tmp_path,
                                                          monkeypatch):
    from kd.storage.store import StoreWriter

    src, one = reference
    hook = tmp_path / "die-once"
    hook.write_text("")
    monkeypatch.setenv("KD_RAY_TEST_DIE_ONCE", str(hook))  # the first worker to see it exits mid-unit
    adopted: list[tuple[str, int]] = []
    adopt = StoreWriter.adopt

    def record(self, name, k, *rest):
        adopted.append((name, k))
        return adopt(self, name, k, *rest)

    monkeypatch.setattr(StoreWriter, "adopt", record)
    s = precompute([src], str(tmp_path / "ray"), [f"tiny={tiny_teacher}"], shard_rows=SHARD_ROWS, progress=False,
                   engine="ray", workers=2, backend="torch")
    assert not hook.exists(), "no worker died"
    assert s.retried == 1 and s.shards_written == 6 and s.rows_computed == ROWS
    assert sorted(adopted) == [("teachers/tiny", k) for k in range(6)]  # every unit committed exactly once
    assert _temps(tmp_path / "ray") == []  # the dead worker's temp file is gone
    _assert_same_store(Store.open(tmp_path / "ray"), one)


def _committed(store: Path) -> int:
    try:
        tables = json.loads((store / "manifests" / "writer-00000-of-00001.json").read_text())["tables"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0
    return sum(len(t["shards"]) for name, t in tables.items() if name.startswith("teachers/"))


def test_killed_driver_resumes_to_the_uninterrupted_store(ray_runtime, tiny_teacher, tmp_path):
    src = _corpus(tmp_path / "wiki.txt", 2000, "wikipedia")  # 50 units
    args = [src, "-t", f"tiny={tiny_teacher}", "--shard-rows", "40", "--no-progress"]
    address = ray_runtime.get_runtime_context().gcs_address
    victim = subprocess.Popen([sys.executable, "-m", "kd", "precompute", *args, "-o", str(tmp_path / "cut"),
                               "--engine", "ray", "--backend", "torch", "--ray-address", address, "--workers", "2"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    while _committed(tmp_path / "cut") < 1 and time.time() < deadline and victim.poll() is None:
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    _, err = victim.communicate()
    kept = _committed(tmp_path / "cut")
    assert 0 < kept < 50, f"the kill must land mid-run: {err.decode()[-2000:]}"
    s = precompute([src], str(tmp_path / "cut"), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False,
                   engine="ray", workers=2, backend="torch")
    assert (s.shards_written, s.shards_skipped) == (50 - kept, kept)  # the shards whose rows were committed kept
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        precompute([src], str(tmp_path / "full"), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False,
                   backend="torch")
    finally:
        torch.set_num_threads(n)
    got, want = Store.open(tmp_path / "cut"), Store.open(tmp_path / "full")
    assert validate(got) == [] and _temps(tmp_path / "cut") == []
    for name in ("texts", "teachers/tiny"):
        assert got.read_table(name).equals(want.read_table(name)), name
        assert got.table(name).shards == want.table(name).shards


@pytest.mark.parametrize("change", [["--max-length", "16"], ["--dtype", "float16"]])
def test_a_complete_store_still_refuses_other_settings(ray_runtime, reference, tiny_teacher, tmp_path, change):
    """Nothing left to encode means no worker compares settings: the driver must (as the local engine does),
    or a rerun with another max length or dtype would report success on a store that lacks them. Fewer outputs
    than the store holds are no other setting: nothing to do on either engine."""
    src, one = reference
    out = tmp_path / "done"
    shutil.copytree(one.root, out)
    before = {p.name: p.read_bytes() for p in (out / "manifests").iterdir()}
    args = ["precompute", src, "-t", f"tiny={tiny_teacher}", "--shard-rows", str(SHARD_ROWS), "-o", str(out),
            "--no-progress"]
    for engine in ("local", "ray"):
        r = CliRunner().invoke(app, [*args, *change, "--engine", engine])
        assert r.exit_code == 2 and "written with other settings" in r.output, (engine, r.output)
    assert {p.name: p.read_bytes() for p in (out / "manifests").iterdir()} == before
    same = CliRunner().invoke(app, [*args, "--engine", "ray", "--backend", "torch"])
    assert same.exit_code == 0 and "nothing to do" in same.output, same.output
    fewer = CliRunner().invoke(app, [*args, "--outputs", "cls", "--engine", "ray", "--backend", "torch"])
    assert fewer.exit_code == 0 and "nothing to do" in fewer.output, fewer.output
    assert {p.name: p.read_bytes() for p in (out / "manifests").iterdir()} == before


def test_workers_that_cannot_start_stop_the_job_clearly_and_it_resumes(ray_runtime, reference, tiny_teacher,
                                                                        tmp_path, monkeypatch):
    """Actors Ray cannot place (here: 64 CPUs each on a 2-CPU runtime, as after a lost node) used to leave the
    driver waiting forever. Now: a StoreError after KD_RAY_START_TIMEOUT, the texts kept, and the same command
    resumes once workers fit."""
    from kd.pipeline.engines import ray_pool as ray_engine

    src, want = reference
    real = ray_engine.plan_workers
    monkeypatch.setattr(ray_engine, "plan_workers", lambda *a, **kw: ray_engine.WorkerPlan(1, 64.0, 0.0, 1, "cpu"))
    monkeypatch.setenv("KD_RAY_START_TIMEOUT", "3")
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="no Ray worker started within 3 s"):
        precompute([src], str(tmp_path / "s"), [f"tiny={tiny_teacher}"], shard_rows=SHARD_ROWS, progress=False,
                   engine="ray", backend="torch")
    assert time.monotonic() - t0 < 60
    assert _committed(tmp_path / "s") == 0 and Store.open(tmp_path / "s").table("texts").shards  # texts kept
    monkeypatch.setattr(ray_engine, "plan_workers", real)
    monkeypatch.delenv("KD_RAY_START_TIMEOUT")  # real workers: the default (starting them can take > 3 s)
    s = precompute([src], str(tmp_path / "s"), [f"tiny={tiny_teacher}"], shard_rows=SHARD_ROWS, progress=False,
                   engine="ray", workers=2, backend="torch")
    assert s.shards_written > 0
    _assert_same_store(Store.open(tmp_path / "s"), want)


def _wait_for_a_commit(store: Path, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.time() + seconds
    while _committed(store) < 1 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_ray_process_outlives_a_stopped_driver(tiny_teacher, tmp_path, sig):
    """A driver that started its own local Ray runtime: SIGTERM stops it within seconds, saying so (exit 143, as
    kd train-student); after SIGTERM
    or SIGKILL none of its processes (Ray's head, agents, workers) is alive a few seconds later. (Ray's agents
    used to outlive a killed driver by a minute or more.)"""
    pytest.importorskip("ray")
    from kd.pipeline.engines.ray_reaper import alive, descendants

    src = _corpus(tmp_path / "wiki.txt", 2000, "wikipedia")  # 50 units: the signal lands mid-run
    driver = subprocess.Popen([sys.executable, "-m", "kd", "precompute", src, "-t", f"tiny={tiny_teacher}",
                               "--shard-rows", "40", "--no-progress", "-o", str(tmp_path / "s"), "--engine", "ray",
                               "--backend", "torch",
                               "--workers", "2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "RAY_ADDRESS": ""})
    _wait_for_a_commit(tmp_path / "s", driver, 240)
    procs = descendants(driver.pid)
    assert driver.poll() is None and _committed(tmp_path / "s") >= 1, driver.communicate()[1].decode()[-2000:]
    assert any(b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid, _ in alive(procs))  # a local runtime
    t0 = time.monotonic()
    driver.send_signal(sig)
    _, err = driver.communicate(timeout=60)
    stopped = time.monotonic() - t0
    deadline = time.monotonic() + 10
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:80] for pid, _ in alive(procs)}
    assert not left, f"{len(left)} Ray process(es) outlived the driver by 10 s: {left}"
    if sig == signal.SIGTERM:
        assert stopped < 20 and driver.returncode == 128 + signal.SIGTERM, (stopped, err.decode()[-2000:])
        assert "stopped by SIGTERM after" in err.decode() and "rerun the same command" in err.decode()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on leaving: nothing listens there


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_ray_address_where_nothing_listens_is_refused_at_once(tiny_teacher, tmp_path, how):
    """ray.init retried such an address for many minutes; now the driver stops within seconds, naming the
    address, before anything is read or written."""
    pytest.importorskip("ray")
    address = f"127.0.0.1:{_free_port()}"
    src = tmp_path / "s.txt"
    src.write_text("the market fell\nprices rose\n")
    args = [sys.executable, "-m", "kd", "precompute", str(src), "-t", str(tiny_teacher), "-o", str(tmp_path / "st"),
            "--engine", "ray", "--backend", "torch",
            "--no-progress"] + (["--ray-address", address] if how == "option" else [])
    env = {**os.environ, "RAY_ADDRESS": address if how == "env" else ""}
    t0 = time.monotonic()
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and address in r.stderr and "ray start --head" in r.stderr, r.stderr[-2000:]
    assert ("RAY_ADDRESS" if how == "env" else "--ray-address") in r.stderr
    assert time.monotonic() - t0 < 60 and not (tmp_path / "st").exists()


def test_a_ray_address_that_is_not_host_port_is_refused():
    pytest.importorskip("ray")
    with pytest.raises(InputError, match="not HOST:PORT"):
        options("ray", "head-node", None, None, None, None, None)


@pytest.mark.parametrize("value", ["0", "soon", "-5"])
def test_a_bad_start_timeout_is_refused_by_name(monkeypatch, value):
    from kd.pipeline.engines.ray_pool import start_timeout

    monkeypatch.setenv("KD_RAY_START_TIMEOUT", value)
    with pytest.raises(InputError, match="KD_RAY_START_TIMEOUT"):
        start_timeout()


# --- without Ray -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, match", [
    (["--engine", "spark"], "'--engine'.*'local'.*'ray'"),  # refused at parse time
    (["--workers", "2"], "only applies to --engine ray"),
    (["--engine", "ray", "--backend", "torch", "--workers", "0"], "'--workers'"),
    (["--engine", "ray", "--num-shards", "2", "--shard-index", "0"], "assigns shards to its workers"),
    (["--engine", "ray", "--backend", "torch", "--gpus-per-worker", "2"], "'--gpus-per-worker'"),
    (["--engine", "ray", "--backend", "torch", "--device", "cuda:1"], "Ray gives each worker its own GPU"),
])
def test_bad_engine_options_exit_2_and_write_nothing(tmp_path, tiny_teacher, extra, match):
    import re

    src = tmp_path / "s.txt"
    src.write_text("a cat\na dog\n")
    r = CliRunner().invoke(app, ["precompute", str(src), "-t", str(tiny_teacher), "-o", str(tmp_path / "st"), *extra])
    assert r.exit_code == 2 and re.search(match, " ".join(r.output.split())), r.output
    assert not (tmp_path / "st").exists()


def test_engine_ray_without_ray_says_how_to_install(tmp_path, tiny_teacher, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    src = tmp_path / "s.txt"
    src.write_text("a cat\n")
    r = CliRunner().invoke(app, ["precompute", str(src), "-t", str(tiny_teacher), "-o", str(tmp_path / "st"),
                                 "--engine", "ray", "--backend", "torch"])
    assert r.exit_code == 2 and "pip install 'kd[ray]'" in r.output
    with pytest.raises(KdError, match="needs ray"):
        options("ray", None, None, None, None, None, None)


def test_engine_ray_refuses_to_run_under_torchrun(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InputError, match="torchrun"):
        options("ray", None, None, None, None, None, None)


def test_plan_units_lists_what_is_not_committed_teacher_major():
    plan = ShardPlan(num_rows=25, shard_rows=10)  # shards of 10, 10, 5 rows
    assert plan_units(None, plan, ["a", "b"]).units == [Unit(t, k) for t in "ab" for k in range(3)]
    rec = ShardRecord("f", 10, 1, "x")
    m = Manifest({"fingerprint": "f", "num_shards": 3}, {
        "texts": TableRecord("texts", shards={0: rec, 1: rec, 2: rec}),
        "teachers/a": TableRecord("teacher", shards={0: rec, 2: rec}),
    })
    left = plan_units(m, plan, ["a", "b"])
    assert left.texts == [] and left.units == [Unit("a", 1), Unit("b", 0), Unit("b", 1), Unit("b", 2)]
    assert left.rows == 10 + 25
    assert plan_units(Manifest(m.inputs, {**m.tables, "teachers/a": m.tables["texts"]}), plan, ["a"]).empty


def test_plan_workers_gpu_and_cpu():
    ray = RayOptions(None, None, None, None)
    assert plan_workers(16, 4, ray) == plan_workers(16, 4, RayOptions(None, 4, 1.0, "cuda"))
    w = plan_workers(16, 4, ray)
    assert (w.count, w.num_gpus, w.device) == (4, 1.0, "cuda")
    assert plan_workers(16, 4, RayOptions(None, None, 0.5, None)).count == 8
    cpu = plan_workers(16, 4, RayOptions(None, None, None, "cpu"))
    assert (cpu.count, cpu.threads, cpu.num_cpus, cpu.device) == (16, 1, 1.0, "cpu")
    two = plan_workers(16, 0, RayOptions(None, 2, None, None))
    assert (two.count, two.threads, two.num_gpus) == (2, 8, 0.0)
    assert plan_workers(16, 4, ray, backend="onnx").device == "cpu"  # exported backends run on the CPU
    with pytest.raises(InputError, match="needs 5 GPUs"):
        plan_workers(16, 4, RayOptions(None, 5, None, None))
    with pytest.raises(InputError, match="needs 3 CPUs"):
        plan_workers(2, 0, RayOptions(None, 3, None, None))
    with pytest.raises(InputError, match="has no GPUs"):
        plan_workers(2, 0, RayOptions(None, None, None, "cuda"))
    with pytest.raises(InputError, match="--gpus-per-worker"):
        plan_workers(2, 0, RayOptions(None, None, 0.5, None))
