"""`--backend auto` (the default of kd precompute) and the cached-fidelity shortcut, on tiny random BERTs.

- the rule (`backend_choice.choose`): OpenVINO on a CPU where installed, torch without it and on CUDA, ONNX
  Runtime only for int8 without OpenVINO; the store's own backend on a resume;
- auto falls back to torch when the chosen backend fails its fidelity check (an explicit --backend is refused);
- a warm export cache with a fidelity measured for these weights on this CPU skips the torch teacher, and a
  record for other weights or another CPU signature is not used.
KD_CACHE points at a temp folder per test (each test exports what it needs).
"""

from __future__ import annotations

import importlib.util
import json
import types

import numpy as np
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from kd.cli import app
from kd.common import hardware
from kd.common.errors import KdError
from kd.pipeline.backends import choice as backend_choice
from kd.pipeline.backends import loading
from kd.pipeline.backends import runtime as backends
from kd.pipeline.backends.calibration import fidelity_sentences
from kd.pipeline.backends.choice import choose
from kd.pipeline.precompute import precompute
from kd.pipeline.teacher.batches import input_embeddings
from kd.pipeline.teacher.vocab import vocab_bytes
from kd.storage.info import backend_details, summary_table

TEXTS = ["the cat sat on the mat", "a dog", "the market rose and the price of water fell this week", "x"]
BOTH = frozenset({"openvino", "onnx"})


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KD_CPU_INT8", "0")  # int8 weights: the quick recipe on any CPU


def _needs_openvino() -> None:
    for module in ("openvino", "nncf", "onnxscript"):
        pytest.importorskip(module)


@pytest.mark.parametrize("device,precision,quantize,available,want", [
    ("cpu", "auto", "none", BOTH, "openvino"),
    ("cpu", "fp32", "int8", BOTH, "openvino"),
    ("cpu", "auto", "none", frozenset({"onnx"}), "torch"),  # ONNX Runtime measured no faster than torch
    ("cpu", "auto", "int8", frozenset({"onnx"}), "onnx"),  # the only int8 backend left
    ("cpu", "auto", "none", frozenset(), "torch"),
    ("cpu", "fp16", "none", BOTH, "torch"),  # no exporting backend offers fp16 on a CPU
    ("cuda", "auto", "none", BOTH, "torch"),
])
def test_the_rule(device, precision, quantize, available, want):
    c = choose(device, precision, quantize, available)
    assert (c.backend, c.quantize) == (want, quantize) and c.reason
    assert c.record() == {"asked": "auto", "backend": want, "quantize": quantize, "reason": c.reason}


def test_the_rule_keeps_the_stored_backend():
    assert choose("cpu", "auto", "none", BOTH, stored="torch").backend == "torch"
    assert "already holds" in choose("cpu", "auto", "none", BOTH, stored="torch").reason


@pytest.mark.parametrize("device,available", [("cuda", BOTH), ("cpu", frozenset())])
def test_int8_without_a_cpu_int8_backend_is_a_clear_error(device, available):
    with pytest.raises(KdError, match="--quantize int8 needs an exporting backend") as e:
        choose(device, "auto", "int8", available)
    assert e.value.fix


