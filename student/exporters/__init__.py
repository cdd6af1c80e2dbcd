"""`kd export`: a trained student in another format, the same vectors.

- `sentence-transformers` (st_directory.py): built-in modules wherever they reproduce the student (st_fit.py,
  st_builtin.py), kd's `KdTokenEncoder` otherwise (load those with `kd.student.load_exported`, never
  `trust_remote_code`); `export_note` says which, and what differs, for `kd export` to print;
- `onnx` (onnx_graph.py): the whole student as one graph (`--quantize int8`: int8 weights, common/onnx_int8.py);
  `OnnxEncoder` runs it with onnxruntime alone;
- folder.py: the output folder's gate and the atomic swap both formats use.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from kd.common.bounds import ExportFormat, Quantize, choices
from kd.common.errors import InputError, located

FORMATS = choices(ExportFormat)
QUANTIZE = choices(Quantize)


def export_student(student_dir: str | os.PathLike, fmt: str, out: str | os.PathLike, overwrite: bool = False,
                   quantize: str = "none") -> Path:
    """`kd export`: the student in another format (checked before anything is read or written)."""
    if fmt not in FORMATS:
        raise InputError(f"unknown export format {fmt!r}", fmt, f"--format is one of {', '.join(FORMATS)}")
    if quantize not in QUANTIZE:
        raise InputError(f"unknown quantization {quantize!r}", quantize, f"--quantize is one of {', '.join(QUANTIZE)}")
    if quantize != "none" and fmt != "onnx":
        raise InputError(f"--quantize {quantize} is for --format onnx", fmt,
                         "add --format onnx (a sentence-transformers folder keeps the student's fp32 weights)")
    needs = ("onnx", "onnxruntime", "onnxscript") if fmt == "onnx" else ("sentence_transformers",)
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"--format {fmt} needs {', '.join(missing)}, which is not installed", fmt,
                         f"pip install {' '.join(m.replace('_', '-') for m in missing)} (kd's 'export' extra)")
    with located(os.fspath(out)):  # a full disk inside safetensors' or ONNX's writer names no file: it is --out
        if fmt == "onnx":
            from kd.student.exporters.onnx_graph import export_onnx

            return export_onnx(student_dir, out, overwrite, quantize)
        from kd.student.exporters.st_directory import export_sentence_transformers

        return export_sentence_transformers(student_dir, out, overwrite)


def export_note(student_dir: str | os.PathLike, fmt: str) -> str | None:
    """What a user of this export should know (st_fit.export_note): why plain SentenceTransformer(path) cannot load
    it, or which texts it encodes differently; None for ONNX and for an exact built-in export."""
    if fmt != "sentence-transformers":
        return None
    from kd.student.exporters.st_fit import export_note as note
    from kd.student.models import StudentConfig
    from kd.student.saved import read_config

    return note(StudentConfig.from_dict(read_config(student_dir)["student"]))
