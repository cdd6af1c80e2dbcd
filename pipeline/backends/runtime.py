"""Teacher backends for `kd precompute --backend torch|onnx|openvino --quantize none|int8`: the graphs, their
runners, export cache and fidelity check (a reference is loaded onto one by pipeline/backends/loading.py).

A backend replaces only the encoder's forward pass: (input_ids, attention_mask[, token_type_ids]) -> every
hidden state (embeddings first) [+ the classification head's logits]. Pooling (cls, mean, layers, sentence)
stays in `Teacher.forward`, in fp32, so every backend pools identically.

- Export once per (weights, backend, quantize) into `$KD_CACHE/teachers/<weights_sha256>-<backend>-<quantize>/`
  (default `~/.cache/kd`): torch's tracing exporter (dynamo past 2 GB) -> ONNX with dynamic batch and sequence
  axes; int8 for ONNX Runtime is its dynamic quantization (int8 weights, activations quantized per batch at
  run time); OpenVINO converts that fp32 ONNX graph to IR, int8 being NNCF's static quantization (int8
  weights and activations, SmoothQuant, calibrated on bundled sentences) where the CPU has int8 dot products
  (VNNI/AMX), and its data-free int8 weight compression elsewhere (`int8_method`; recorded). The folder is
  built in a temp folder and renamed into place, with the sha256 of each file in
  `kd_backend.json`: a killed export leaves no half cache, and a damaged one (a file edited or truncated) is rebuilt.
- Threads: `threads` (default `torch.get_num_threads()`, i.e. OMP_NUM_THREADS when set) goes to ONNX
  Runtime's intra-op pool and OpenVINO's INFERENCE_NUM_THREADS, so backends compare at equal threads.
- Fidelity: after loading, 64 bundled sentences (pairs for cross-encoders) are encoded by the backend and by
  the same teacher on torch fp32; per output column the min and mean cosine go into the manifest
  (`fidelity`). Below `THRESHOLDS` (0.999 for fp32, 0.99 for bf16, 0.98 for int8) the run stops with a
  clear error unless `allow_low_fidelity`. A mean cosine below `SAME_MODEL_FLOOR` (0.5) always stops it:
  no rounding error comes near that, so the graph computes another model (a cache folder replaced, a
  broken export), which `allow_low_fidelity` does not accept.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from kd.common.cache import cache_dir
from kd.common.errors import InputError, KdError
from kd.common.hardware import default_threads, native_bf16, native_int8
from kd.common.progress import step
from kd.pipeline.backends import signal_stack
from kd.pipeline.backends.calibration import FIDELITY_ROWS, fidelity_sentences
from kd.pipeline.teacher.batches import encode_all
from kd.pipeline.teacher.model import Precision, Teacher
from kd.storage import fs


class Backend(str, Enum):
    auto = "auto"  # pipeline/backends/choice.py: resolved to one of the others when the teacher loads
    torch = "torch"
    onnx = "onnx"
    openvino = "openvino"


class Quantize(str, Enum):
    none = "none"
    int8 = "int8"


FORMAT = 3  # bump when the exported graphs change: cache folders of another format are rebuilt
SPEC = "kd_backend.json"
# min cosine to torch fp32 a backend must reach on the fidelity sample (per output column, over its rows):
# fp32 graphs, bf16 compute, int8 weights. int8 is 0.98: ONNX Runtime's dynamic quantization of MiniLM reaches
# min 0.9947 / mean 0.9967 smoothed (0.989 / 0.996 without; docs/design.md); a broken export falls far below.
THRESHOLDS = {"float32": 0.999, "bfloat16": 0.99, "int8": 0.98}
# Below this mean cosine the backend is not an approximation of the teacher but another function: int8 means
# measure >= 0.99, unrelated models about 0 (another model's graph in the cache: min -0.09). The mean, not the
# min: a lossy copy may have one outlier row (a 1-logit head's cosine is the sign of a logit near 0), another
# model is off on every row.
SAME_MODEL_FLOOR = 0.5
CLEAR_CACHE = "delete {folder} (the next run exports the teacher again), or point KD_CACHE at another folder"
EXTRAS = {Backend.onnx: ("onnxruntime", "onnx"), Backend.openvino: ("openvino", "openvino")}


def parse(backend: str | Backend, quantize: str | Quantize) -> tuple[Backend, Quantize]:
    try:
        b = Backend(backend)
    except ValueError:
        raise InputError(f"unknown --backend {backend!r}", "--backend", "use auto, torch, onnx or openvino") from None
    try:
        q = Quantize(quantize)
    except ValueError:
        raise InputError(f"unknown --quantize {quantize!r}", "--quantize", "use none or int8") from None
    return b, q


def check_options(backend: str | Backend, quantize: str | Quantize, precision: str | Precision,
                  device: str | None) -> tuple[Backend, Quantize]:
    """Refuse impossible combinations before anything is read or loaded."""
    b, q = parse(backend, quantize)
    p = Precision(precision)
    if b is Backend.auto:  # checked once resolved (backend_choice.choose refuses what auto cannot run)
        return b, q
    if b is Backend.torch:
        if q is Quantize.int8:
            raise InputError("--quantize int8 needs an exporting backend", "--backend torch --quantize int8",
                             "use --backend onnx or --backend openvino with --quantize int8")
        return b, q
    _require(b)
    flag = f"--backend {b.value}"
    if b is Backend.onnx and p in (Precision.bf16, Precision.fp16):
        raise InputError(f"--precision {p.value} is not offered by the onnx backend (it runs the fp32 graph)", flag,
                         "use --precision fp32 (or auto), --quantize int8 for speed, or --backend openvino for bf16")
    if b is Backend.openvino and p is Precision.fp16:
        raise InputError("--precision fp16 is not offered by the openvino backend (CPU)", flag,
                         "use --precision fp32, bf16 or auto")
    if device is not None and device != "cpu":
        if b is Backend.openvino:
            raise InputError(f"--device {device} is not offered by the openvino backend: it runs on the CPU", flag,
                             "use --device cpu (or leave it unset), or --backend torch for a GPU")
        if device.startswith("cuda") and "CUDAExecutionProvider" not in _ort().get_available_providers():
            raise InputError(f"--device {device}: this onnxruntime has no CUDA execution provider", flag,
                             "pip install onnxruntime-gpu, use --device cpu, or --backend torch for a GPU")
        if not device.startswith("cuda"):
            raise InputError(f"unknown --device {device!r} for the onnx backend", "--device", "use cpu or cuda")
    return b, q


def _require(b: Backend) -> Any:
    module, extra = EXTRAS[b]
    try:
        return __import__(module)
    except ImportError:
        raise KdError(f"--backend {b.value} needs {module}, which is not installed", f"--backend {b.value}",
                      f"pip install 'kd[{extra}]'") from None


def _ort():
    return _require(Backend.onnx)


def open_runner(folder: Path, b: Backend, q: Quantize, compute: str, threads: int | None, device: str | None) -> Runner:
    """The runner of a cached graph; a cache damaged past its checksums (or a runtime that cannot read it) is an
    error naming the folder."""
    return _guarded(folder, lambda: (OnnxRunner if b is Backend.onnx else OpenVinoRunner)(
        folder, q, compute, threads or default_threads(), device))


def measure_fidelity(teacher: Teacher, folder: Path) -> dict:
    return _guarded(folder, lambda: fidelity(teacher))


def _guarded(folder: Path, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except KdError:
        raise
    except Exception as e:  # onnxruntime and OpenVINO raise their own exception types
        raise KdError(f"the exported teacher cannot be run ({type(e).__name__}: {str(e)[:300]})", str(folder),
                      CLEAR_CACHE.format(folder=folder)) from e


def backend_precision(b: Backend, p: Precision) -> str:
    if b is Backend.openvino and (p is Precision.bf16 or (p is Precision.auto and native_bf16())):
        return "bfloat16"  # as torch: bf16 where the CPU has it natively (KD_CPU_BF16 overrides)
    return "float32"


# --- the runners -------------------------------------------------------------------------------------------


@dataclass
class Runner:
    """An exported teacher graph: hidden_0..hidden_L [+ logits] from the tokenizer's inputs."""

    folder: Path
    quantize: Quantize
    precision: str  # float32 | bfloat16 (the compute dtype of the fp32-weight parts)
    threads: int
    device: str | None = None
    fidelity: dict | None = None
    spec: dict = field(default_factory=dict)
    backend: Backend = Backend.torch

    def __post_init__(self) -> None:
        self.spec = json.loads((self.folder / SPEC).read_text(encoding="utf-8"))
        self._open()

    @property
    def graph(self) -> str:
        """The graph file the spec names, refused (StoreError) when it leads out of the cache folder."""
        return fs.member(fs.resolve(self.folder), self.spec["file"], str(self.folder / SPEC), "file")

    def _open(self) -> None:
        raise NotImplementedError

    def _run(self, feeds: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        raise NotImplementedError

    def run(self, enc: dict[str, Any], all_states: bool, logits: bool) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Hidden states (all, or only the last) and logits (or None), as numpy arrays; `enc` holds numpy arrays
        (or CPU tensors)."""
        feeds = {k: np.ascontiguousarray(enc[k], dtype=np.int64) for k in self.spec["inputs"]}
        n = self.spec["num_layers"]
        names = [f"hidden_{i}" for i in (range(n + 1) if all_states else [n])] + (["logits"] if logits else [])
        out = [np.asarray(x) for x in self._run(feeds, names)]
        return (out[:-1], out[-1]) if logits else (out, None)

    def meta(self) -> dict:
        # the int8 recipe is a setting: a store is not extended across it
        recipe = {k: self.spec[k] for k in ("smoothing", "int8_recipe") if k in self.spec}
        return {"backend": self.backend.value, "quantize": self.quantize.value, "precision": self.precision,
                **recipe, "fidelity": self.fidelity}


class OnnxRunner(Runner):
    def _open(self) -> None:
        ort = _ort()
        self.backend = Backend.onnx
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        providers = ["CPUExecutionProvider"]
        if self.device and self.device.startswith("cuda"):
            index = int(self.device.partition(":")[2] or os.environ.get("LOCAL_RANK", 0))
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": index}))
        self.session = ort.InferenceSession(self.graph, so, providers=providers)

    def _run(self, feeds, names):
        return self.session.run(names, feeds)


class OpenVinoRunner(Runner):
    def _open(self) -> None:
        ov = _require(Backend.openvino)
        self.backend = Backend.openvino
        config = {"INFERENCE_PRECISION_HINT": "bf16" if self.precision == "bfloat16" else "f32",
                  "INFERENCE_NUM_THREADS": self.threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
        with signal_stack.kept():  # the CPU plugin's own signal stack would outlive it (signal_stack.py)
            self.compiled = ov.Core().compile_model(self.graph, "CPU", config)
            self.request = self.compiled.create_infer_request()

    def _run(self, feeds, names):
        res = self.request.infer(feeds)  # outputs are copied (share_outputs=False)
        return [res[self.compiled.output(name)] for name in names]


# --- export and the cache ----------------------------------------------------------------------------------


def int8_method(b: Backend, q: Quantize) -> str | None:
    """OpenVINO's int8 recipe on this CPU: `static` (int8 activations too) where int8 dot products exist,
    `weights` (int8 weights, fp32 compute) elsewhere, where static int8 measured slower than fp32."""
    if b is not Backend.openvino or q is not Quantize.int8:
        return None
    return "static" if native_int8() else "weights"


def cache_folder(sha: str, b: Backend, q: Quantize) -> Path:
    method = int8_method(b, q)
    return cache_dir() / "teachers" / (f"{sha}-{b.value}-{q.value}" + (f"-{method}" if method else ""))


def sound_cache(sha: str, b: Backend, q: Quantize) -> Path | None:
    """The cache folder of these weights' graph on `b`, when it holds a sound one (every file as recorded); else
    None."""
    folder = cache_folder(sha, b, q)
    return folder if _sound(folder, _want(sha, b, q)) else None


def _want(sha: str, b: Backend, q: Quantize) -> dict:
    """What a cache folder's spec must say to serve (weights, backend, quantize)."""
    want = {"format": FORMAT, "weights_sha256": sha, "backend": b.value, "quantize": q.value}
    method = int8_method(b, q)
    if method:
        want["int8_method"] = method
    return want


def exported(teacher: Teacher, b: Backend, q: Quantize) -> Path:
    """The cache folder for (teacher weights, backend, quantize), exported now unless a sound one exists."""
    sha = teacher.meta([], "float32")["weights_sha256"]
    final = cache_folder(sha, b, q)
    want = _want(sha, b, q)
    if _sound(final, want):
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    except OSError as e:  # KD_CACHE (or a folder in it) is a file, or not writable
        raise KdError(f"the export cache cannot be written ({e})", str(final.parent),
                      "point KD_CACHE at a writable folder, or remove the file in its place") from e
    try:
        with step(f"exporting {teacher.name} for {b.value}" + ("" if q is Quantize.none else f" {q.value}")
                  + " (once: kept in the kd cache)"):
            spec = {**want, **_export(teacher, b, q, tmp)}
        spec["files"] = {f: fs.file_sha256(tmp / f) for f in sorted(os.listdir(tmp))}
        (tmp / SPEC).write_text(json.dumps(spec, indent=1), encoding="utf-8")
        if _sound(final, want):
            return final  # another process (a writer beside this one) published its copy meanwhile
        _clear(final)  # damaged, half-copied by hand, or of another format
        try:
            os.replace(tmp, final)
        except OSError:
            if not _sound(final, want):  # another process published its own copy first: keep it
                raise
    except OSError as e:
        raise KdError(f"cannot write the exported teacher ({e})", str(final),
                      "check the disk space and permissions there; " + CLEAR_CACHE.format(folder=final)) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _export(teacher: Teacher, b: Backend, q: Quantize, tmp: Path) -> dict:
    """Write the graph for (b, q) into `tmp` (backends/export.py: imported here, so a warm run never loads torch's
    exporters); returns its spec entries."""
    from kd.pipeline.backends import export  # lazy: torch; a cached export runs without it (warm precompute)

    _ort() if b is Backend.onnx else _require(Backend.openvino)
    int8 = None if q is Quantize.none else ("dynamic" if b is Backend.onnx else int8_method(b, q))
    return export.write_graph(teacher, b.value, int8, tmp)


def _clear(path: Path) -> None:
    """Remove what occupies a cache folder's name: a folder (its symlinks removed, never followed) or a file."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _sound(folder: Path, want: dict) -> bool:
    """A complete cache folder for `want`: spec readable and matching, the graph among its files, every file
    inside the folder (`fs.member`: no '..', no symlink out of it) and present with its sha256. Anything else
    is rebuilt by `exported`, so a file outside the cache is never read."""
    try:
        spec = json.loads((folder / SPEC).read_text(encoding="utf-8"))
        if (not all(spec.get(k) == v for k, v in want.items()) or not spec.get("files")
                or spec.get("file") not in spec["files"]):
            return False
        loc, where = fs.resolve(folder), str(folder / SPEC)
        return all(fs.file_sha256(fs.member(loc, f, where, "files")) == h for f, h in spec["files"].items())
    except (OSError, ValueError, AttributeError, TypeError, KdError):
        return False


def _remove_stale_temps(parent: Path, age_s: float = 3600) -> None:
    """Temp folders of exports killed more than an hour ago (a running export's folder is younger)."""
    for p in parent.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            if time.time() - p.stat().st_mtime > age_s:
                shutil.rmtree(p, ignore_errors=True)


# --- fidelity ----------------------------------------------------------------------------------------------


def fidelity_texts(teacher: Teacher) -> list:
    """FIDELITY_ROWS bundled sentences mixing four sources (pipeline.backends.calibration); pairs for cross-encoders."""
    s = fidelity_sentences()
    return list(zip(s[:FIDELITY_ROWS], s[FIDELITY_ROWS:])) if teacher.has_head else s[:FIDELITY_ROWS]


def fidelity(teacher: Teacher, texts: list | None = None) -> dict:
    """{column: {min_cosine, mean_cosine, sample_rows}} of the teacher's backend against torch fp32."""

    texts = fidelity_texts(teacher) if texts is None else texts
    outputs = teacher.available()
    got = encode_all(teacher, texts, outputs)[0]
    ref = encode_all(replace(teacher, backend=None, autocast=None), texts, outputs)[0]
    return {col: _cosines(got[col], ref[col], len(texts)) for col in sorted(got)}


def _cosines(a: np.ndarray, b: np.ndarray, rows: int) -> dict:
    """Cosine per row (per row and layer for `layers`), min and mean."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    cos = (a * b).sum(-1) / np.maximum(den, 1e-30)
    return {"min_cosine": round(float(cos.min()), 6), "mean_cosine": round(float(cos.mean()), 6), "sample_rows": rows}


def threshold(runner: Runner) -> float:
    limit = THRESHOLDS[runner.precision]
    return min(limit, THRESHOLDS["int8"]) if runner.quantize is Quantize.int8 else limit


class LowFidelity(KdError):
    """A backend's min cosine to torch fp32 is below its threshold (`--backend auto` then runs torch)."""


def check_fidelity(teacher: Teacher, allow_low_fidelity: bool = False) -> None:
    """Refuse a backend whose min cosine is below its precision's threshold (unless allowed), and always
    one whose mean cosine is below the floor that separates a lossy copy of the teacher from another model."""
    runner = teacher.backend
    limit = threshold(runner)
    other = {c: f["mean_cosine"] for c, f in runner.fidelity.items() if f["mean_cosine"] < SAME_MODEL_FLOOR}
    if other:
        worst = ", ".join(f"{c} {v:.4f}" for c, v in other.items())
        raise KdError(
            f"teacher {teacher.name!r} on --backend {runner.backend.value} --quantize {runner.quantize.value} "
            f"computes another model: mean cosine to torch fp32 {worst} < {SAME_MODEL_FLOOR} over "
            f"{FIDELITY_ROWS} bundled sentences (no precision loss comes near that; --allow-low-fidelity does "
            "not accept it)", str(runner.folder),
            "delete that exported folder (kd rebuilds it from the teacher), or use --backend torch")
    low = {c: f["min_cosine"] for c, f in runner.fidelity.items() if f["min_cosine"] < limit}
    if low and not allow_low_fidelity:
        worst = ", ".join(f"{c} {v:.4f}" for c, v in low.items())
        raise LowFidelity(
            f"teacher {teacher.name!r} on --backend {runner.backend.value} --quantize {runner.quantize.value} "
            f"({runner.precision}) departs from torch fp32: min cosine {worst} < {limit} over "
            f"{FIDELITY_ROWS} bundled sentences",
            f"--backend {runner.backend.value} --quantize {runner.quantize.value}, graph exported to {runner.folder}",
            "use --quantize none, --precision fp32 or --backend torch; or accept it with --allow-low-fidelity "
            "(the measured cosines are recorded in the manifest); if the cached graph may be damaged, "
            + CLEAR_CACHE.format(folder=runner.folder))
