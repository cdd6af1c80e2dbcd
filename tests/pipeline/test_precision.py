"""`--precision auto` on CPU: bf16 (weights cast, not autocast) where the CPU has native bf16, else fp32."""

from __future__ import annotations

import builtins

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from kd.common.hardware import native_bf16, native_int8
from kd.pipeline.backends.loading import load_teacher
from kd.pipeline.precompute import precompute
from kd.pipeline.teacher.model import Precision, cast_weights, resolve_precision
from kd.storage import Store
from kd.storage.schema import arrow_to_vectors
from kd.storage.validate import validate


@pytest.mark.parametrize("flag,dtype", [("1", torch.bfloat16), ("0", None)])
def test_auto_follows_native_bf16_on_cpu(monkeypatch, flag, dtype):
    monkeypatch.setenv("KD_CPU_BF16", flag)
    cpu = torch.device("cpu")
    assert resolve_precision(Precision.auto, cpu) is dtype
    assert resolve_precision(Precision.fp32, cpu) is None  # asked for: never changed
    assert cast_weights(cpu, resolve_precision(Precision.auto, cpu)) is (flag == "1")
    assert not cast_weights(torch.device("cuda"), torch.float16)  # CUDA keeps fp16 autocast


def _store(tmp_path, teacher, sentences, name: str, precision: str) -> Store:
    src = tmp_path / "s.txt"
    src.write_text("\n".join(sentences[:80]) + "\n")
    precompute([str(src)], str(tmp_path / name), [str(teacher)], precision=precision, backend="torch",
               device="cpu", progress=False)  # the CPU's precision rule is tested (CUDA autocasts fp16)
    return Store.open(tmp_path / name)


def test_bf16_default_store_is_close_to_fp32_and_keeps_fp32_weight_copies(tmp_path, monkeypatch, tiny_teacher,
                                                                           sentences):
    monkeypatch.setenv("KD_CPU_BF16", "1")
    auto = _store(tmp_path, tiny_teacher, sentences, "auto", "auto")
    fp32 = _store(tmp_path, tiny_teacher, sentences, "fp32", "fp32")
    meta = auto.manifest.tables["teachers/tiny-bert"].meta
    assert meta["precision"] == "bfloat16" and meta["cast"] == "weights"
    assert fp32.manifest.tables["teachers/tiny-bert"].meta["precision"] == "float32"
    a = arrow_to_vectors(auto.read_table("teachers/tiny-bert", ["mean"])["mean"])
    b = arrow_to_vectors(fp32.read_table("teachers/tiny-bert", ["mean"])["mean"])
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.999 and not np.array_equal(a, b)  # bf16 really ran, and stayed faithful
    # the input-embedding matrix students start from is the checkpoint's fp32 one, not bf16-rounded
    emb = load_file(str(tmp_path / "auto/teachers/tiny-bert/input_embeddings.safetensors"))["weight"]
    ref = load_teacher(str(tiny_teacher), device="cpu").model.get_input_embeddings().weight.detach().numpy()
    assert np.array_equal(emb, ref)
    assert validate(auto) == []


def test_library_default_is_fp32(monkeypatch, tiny_teacher):
    monkeypatch.setenv("KD_CPU_BF16", "1")
    t = load_teacher(str(tiny_teacher), device="cpu")
    assert t.autocast is None and not t.weights_cast and next(t.model.parameters()).dtype is torch.float32


@pytest.mark.parametrize("arch,flag,amp,want", [
    ("transformer-init", "1", True, torch.bfloat16),  # matmul-bound: bf16 where the CPU has it
    ("transformer", "1", True, torch.bfloat16),
    ("transformer-init", "0", True, None),  # emulated bf16 would be slower
    ("transformer-init", "1", False, None),  # --no-amp
    ("bilstm", "1", True, None),  # LSTM cells and EmbeddingBag gain nothing: fp32
    ("static", "1", True, None),
])
def test_training_autocast_on_cpu(monkeypatch, arch, flag, amp, want):
    from kd.student.trainer import TrainConfig, amp_dtype

    monkeypatch.setenv("KD_CPU_BF16", flag)
    assert amp_dtype(TrainConfig("s", "o", arch=arch, amp=amp), torch.device("cpu")) is want


@pytest.mark.parametrize("detect,env,flags", [(native_bf16, "KD_CPU_BF16", {"amx_bf16", "avx512_bf16"}),
                                               (native_int8, "KD_CPU_INT8", {"avx512_vnni", "avx_vnni", "amx_int8"})])
def test_cpu_features_read_whole_flags_and_obey_their_override(monkeypatch, tmp_path, detect, env, flags):
    monkeypatch.delenv(env, raising=False)
    real = builtins.open
    cpuinfo = tmp_path / "cpuinfo"

    def fake(path, *a, **kw):
        return real(cpuinfo if path == "/proc/cpuinfo" else path, *a, **kw)

    monkeypatch.setattr(builtins, "open", fake)
    for line, want in [("fpu avx2 fma", False), (f"fpu {sorted(flags)[0]} fma", True),
                       ("fpu avx512_bf16x avx512_vnnix", False)]:  # a flag's name inside another is not it
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {line}\n")
        assert detect() is want, line
    monkeypatch.setenv(env, "0")
    assert detect() is False
    cpuinfo.unlink()
    monkeypatch.setenv(env, "1")
    assert detect() is True
    monkeypatch.delenv(env)
    assert detect() is False  # no /proc/cpuinfo (not Linux): nothing assumed