def test_installed_looks_modules_up_without_importing_them(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    assert "openvino" not in backend_choice.installed()


def test_auto_without_openvino_runs_torch(tiny_teacher, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    t = loading.load(str(tiny_teacher), "auto", device="cpu", precision="fp32")
    assert t.backend is None and t.choice["backend"] == "torch" and "without OpenVINO" in t.choice["reason"]
    assert t.meta([], "float32")["backend_choice"] == t.choice


def test_auto_on_cuda_runs_torch(tiny_teacher, monkeypatch):
    """CUDA mocked: auto asks for torch on the device, whatever is installed."""
    asked = []
    monkeypatch.setattr(hardware, "GPU_DEVICE_NODES", ("/",))  # a GPU device node "exists": torch is asked
    monkeypatch.setattr(hardware, "resolve_device", lambda device=None: torch.device("cuda"))
    monkeypatch.setattr(loading, "load_teacher", lambda spec, device, p, n: asked.append(device) or
                        types.SimpleNamespace(backend=None, choice=None))
    t = loading.load(str(tiny_teacher), "auto")
    assert asked == [None] and t.choice["backend"] == "torch" and "CUDA" in t.choice["reason"]


def test_without_a_gpu_device_node_the_device_is_the_cpu_and_torch_is_not_asked(monkeypatch, tmp_path):
    def refuse(device=None):
        raise AssertionError("torch was asked")

    monkeypatch.setattr(hardware, "GPU_DEVICE_NODES", (str(tmp_path / "nvidiactl"),))
    monkeypatch.setattr(hardware, "resolve_device", refuse)
    assert hardware.device_kind(None) == "cpu" and hardware.device_kind("cpu") == "cpu"
    with pytest.raises(AssertionError):  # an explicit cuda is always checked by torch
        hardware.device_kind("cuda")
    (tmp_path / "nvidiactl").touch()
    with pytest.raises(AssertionError):  # a node exists: only torch can tell
        hardware.device_kind(None)


def test_auto_with_openvino_runs_it_and_records_the_choice(tiny_teacher, tmp_path):
    _needs_openvino()
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "s"
    r = CliRunner().invoke(app, ["precompute", str(src), "-o", str(out), "-t", f"tiny={tiny_teacher}",
                                 "--device", "cpu", "--quantize", "int8", "--no-progress"])  # int8 without --backend
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "manifest.json").read_text())["tables"]["teachers/tiny"]["meta"]
    assert (meta["backend"], meta["quantize"]) == ("openvino", "int8")
    assert meta["backend_choice"]["asked"] == "auto" and meta["backend_choice"]["backend"] == "openvino"
    assert all(f["min_cosine"] >= 0.98 for f in meta["fidelity"].values())
    console = Console(width=400, record=True)
    console.print(summary_table(str(out)))
    text = console.export_text()
    assert "openvino int8 (weights) float32, min cosine" in text and "auto: CPU, OpenVINO installed" in text


def test_auto_falls_back_to_torch_when_fidelity_fails_and_explicit_is_refused(tiny_teacher, monkeypatch):
    _needs_openvino()
    monkeypatch.setitem(backends.THRESHOLDS, "float32", 1.5)  # nothing reaches it
    with pytest.raises(backends.LowFidelity, match="departs from torch fp32"):
        loading.load(str(tiny_teacher), "openvino", precision="fp32")
    t = loading.load(str(tiny_teacher), "auto", device="cpu", precision="fp32")
    assert t.backend is None and t.choice["backend"] == "torch"
    assert "openvino none failed the fidelity check" in t.choice["reason"] and "min cosine" in t.choice["reason"]
    assert backend_details(t.meta([], "float32")).startswith(" torch float32; auto: openvino none failed")


def test_a_store_written_with_torch_resumes_under_auto(tiny_teacher, tmp_path):
    """A store from before auto (default torch) meets the new default without a settings refusal."""
    _needs_openvino()
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    out = tmp_path / "s"
    precompute([str(src)], str(out), [f"t={tiny_teacher}"], backend="torch", device="cpu", progress=False)
    s = precompute([str(src)], str(out), [f"t={tiny_teacher}"], device="cpu", progress=False)
    assert s.nothing_to_do
    meta = json.loads((out / "manifest.json").read_text())["tables"]["teachers/t"]["meta"]
    assert meta["backend"] == "torch"
    with pytest.raises(KdError, match="other settings"):  # an explicit other backend is still refused
        precompute([str(src)], str(out), [f"t={tiny_teacher}"], backend="openvino", progress=False)


def test_old_manifests_without_a_choice_still_show():
    assert backend_details({"backend": "torch", "precision": "float32"}) == ""
    assert backend_details({"backend": "onnx", "quantize": "int8", "precision": "float32",
                            "fidelity": {"mean": {"min_cosine": 0.99}}}) == " onnx int8 float32, min cosine 0.9900"


