"""issue 41: --engine ray bounded (an address that is not Ray is refused within seconds) and --backend auto decided
once for every Ray worker, as a local run decides it, and recorded in the manifest."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT

from kd.common.errors import KdError
from kd.pipeline.backends import choice as backend_choice
from kd.pipeline.engines.ray_pool import auto_choices, load_unit_teacher
from kd.pipeline.job import ray_options
from kd.pipeline.precompute import precompute
from kd.storage import Store

BOUND_S = 10.0  # issue 41: an address that does not answer as Ray is refused within this


def _serve_http() -> tuple[http.server.ThreadingHTTPServer, str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"127.0.0.1:{srv.server_address[1]}"


def test_a_web_server_as_ray_address_is_refused_within_seconds(tiny_teacher, tmp_path):
    """ray.init against `python -m http.server PORT` was still connecting after 200 s."""
    pytest.importorskip("ray")
    srv, address = _serve_http()
    src = tmp_path / "s.txt"
    src.write_text("the market fell\nprices rose\n")
    args = [sys.executable, "-m", "kd", "precompute", str(src), "-t", str(tiny_teacher), "-o", str(tmp_path / "st"),
            "--engine", "ray", "--ray-address", address, "--no-progress"]
    try:
        t0 = time.monotonic()
        r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "RAY_ADDRESS": ""})
        took = time.monotonic() - t0
    finally:
        srv.shutdown()
    assert r.returncode == 2 and "does not answer as a Ray cluster" in r.stderr, r.stderr[-2000:]
    assert address in r.stderr and "--ray-address" in r.stderr and "fix:" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "st").exists()
    assert took < BOUND_S + 5, took  # + the interpreter's and ray's import


def test_a_server_that_accepts_but_never_answers_is_refused_within_the_bound():
    pytest.importorskip("ray")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(KdError, match="does not answer as a Ray cluster") as e:
            ray_options("ray", address, None, None, None, None, None)
    assert time.monotonic() - t0 < BOUND_S and address in str(e.value) and "no answer in time" in str(e.value)


def _serve_http2_not_found(silent: socket.socket) -> None:
    """Answer one connection as an HTTP/2 proxy does (this sandbox's gateway at 10.255.255.1:6379 did): a SETTINGS
    frame, then `:status 404` for any request (HPACK static index 13), and no gRPC status."""
    from kd.pipeline import ray_probe as R

    conn, _ = silent.accept()
    with conn:
        conn.recv(65536)
        conn.sendall(R._frame(R.SETTINGS, 0, 0, b""))
        time.sleep(0.2)  # the client's request
        conn.recv(65536)
        conn.sendall(R._frame(R.HEADERS, R.END_HEADERS | R.END_STREAM, 1, b"\x8d"))
        time.sleep(1)


def test_an_http2_server_that_is_not_grpc_is_refused_at_once():
    """The probe's Y04: an address answering HTTP/2 404 passed the probe (no grpc-status to read), and ray.init
    then retried for 20 s and left a partial store."""
    pytest.importorskip("ray")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        threading.Thread(target=_serve_http2_not_found, args=(server,), daemon=True).start()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(KdError, match="answers HTTP/2 with status 404, not as gRPC") as e:
            ray_options("ray", address, None, None, None, None, None)
    assert time.monotonic() - t0 < 3 and address in str(e.value)


@pytest.mark.parametrize("address", ["", "  "])
def test_an_empty_ray_address_is_refused_before_anything(address):
    """The probe's Y06: ray.init('') failed with "Invalid address format", no where or fix, after the store
    folder was made."""
    with pytest.raises(KdError, match="--ray-address is empty") as e:
        ray_options("ray", address, None, None, None, None, None)
    assert e.value.where == "--ray-address" and "HOST:PORT" in e.value.fix


# --- --backend auto under Ray: decided once on the driver ------------------------------------------------------

def _local(backend: str, quantize: str = "none", available: frozenset = frozenset({"openvino", "onnx"})) -> dict:
    return backend_choice.choose(backend, "auto", quantize, available).record()


def test_cpu_workers_run_exactly_what_the_local_cpu_rule_chose_on_the_driver():
    driver = {"a": _local("cpu"), "b": backend_choice.fallback(backend_choice.choose(
        "cpu", "auto", "none", frozenset({"openvino"})), "min cosine 0.9").record()}
    got = auto_choices(driver, {"a": None, "b": None}, False, "auto", "none")
    assert got == driver and got["a"]["backend"] == "openvino" and got["b"]["backend"] == "torch"


def test_gpu_workers_run_the_cuda_rule_unless_a_teacher_cannot():
    driver = {"a": _local("cpu")}
    assert auto_choices(driver, {"a": None}, True, "auto", "none") == {"a": _local("cuda")}
    assert auto_choices(driver, {"a": "torch"}, True, "auto", "none")["a"]["backend"] == "torch"
    # an exported backend in the store, or int8: the workers stay on the CPU with the driver's choice
    assert auto_choices(driver, {"a": "openvino"}, True, "auto", "none") == driver
    int8 = {"a": _local("cpu", "int8")}
    assert auto_choices(int8, {"a": None}, True, "auto", "int8") == int8


def test_fp16_on_cpu_workers_is_torch_as_locally():
    got = auto_choices({"a": _local("cpu")}, {"a": None}, False, "fp16", "none")
    assert got["a"]["backend"] == "torch" and "fp16" in got["a"]["reason"]


def test_a_worker_without_the_chosen_runtime_fails_clearly_and_loads_nothing(monkeypatch, tiny_teacher):
    real = backend_choice.importlib.util.find_spec
    monkeypatch.setattr(backend_choice.importlib.util, "find_spec",
                        lambda name, *a: None if name == "openvino" else real(name, *a))
    load = {"backend": "auto", "quantize": "none", "device": "cpu", "precision": "auto", "max_length": None,
            "threads": 1, "allow_low_fidelity": False, "engine": "ray", "choices": {"tiny": _local("cpu")}}
    with pytest.raises(KdError, match="chose openvino for every Ray worker") as e:
        load_unit_teacher(str(tiny_teacher), "tiny", load)
    assert "not installed on the Ray worker on" in str(e.value) and "--backend torch" in e.value.fix


# --- one end-to-end run on a local Ray runtime -----------------------------------------------------------------

def _corpus(path: Path, rows: int) -> str:
    """Real sentences, from the sample the package ships (so a user's clone runs these too)."""
    from kd.apps.eval.corpus import demo_corpus

    path.write_text("\n".join(text for _, text in demo_corpus()[:rows]) + "\n", encoding="utf-8")
    return str(path)


def test_a_default_ray_store_records_the_backend_a_local_run_picks(tiny_teacher, tmp_path):
    """With defaults, --engine ray ran torch where one process ran OpenVINO, and recorded no choice; now the
    workers run the local choice, recorded the same way. The driver then stops within seconds of a SIGTERM,
    and a raylet's port (gRPC, but not the GCS) is refused by the probe."""
    ray = pytest.importorskip("ray")
    src = _corpus(tmp_path / "news.txt", 120)
    precompute([src], str(tmp_path / "one"), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False)
    want = Store.open(tmp_path / "one").table("teachers/tiny").meta
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        precompute([src], str(tmp_path / "ray"), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False,
                   engine="ray", workers=2)
        node = ray.nodes()[0]
        raylet = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
        with pytest.raises(KdError, match="no Ray GCS service"):
            ray_options("ray", raylet, None, None, None, None, None)
    finally:
        ray.shutdown()
    got = Store.open(tmp_path / "ray").table("teachers/tiny").meta
    assert got["backend_choice"] == want["backend_choice"] and got["backend"] == want["backend"]
    assert want["backend"] == backend_choice.choose("cpu", "auto", "none", backend_choice.installed()).backend


def test_sigterm_ends_a_ray_driver_within_seconds(tiny_teacher, tmp_path):
    pytest.importorskip("ray")
    src = _corpus(tmp_path / "news.txt", 2000)
    out = tmp_path / "s"
    driver = subprocess.Popen([sys.executable, "-m", "kd", "precompute", src, "-t", f"tiny={tiny_teacher}",
                               "--shard-rows", "40", "--no-progress", "-o", str(out), "--engine", "ray",
                               "--backend", "torch", "--workers", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**os.environ, "RAY_ADDRESS": ""})
    deadline = time.time() + 240
    while not list(out.glob("teachers/*/*.parquet")) and time.time() < deadline and driver.poll() is None:
        time.sleep(0.05)
    assert driver.poll() is None, driver.communicate()[1].decode()[-2000:]
    # The promise is 5 s (3.1-3.7 s measured on 2 idle cores); ending Ray's processes is CPU work, so on a machine
    # already running more than a job per core (a developer's, not CI's) the bound is 15 s: still a hang caught
    # (the bug this guards took 200 s), never a flaky failure from a neighbour's load.
    bound = 5.0 if os.getloadavg()[0] < (os.cpu_count() or 1) else 15.0
    t0 = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=60)
    took = time.monotonic() - t0
    assert driver.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err.decode(), err.decode()[-2000:]
    assert took <= bound, (took, bound, os.getloadavg())


def test_a_ray_client_address_without_ray_client_installed_is_refused_with_the_install(monkeypatch):
    """The replayed probe: `--ray-address ray://HOST:10001` without ray[client] printed Ray's ValueError with no
    where or fix (after the store folder was made)."""
    import importlib.util

    pytest.importorskip("ray")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    with pytest.raises(KdError, match="Ray Client is not installed") as e:
        ray_options("ray", "ray://10.0.0.5:10001", None, None, None, None, None)
    assert e.value.where == "--ray-address ray://10.0.0.5:10001" and "ray[client]" in e.value.fix
