"""`kd export STUDENT --format onnx`: the whole student as one ONNX graph, for deployment without torch.

Layout of the output folder:
    model.onnx        input_ids, attention_mask [batch, sequence] (int64) -> sentence_embedding [batch, dim]
    tokenizer.json    the student's tokenizer (+ the other tokenizer files)
    kd_onnx.json      how to feed it: max_length, truncation side, pad id, special tokens added, normalise or not

- The graph is the student from token ids to the pooled, mapped vector: pooling and head are inside, so a
  runtime only tokenizes, pads to the batch's longest row and runs the graph.
- Recurrent students train and encode on packed sequences, which ONNX has no form of. The export runs each
  direction as its own recurrence instead: forward on the padded batch (padding comes after the real tokens,
  so it cannot reach them), backward on each row reversed within its own length; padded outputs are zeroed.
  The same numbers as packing, with any amount of padding.
- `OnnxEncoder(folder).encode(texts)` (or `onnx_encode(folder, texts)` for one call) runs an exported folder
  with onnxruntime and the `tokenizers` library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from kd.common.errors import KdError
from kd.common.fast_tokenizer import FastTokenizer, TokenizerSettings
from kd.common.onnx_int8 import METHOD as INT8_METHOD
from kd.common.onnx_int8 import quantize_int8
from kd.common.padding import pad_rows
from kd.common.quiet import quiet
from kd.common.token_batches import CPU_BATCH_TOKENS, run_sorted
from kd.student.exporters.folder import export_folder
from kd.student.models import RecurrentEncoder, Student
from kd.student.saved import load

ONNX, SPEC = "model.onnx", "kd_onnx.json"
OPSET = 18


def export_onnx(student_dir: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False,
                quantize: str = "none") -> Path:
    """Write `out` as an ONNX folder (graph, tokenizer, kd_onnx.json) reproducing the student's encode;
    `quantize="int8"`: the matrix products with int8 weights (common/onnx_int8.py; the token table stays fp32)."""

    with export_folder(out, student_dir, overwrite) as (target, scratch):
        st = load(student_dir)
        work = scratch / "model"
        work.mkdir()
        graph = ExportableStudent(st.model).eval()
        ids = torch.tensor([[2, 5, 6, 7, 3], [2, 5, 3, 0, 0]])  # any ids: shapes only, axes are dynamic
        mask = (ids != 0).long()
        # torch.export (dynamo) keeps batch and sequence symbolic; the TorchScript exporter bakes the example's
        # length into attention reshapes
        axes = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")},) * 2
        fp32 = work / (ONNX if quantize == "none" else "model.fp32.onnx")
        _forget_rnn_dispatch()
        with torch.no_grad(), quiet():
            torch.onnx.export(graph, (ids, mask), str(fp32), input_names=["input_ids", "attention_mask"],
                              output_names=["sentence_embedding"], opset_version=OPSET, dynamo=True,
                              dynamic_shapes=axes, optimize=True, verbose=False,
                              external_data=False)  # one file: students are far below ONNX's 2 GB limit
        _require_dynamic_axes(fp32)
        _drop_stack_traces(fp32)
        if quantize == "int8":
            quantize_int8(fp32, work / ONNX)
            fp32.unlink()
        st.tokenizer.save_pretrained(work)
        spec = {"format": "kd-onnx", "arch": st.config.arch.value, "dim": st.dim, "max_length": st.config.max_length,
                "first_ids": st.config.first_ids,
                "pad_id": st.config.pad_id, "add_special_tokens": True,
                "truncation_side": st.tokenizer.truncation_side, "pooling": "in the graph",
                "normalize": False, "inputs": ["input_ids", "attention_mask"], "output": "sentence_embedding",
                "quantize": quantize} | ({"quantization": INT8_METHOD} if quantize == "int8" else {})
        (work / SPEC).write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return target


def _forget_rnn_dispatch() -> None:
    """Let LSTM/GRU resolve their kernels afresh before an export.

    torch.onnx registers a while-loop decomposition of LSTM/GRU for each dynamic-shape export (so the sequence
    axis stays symbolic) and removes it afterwards, but the op's dispatch cache keeps what the first export
    resolved: a second export in the same process (fp32 then int8, two students) traced the recurrence without
    it and baked the example's length (5) into the graph (torch 2.13, tests/student/test_export_formats.py)."""
    for op in (torch.ops.aten.lstm.input, torch.ops.aten.gru.input):
        getattr(op, "_dispatch_cache", {}).clear()


# torch's exporter writes, on every node, the Python stack that made it: file paths of kd and torch where they are
# installed, so one student exported from two clones gave two graphs (the byte-identity check of issue 52).
STACK_TRACE = "pkg.torch.onnx.stack_trace"


