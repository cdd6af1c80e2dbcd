"""SmoothQuant (Xiao et al., 2023, arXiv:2211.10438) for ONNX Runtime's dynamic int8, on the exported graph.

Why: dynamic quantization gives each activation tensor one int8 scale per batch. A transformer's LayerNorm
outputs carry a few channels up to ~100x larger than the rest, so that scale fits the outliers and every
other channel keeps only a few levels: on MiniLM, short sentences fell to cosine 0.97 with fp32. Moving
part of each outlier channel's range into the weights (which are quantized per output channel and do not
mind) flattens the activations at no run-time cost beyond one elementwise Mul per LayerNorm output.

- Targets: every LayerNormalization output that MatMuls with a 2-D weight initializer read (BERT: query, key
  and value; the feed-forward up-projection). Other MatMul inputs (the attention context, post-GELU) are
  left alone: smoothing them was measured to lower fidelity (docs/design.md).
- Calibrate: run the fp32 graph on bundled sentences with those tensors as extra outputs; per channel j,
  a_j = max |x_j| over every position, padding included (the run-time scale is taken over the whole
  tensor, and padded positions carry their own outliers: real tokens only measured worse than no smoothing,
  min cosine 0.978 vs 0.991 on the fidelity sample); w_j = max |W[j, :]| over every weight that reads x.
- Smooth: s_j = a_j^alpha / w_j^(1 - alpha); insert x' = x * (1/s) after the LayerNorm and scale row j of
  each reading weight by s_j. x' W' = x W in exact arithmetic, so the fp32 graph computes the same outputs;
  the hidden states the graph returns are the LayerNorm outputs themselves, untouched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ALPHA = 0.5  # the paper's default; 0.65 and 0.8 measured no better on MiniLM


@dataclass
class Target:
    """One LayerNorm output and the MatMuls that read it with a weight initializer."""

    tensor: str
    producer: int  # index of the LayerNormalization node in graph.node
    matmuls: list  # onnx NodeProto


def targets(graph) -> list[Target]:
    """LayerNormalization outputs read by MatMuls with 2-D weight initializers used nowhere else."""
    weights = {i.name for i in graph.initializer if len(i.dims) == 2}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = []
    for index, node in enumerate(graph.node):
        if node.op_type not in ("LayerNormalization", "SkipLayerNormalization"):
            continue
        x = node.output[0]
        # a weight read by another node too (tied embeddings) cannot be rescaled for this input alone
        matmuls = [n for n in readers.get(x, []) if n.op_type == "MatMul" and n.input[0] == x
                   and n.input[1] in weights and len(readers[n.input[1]]) == 1]
        if matmuls:
            found.append(Target(x, index, matmuls))
    return found


def channel_absmax(model_path: Path, tensors: list[str], feeds: Iterable[dict[str, np.ndarray]],
                   threads: int) -> dict[str, np.ndarray]:
    """Per-channel max |x| of each tensor over every position of `feeds`, by ONNX Runtime in fp32."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_path), load_external_data=False)
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
                              for t in tensors if t not in known)
    probe = model_path.with_name(model_path.name + ".probe.onnx")
    onnx.save(model, str(probe))  # external weights, if any, stay in the file beside it
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.log_severity_level = threads, 3
        session = ort.InferenceSession(str(probe), so, providers=["CPUExecutionProvider"])
        absmax: dict[str, np.ndarray] = {}
        for feed in feeds:
            for name, x in zip(tensors, session.run(tensors, feed)):
                m = np.abs(x.reshape(-1, x.shape[-1])).max(0)
                absmax[name] = np.maximum(absmax[name], m) if name in absmax else m
        return absmax
    finally:
        probe.unlink(missing_ok=True)


def smooth(model, found: list[Target], absmax: dict[str, np.ndarray], alpha: float = ALPHA) -> None:
    """Insert x * (1/s) after each target LayerNorm and fold s into the rows of its readers' weights."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    # insert from the last producer backwards so earlier indices stay valid
    for t in sorted(found, key=lambda t: t.producer, reverse=True):
        w = [numpy_helper.to_array(inits[n.input[1]]) for n in t.matmuls]
        w_max = np.max([np.abs(x).max(1) for x in w], axis=0)
        s = np.power(np.maximum(absmax[t.tensor], 1e-5), alpha) / np.power(np.maximum(w_max, 1e-5), 1 - alpha)
        s = np.clip(s, 1e-3, 1e3).astype(np.float32)  # a dead channel must not become a huge weight row
        inverse, smoothed = f"{t.tensor}/smooth_inverse", f"{t.tensor}/smoothed"
        graph.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32), inverse))
        graph.node.insert(t.producer + 1, helper.make_node("Mul", [t.tensor, inverse], [smoothed],
                                                           name=f"{t.tensor}/smooth"))
        for node, weight in zip(t.matmuls, w):
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(weight * s[:, None], node.input[1]))
            node.input[0] = smoothed
