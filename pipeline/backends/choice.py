"""`kd precompute --backend auto` (the default): which backend runs the teacher, by a rule that was measured.

The rule (`choose`, a pure function of what the machine offers and what was asked):
- a store that already holds this teacher: its backend (a resume or an extension keeps its settings);
- `--engine ray`: the same rule, decided once on the driver for every worker (`ray_engine.auto_choices`): CPU
  workers run what the driver's copy chose on its CPU, GPU workers what CUDA gives (torch);
- CUDA: torch (ONNX Runtime and OpenVINO run kd's graphs on the CPU);
- CPU, `--precision fp16`: torch (the exporting backends offer no fp16 on a CPU);
- CPU, OpenVINO installed: openvino. 10,000 Leipzig sentences, 2 threads, AVX-512 VNNI/BF16 CPU, whole
  jobs against sentence-transformers fp32 (docs/results.md, issue 13): fp32 1.38x / 1.44x ST (torch 1.17x,
  ONNX Runtime 1.27x / 1.25x); bf16 2.37x (torch 2.10x); int8 (static) 3.15x (ONNX Runtime int8 1.84x);
  on the AVX2 CPU fp32 1.21x (torch 1.22x, ONNX 1.18x), int8 weights 1.20x (ONNX int8 1.48x);
- CPU, `--quantize int8`, no OpenVINO: onnx (the only other int8 backend); neither installed: an error;
- CPU otherwise: torch (ONNX Runtime measured no faster than torch fp32 on the AVX2 CPU, 1.18x vs 1.22x).
A fast backend whose fidelity to torch fp32 falls below its threshold is not kept by auto: the teacher runs
on torch instead, and the reason says so (`fallback`; pipeline/backends/runtime.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass

from kd.common.errors import KdError

AUTO = "auto"
RUNTIMES = {"openvino": "openvino", "onnx": "onnxruntime"}  # backend -> the module it needs


@dataclass(frozen=True)
class Choice:
    """The backend auto picked, with the quantization it runs and why (recorded in the manifest)."""

    backend: str
    quantize: str
    reason: str

    def record(self) -> dict:
        return {"asked": AUTO, **asdict(self)}


def installed() -> frozenset[str]:
    """The exporting backends whose runtime is importable (found, not imported: that costs seconds)."""
    return frozenset(b for b, module in RUNTIMES.items() if importlib.util.find_spec(module) is not None)


def choose(device: str, precision: str, quantize: str, available: frozenset[str], *,
           stored: str | None = None) -> Choice:
    """The rule of the module docstring. `device`: cpu or cuda (the device kind the teacher runs on);
    `available`: `installed()`; `stored`: the backend the store already holds this teacher with, if any."""
    if stored is not None:
        return Choice(stored, quantize, f"the store already holds this teacher written with --backend {stored}")
    if device == "cuda":
        if quantize == "int8":
            raise _int8_needs("on CUDA auto runs torch", "use --device cpu, or drop --quantize int8")
        return Choice("torch", quantize, "CUDA: torch (the exported backends run on the CPU)")
    if precision == "fp16":
        return Choice("torch", quantize, "--precision fp16 on a CPU: only torch offers it")
    if "openvino" in available:
        return Choice("openvino", quantize, "CPU, OpenVINO installed (the fastest CPU backend measured)")
    if quantize == "int8":
        if "onnx" in available:
            return Choice("onnx", quantize, "CPU, --quantize int8, OpenVINO not installed: ONNX Runtime int8")
        raise _int8_needs("neither OpenVINO nor ONNX Runtime is installed", "pip install 'kd[openvino]'")
    return Choice("torch", quantize, "CPU without OpenVINO (ONNX Runtime measured no faster than torch)")


def fallback(rejected: Choice, fidelity_error: str) -> Choice:
    """Torch after `rejected` failed its fidelity check (auto never keeps an unfaithful backend)."""
    return Choice("torch", "none", f"{rejected.backend} {rejected.quantize} failed the fidelity check "
                  f"({fidelity_error}); torch instead")


def _int8_needs(why: str, fix: str) -> KdError:
    return KdError(f"--quantize int8 needs an exporting backend on the CPU: {why}", "--quantize int8", fix)