def _drop_stack_traces(path: Path) -> None:
    """The graph without the exporter's per-node stack traces (nodes of loop bodies included)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def clean(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            kept = [p for p in node.metadata_props if p.key != STACK_TRACE]
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    clean(sub)

    clean(model.graph)
    onnx.save(model, str(path))


def _require_dynamic_axes(path: Path) -> None:
    """Refuse a graph whose batch or sequence axis came out fixed: it would fail on every other shape."""
    import onnx

    for tensor in onnx.load(str(path), load_external_data=False).graph.input:
        fixed = [d.dim_value for d in tensor.type.tensor_type.shape.dim if not d.dim_param]
        if fixed:
            raise KdError(f"the exported graph fixed input {tensor.name}'s shape ({fixed})", str(path),
                          "export in a fresh process (kd export does), and report it with your torch version")


def student_settings(spec: dict) -> TokenizerSettings:
    """How an export's tokenizer feeds the graph: as the student trained, right-padded, truncated on the side its
    tokenizer was saved with (exports written before kd recorded it truncated on the right)."""
    return TokenizerSettings(("input_ids", "attention_mask"), int(spec["pad_id"]), 0, "right",
                             spec.get("truncation_side", "right"))


class OnnxEncoder:
    """An exported folder loaded once (tokenizer + onnxruntime session, no torch): `encode(texts)`.

    - Tokenize all texts (special tokens, truncation as kd_onnx.json says), cut them into token-budget batches
      of similar lengths (less padding, activations that stay in cache), pad each to its longest row, run,
      restore order.
    - `threads`: onnxruntime's intra-op pool (default: its own choice, one per core).
    """

    def __init__(self, folder: str | os.PathLike, threads: int | None = None) -> None:
        import onnxruntime as ort

        folder = Path(folder)
        self.spec = json.loads((folder / SPEC).read_text(encoding="utf-8"))
        self.tokenizer = FastTokenizer.from_file(str(folder / "tokenizer.json"), student_settings(self.spec))
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(str(folder / ONNX), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}

    def encode(self, texts: Sequence[str], batch_size: int = 64, normalize: bool = True) -> np.ndarray:
        """float32 [n, dim] in input order; unit vectors unless `normalize=False` (as the student's `encode`)."""
        spec = self.spec
        ids = self.tokenizer.encode(list(texts), max_length=spec["max_length"],
                                    first_ids=bool(spec.get("first_ids", False)))["input_ids"]
        lengths = np.array([len(x) for x in ids], dtype=np.int64)

        def run(idx: np.ndarray) -> np.ndarray:
            block, mask = pad_rows([ids[i] for i in idx], spec["pad_id"], min_width=1)
            feeds = {"input_ids": block, "attention_mask": mask}
            # a graph that never reads the mask (e.g. cls pooling without attention) has no such input
            return self.session.run(["sentence_embedding"], {k: v for k, v in feeds.items() if k in self.inputs})[0]

        # CPU's token budget: this session runs on the CPU execution provider. The rows are as wide as the graph's
        # output; the spec's `dim` sizes an empty result only, so a forged one allocates nothing
        out = run_sorted(lengths, CPU_BATCH_TOKENS, run, int(spec["dim"]), max_batch=batch_size)
        if normalize or spec["normalize"]:
            out /= np.linalg.norm(out, axis=1, keepdims=True).clip(1e-12)
        return out


def onnx_encode(folder: str | os.PathLike, texts: Sequence[str], batch_size: int = 64,
                normalize: bool = True) -> np.ndarray:
    """Encode texts with an exported folder in one call (`OnnxEncoder` keeps the session for many calls)."""
    return OnnxEncoder(folder).encode(texts, batch_size, normalize)


class MaskedRecurrent(nn.Module):
    """A RecurrentEncoder without packing: each direction separately, the backward one on rows reversed
    within their lengths (the same outputs as packed sequences, and exportable)."""

    def __init__(self, enc: RecurrentEncoder) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList(_split_directions(rnn)) for rnn in enc.rnns)

    def forward(self, x: Tensor, mask: Tensor) -> list[Tensor]:
        lengths = mask.long().sum(1, keepdim=True)  # [B, 1]
        t = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # [1, T]
        # position t of a reversed row reads position len-1-t; padding positions stay where they are
        rev = torch.where(t < lengths, lengths - 1 - t, t).unsqueeze(-1)  # [B, T, 1]
        keep = mask.unsqueeze(-1).to(x.dtype)
        states = []
        for fwd, bwd in self.layers:
            f, _ = fwd(x)
            b, _ = bwd(x.gather(1, rev.expand(-1, -1, x.shape[2])))
            b = b.gather(1, rev.expand(-1, -1, b.shape[2]))
            x = torch.cat([f, b], -1) * keep  # pad_packed_sequence leaves zeros at padding
            states.append(x)
        return states


class ExportableStudent(nn.Module):
    """Student.forward's embedding from (input_ids, attention_mask), recurrent encoders without packing."""

    def __init__(self, student: Student) -> None:
        super().__init__()
        self.student = student
        enc = student.encoder
        self.encoder = MaskedRecurrent(enc) if isinstance(enc, RecurrentEncoder) else enc

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        s = self.student
        mask = attention_mask.bool()
        states = self.encoder(s.embed(input_ids), mask)
        return s.head(s.pool(states[-1], mask))


def _split_directions(rnn: nn.Module) -> list[nn.Module]:
    """A bidirectional LSTM/GRU layer as two one-direction layers holding its weights."""
    fwd, bwd = (type(rnn)(rnn.input_size, rnn.hidden_size, batch_first=True) for _ in range(2))
    with torch.no_grad():
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(fwd, name).copy_(getattr(rnn, name))
            getattr(bwd, name).copy_(getattr(rnn, f"{name}_reverse"))
    return [fwd.eval(), bwd.eval()]