def _no_torch_teacher(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("the torch teacher was loaded")

    monkeypatch.setattr(loading, "load_teacher", refuse)


def test_a_cached_fidelity_skips_the_torch_teacher(tiny_teacher, monkeypatch):
    _needs_openvino()
    first = loading.load(str(tiny_teacher), "openvino", precision="fp32")
    want = first.encode(TEXTS)
    emb = input_embeddings(first)
    _no_torch_teacher(monkeypatch)
    again = loading.load(str(tiny_teacher), "openvino", precision="fp32")
    assert again.model is None and again.backend.fidelity == first.backend.fidelity
    assert again.meta([], "float32") == first.meta([], "float32")
    got = again.encode(TEXTS)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert np.array_equal(input_embeddings(again), emb)  # read from the checkpoint's safetensors file
    # the vocab output needs transformers' tokenizer: loaded from the record's copy of its files
    assert again.tokenizer is None and vocab_bytes(again) == vocab_bytes(first)


def test_a_cached_fidelity_for_other_weights_or_another_cpu_is_not_used(tiny_teacher, tmp_path, monkeypatch):
    from conftest import build_tiny_bert

    _needs_openvino()
    other = build_tiny_bert(tmp_path / "other", seed=7)
    a = loading.load(str(tiny_teacher), "openvino", precision="fp32")
    b = loading.load(str(other), "openvino", precision="fp32")
    rec_a, rec_b = (next(t.backend.folder.glob("fidelity-*.json")) for t in (a, b))
    rec_b.write_text(rec_a.read_text())  # a's record in b's place: keyed by a's weights
    load_teacher = loading.load_teacher
    _no_torch_teacher(monkeypatch)
    with pytest.raises(AssertionError, match="torch teacher was loaded"):
        loading.load(str(other), "openvino", precision="fp32")
    monkeypatch.setattr(hardware, "cpu_signature", lambda: "another-cpu")
    with pytest.raises(AssertionError, match="torch teacher was loaded"):
        loading.load(str(tiny_teacher), "openvino", precision="fp32")
    monkeypatch.setattr(loading, "load_teacher", load_teacher)
    loading.load(str(tiny_teacher), "openvino", precision="fp32")  # measured again, recorded beside the first
    assert len(list(a.backend.folder.glob("fidelity-*.json"))) == 2


WARM_CHILD = """
import sys
from kd.pipeline.precompute import precompute
precompute([sys.argv[1]], sys.argv[2], ["tiny=" + sys.argv[3]], progress=False)
print("heavy", sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def test_a_warm_run_imports_neither_torch_nor_transformers_and_writes_the_same_store(tiny_teacher, tmp_path):
    """The first run exports, measures and records; the second (a fresh process, the cache warm) tokenizes with the
    recorded tokenizer.json, pools in numpy and never imports torch or transformers: every file of its store,
    manifest included, is byte for byte the first run's."""
    import os
    import subprocess
    import sys

    _needs_openvino()
    src = tmp_path / "in.txt"
    src.write_text("\n".join(fidelity_sentences()) + "\n", encoding="utf-8")
    env = {**os.environ, "KD_CACHE": str(tmp_path / "cache"), "PYTHONPATH": os.getcwd()}
    stores = [tmp_path / "cold", tmp_path / "warm"]
    for store, heavy in zip(stores, ("['torch', 'transformers']", "[]")):
        r = subprocess.run([sys.executable, "-c", WARM_CHILD, str(src), str(store), str(tiny_teacher)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and f"heavy {heavy}" in r.stdout, (r.stdout, r.stderr[-2000:])

    def files(root):
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and p.parent.name != "locks"}

    cold, warm = files(stores[0]), files(stores[1])
    assert sorted(cold) == sorted(warm) and "tokenizers/tiny/tokenizer.json" in cold
    assert [k for k in cold if cold[k] != warm[k]] == []
    meta = json.loads(cold["manifest.json"])["tables"]["teachers/tiny"]["meta"]
    assert meta["backend"] == "openvino" and meta["backend_choice"]["backend"] == "openvino"


def test_an_edited_checkpoint_tokenizer_or_a_damaged_recorded_one_is_measured_again(tmp_path, monkeypatch):
    import shutil

    from conftest import build_tiny_bert

    _needs_openvino()
    ckpt = build_tiny_bert(tmp_path / "ckpt", seed=3)
    first = loading.load(str(ckpt), "openvino", precision="fp32")
    load_teacher = loading.load_teacher
    _no_torch_teacher(monkeypatch)
    assert loading.load(str(ckpt), "openvino", precision="fp32").model is None  # warm: the record serves
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 32}))
    with pytest.raises(AssertionError, match="torch teacher was loaded"):  # weights unchanged, tokenizer not
        loading.load(str(ckpt), "openvino", precision="fp32")
    monkeypatch.setattr(loading, "load_teacher", load_teacher)
    again = loading.load(str(ckpt), "openvino", precision="fp32")
    assert again.max_length == 32 != first.max_length
    _no_torch_teacher(monkeypatch)
    folder = next(p for p in first.backend.folder.iterdir() if p.name.startswith("tokenizer-")
                  and json.loads((p / "tokenizer_config.json").read_text()).get("model_max_length") == 32)
    with open(folder / "tokenizer.json", "a") as f:
        f.write(" ")  # one byte more: its sha256 no longer matches the record's
    with pytest.raises(AssertionError, match="torch teacher was loaded"):
        loading.load(str(ckpt), "openvino", precision="fp32")
    shutil.rmtree(folder)
    with pytest.raises(AssertionError, match="torch teacher was loaded"):
        loading.load(str(ckpt), "openvino", precision="fp32")
