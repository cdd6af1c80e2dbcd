"""Export a torch teacher to an ONNX graph (then OpenVINO IR, int8 where asked): the graphs `backends/runtime.py`
caches and runs. Only the first run for a (weights, backend, quantize) comes here, so torch, onnx, onnxruntime's
quantizer, OpenVINO's converter and NNCF are imported by this module alone, and a warm run never loads it.

- `write_graph` traces the HF model (every hidden state [+ logits]) to ONNX with dynamic batch and sequence axes
  (`to_onnx`: torch's legacy tracer, dynamo past 2 GB), then per target: the fp32 ONNX graph; ONNX Runtime's
  dynamic int8 after SmoothQuant; OpenVINO IR in fp32, static int8 (NNCF, calibrated) or int8 weights.
- It returns the spec entries the cache records (file, inputs, outputs, opset, versions, the int8 recipe).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kd.common.errors import KdError
from kd.common.onnx_int8 import has_external_data, quantize_int8
from kd.common.quiet import quiet
from kd.pipeline.backends import signal_stack, smooth_quant
from kd.pipeline.backends.calibration import CALIBRATION_ROWS, calibration_sentences
from kd.pipeline.teacher.model import Teacher

OPSET = 18  # dynamo exporter
LEGACY_OPSET = 17  # torchscript exporter
# NNCF's SmoothQuant strength for OpenVINO static int8 (its default is 0.95). MiniLM, 3,000 Leipzig sentences,
# min cosine to torch fp32: 0.95 -> 0.9786, 0.85 -> 0.9878, 0.8 -> 0.9875, 0.75 -> 0.9904, 0.7 -> 0.9911,
# 0.5 -> 0.9679, off -> 0.9727 (docs/design.md)
OPENVINO_SMOOTH_ALPHA = 0.7
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class _Encoder(torch.nn.Module):
    """The HF model as a graph: inputs by name -> every hidden state [+ logits]."""

    def __init__(self, model: torch.nn.Module, head: bool) -> None:
        super().__init__()
        self.model, self.head = model, head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        kw = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, **kw, output_hidden_states=True,
                         return_dict=True)
        return (*out.hidden_states, out.logits) if self.head else tuple(out.hidden_states)


def write_graph(teacher: Teacher, runtime: str, int8: str | None, tmp: Path) -> dict:
    """Write the graph for `runtime` (onnx | openvino) into `tmp`; `int8`: None (fp32 graph), `dynamic` (ONNX
    Runtime), `static` or `weights` (OpenVINO, `backends.int8_method`). Returns the spec entries (file, inputs,
    outputs, versions)."""
    inputs = [n for n in INPUTS if n in teacher.tokenizer.model_input_names]
    outputs = [f"hidden_{i}" for i in range(teacher.num_layers + 1)] + (["logits"] if teacher.has_head else [])
    texts = ["the cat sat on the mat", "a dog"]
    enc = (teacher.tokenizer(texts, texts[::-1], padding=True, return_tensors="pt") if teacher.has_head
           else teacher.tokenizer(texts, padding=True, return_tensors="pt"))  # two rows, padding: shapes only
    args = tuple(enc[n].to(torch.int64) for n in inputs)
    fp32 = tmp / "model.fp32.onnx"
    graph = _Encoder(teacher.model, teacher.has_head).eval()
    big = teacher.model.num_parameters() * 4 > 1.5e9  # the 2 GB protobuf limit: weights in an external file
    exporter = to_onnx(graph, args, fp32, inputs, outputs, big)
    versions = {"torch": torch.__version__, "exporter": exporter}
    spec: dict = {}
    if runtime == "onnx":
        versions["onnxruntime"] = version("onnxruntime")
        file = "model.onnx"
        if int8:
            spec["smoothing"] = smooth_onnx(teacher, fp32, inputs)
            quantize_int8(fp32, tmp / file)
            _remove_onnx(fp32, keep=tmp / file)
        else:
            fp32.rename(tmp / file)
    else:
        file = "model.xml"
        with signal_stack.kept():  # NNCF compiles models too (pipeline/backends/signal_stack.py)
            ov_versions, recipe = _openvino_ir(fp32, tmp / file, int8,
                                               lambda: _calibration_feeds(teacher, inputs, by_length=True))
        versions |= ov_versions
        if recipe:
            spec["int8_recipe"] = recipe
        _remove_onnx(fp32)
    return {**spec, "file": file, "inputs": inputs, "outputs": outputs, "num_layers": teacher.num_layers,
            "opset": LEGACY_OPSET if exporter == "torchscript" else OPSET, "versions": versions}


def to_onnx(graph: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
             big: bool) -> str:
    """Export `graph` with dynamic batch and sequence axes; returns the exporter used.

    - torchscript (torch's legacy tracer) first: on MiniLM, 3,000 sentences, 2 threads, ONNX Runtime runs its
      graph 1.10x faster in fp32 and 1.14x in int8 than the dynamo graph's (whose GELU and attention
      transposes ONNX Runtime does not fuse), with the same outputs (docs/design.md). Tracing records one
      path through Python branches; the encoders' branches depend on shapes only through padding that is
      always zero here, and the fidelity check after loading compares every column with torch anyway.
    - dynamo (torch.export) for models past the protobuf limit, and wherever the legacy exporter is gone
      (it is deprecated since torch 2.9).
    """
    if not big:
        axes = {n: {0: "batch", 1: "sequence"} for n in [*inputs, *outputs]}
        try:
            with torch.no_grad(), quiet():
                torch.onnx.export(graph, args, str(path), input_names=inputs, output_names=outputs,
                                  opset_version=LEGACY_OPSET, dynamo=False, dynamic_axes=axes)
            return "torchscript"
        except (TypeError, ValueError, NotImplementedError, ImportError, AttributeError):
            path.unlink(missing_ok=True)  # a torch without the legacy exporter: dynamo below
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}
    with torch.no_grad(), quiet():
        torch.onnx.export(graph, args, str(path), input_names=inputs, output_names=outputs, opset_version=OPSET,
                          dynamo=True, dynamic_shapes={n: dims for n in inputs}, optimize=True, verbose=False,
                          external_data=big)
    return "dynamo"


def _remove_onnx(path: Path, keep: Path | None = None) -> None:
    """The fp32 graph and its external-data file, if any (big models)."""
    for p in path.parent.iterdir():
        if p != keep and p.name.startswith(path.name):
            p.unlink()


def smooth_onnx(teacher: Teacher, path: Path, inputs: list[str]) -> dict:
    """SmoothQuant the fp32 graph in place before int8 (pipeline/backends/smooth_quant.py), calibrated on bundled
    sentences disjoint from the fidelity sample, so the fidelity measured after loading is not flattered."""
    import onnx


    feeds = _calibration_feeds(teacher, inputs)
    model = onnx.load(str(path))
    found = smooth_quant.targets(model.graph)
    absmax = smooth_quant.channel_absmax(path, [t.tensor for t in found], feeds, torch.get_num_threads())
    smooth_quant.smooth(model, found, absmax)
    onnx.save(model, str(path), save_as_external_data=has_external_data(path), location=f"{path.name}.data")
    return {"method": "smoothquant", "alpha": smooth_quant.ALPHA, "calibration_rows": CALIBRATION_ROWS,
            "layer_norms": len(found)}


def _calibration_feeds(teacher: Teacher, inputs: list[str], by_length: bool = False
                       ) -> list[dict[str, np.ndarray]]:
    """CALIBRATION_ROWS bundled sentences (pairs for cross-encoders) after the fidelity sample's, so the
    fidelity measured after loading is not flattered; batches of 32, in corpus order (padding included, for
    SmoothQuant's run-time-scaled activations) or sorted by length as precompute batches them (for static
    activation ranges, which padded positions' outliers would widen: min cosine 0.9857 vs 0.99 on MiniLM)."""
    s = calibration_sentences()
    texts = list(zip(s[::2], s[1::2])) if teacher.has_head else s[:CALIBRATION_ROWS]
    if by_length:
        texts = sorted(texts, key=lambda t: len(t[0]) + len(t[1]) if teacher.has_head else len(t))
    feeds = []
    for i in range(0, len(texts), 32):
        batch = texts[i:i + 32]
        args = tuple(zip(*batch)) if teacher.has_head else (batch,)
        enc = teacher.tokenizer(*args, padding=True, truncation=True, max_length=teacher.max_length,
                                return_tensors="np")
        feeds.append({n: enc[n].astype(np.int64) for n in inputs})
    return feeds


def _openvino_ir(src: Path, dst: Path, method: str | None, calibration: Callable[[], list[dict[str, np.ndarray]]]
                 ) -> tuple[dict, dict | None]:
    """The ONNX graph as OpenVINO IR, fp32 weights kept (save_model would store fp16); returns the versions used
    and the int8 recipe (None without int8). int8 by `method`:
    - static: NNCF post-training quantization for transformers (int8 weights per channel, int8 activations
      with ranges from `calibration()` feeds, SmoothQuant alpha OPENVINO_SMOOTH_ALPHA; softmax, LayerNorm and
      GELU stay fp32): int8 x int8 matmuls, which VNNI/AMX run ~4x fp32's rate;
    - weights: NNCF's data-free int8 weight compression (asymmetric, per output channel) of every MatMul."""
    import openvino as ov

    model = ov.convert_model(str(src))
    versions = {"openvino": ov.__version__.split("-")[0]}
    if method is None:
        ov.save_model(model, str(dst), compress_to_fp16=False)
        return versions, None
    try:
        import nncf
    except ImportError:
        raise KdError("--backend openvino --quantize int8 needs nncf, which is not installed",
                      "--quantize int8", "pip install 'kd[openvino]'") from None
    with quiet("torch.onnx", "nncf"):  # its statistics table and progress bar
        if method == "static":
            feeds = calibration()
            smooth = nncf.AdvancedSmoothQuantParameters(matmul=OPENVINO_SMOOTH_ALPHA)
            fp32_matmuls = _activation_matmuls(model)
            model = nncf.quantize(model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(feeds), ignored_scope=nncf.IgnoredScope(names=fp32_matmuls),
                                  advanced_parameters=nncf.AdvancedQuantizationParameters(smooth_quant_alphas=smooth))
            recipe = {"method": "static", "smooth_quant_alpha": OPENVINO_SMOOTH_ALPHA,
                      "calibration_rows": CALIBRATION_ROWS, "fp32_matmuls": len(fp32_matmuls)}
        else:
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
            recipe = {"method": "weights"}
    versions["nncf"] = nncf.__version__
    ov.save_model(model, str(dst), compress_to_fp16=False)
    return versions, recipe


def _activation_matmuls(model: Any) -> list[str]:
    """MatMuls of two activations (attention scores Q.K^T and probabilities.V), kept fp32 by static int8: a
    few % of MiniLM's FLOPs on short sentences, but quantizing softmax outputs to 8 bits cost the most
    fidelity (min cosine to fp32 over 3,000 sentences 0.9866 -> 0.9921 kept fp32, at the same speed)."""
    return [op.get_friendly_name() for op in model.get_ops() if op.get_type_name() == "MatMul"
            and all(op.input_value(i).get_node().get_type_name() != "Constant" for i in range(2))]
