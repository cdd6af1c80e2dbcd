"""`kd export`: a trained student in another format, the same vectors.

- `sentence-transformers` (st_directory.py): built-in modules wherever they reproduce the student (st_fit.py,
  st_builtin.py), kd's `KdTokenEncoder` otherwise (load those with `kd.student.load_exported`, never
  `trust_remote_code`); `export_note` says which, for `kd export` to print;
- `onnx` (onnx_graph.py): the whole student as one graph (`--quantize int8`: int8 weights, common/onnx_int8.py);
  `OnnxEncoder` runs it with onnxruntime alone;
- folder.py: the output folder's gate and the atomic swap both formats use.

Light to import (`ExportConfig`'s fields are `kd export`'s options, read by `kd --help`): the exporters load on use.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kd.common.bounds import ExportFormat, Quantize, choices
from kd.common.errors import InputError, located
from kd.common.options import check_ranges, option, with_options

FORMATS = choices(ExportFormat)
QUANTIZE = choices(Quantize)


@dataclass(frozen=True)
class ExportConfig:
    """Every option of `kd export`, declared once (kd.common.options); light to import: `kd --help` builds the
    command from these fields. Checked when built, before anything is read or written."""

    student: str = option(path=True, argument=True, help="Folder written by kd train-student")
    out: str = option(short="-o", help="Folder to write (new or empty)")
    format: str = option("sentence-transformers", choices=ExportFormat, help="sentence-transformers | onnx")
    quantize: str = option("none", choices=Quantize, help="none | int8: int8 weights for the ONNX graph's matrix "
                           "products (--format onnx; the token table stays fp32): smaller, faster on ONNX Runtime, "
                           "quality within 0.3 STS-B in docs/results.md")
    overwrite: bool = option(False, help="Replace a non-empty --out")

    def __post_init__(self) -> None:
        check_ranges(self, "kd export options")
        fmt, quantize = self.format, self.quantize
        if fmt not in FORMATS:
            raise InputError(f"unknown export format {fmt!r}", fmt, f"--format is one of {', '.join(FORMATS)}")
        if quantize not in QUANTIZE:
            raise InputError(f"unknown quantization {quantize!r}", quantize,
                             f"--quantize is one of {', '.join(QUANTIZE)}")
        if quantize != "none" and fmt != "onnx":
            raise InputError(f"--quantize {quantize} is for --format onnx", fmt,
                             "add --format onnx (a sentence-transformers folder keeps the student's fp32 weights)")


@dataclass(frozen=True)
class Exported:
    """What `kd export` wrote, and what a user of it should know (`export_note`; None: nothing)."""

    path: Path
    note: str | None


def export(cfg: ExportConfig) -> Exported:
    """`kd export`: the student in another format, as a step (a spinner, or start and done lines), and its note."""
    from kd.common.progress import step

    with step(f"exporting {cfg.student} as {cfg.format}" + ("" if cfg.quantize == "none" else f" {cfg.quantize}")):
        path = _write(cfg)
    return Exported(path, export_note(cfg.student, cfg.format))


def export_student(student_dir: str | os.PathLike, fmt: str, out: str | os.PathLike, **options: Any) -> Path:
    """The student at `student_dir` exported as `fmt` into `out`; `options` are `ExportConfig`'s fields
    (overwrite, quantize). Checked before anything is read or written."""
    return _write(ExportConfig(student_dir, out, format=fmt, **options))


with_options(export_student, ExportConfig, ("student", "format", "out"))  # help() lists the config's keywords


def _write(cfg: ExportConfig) -> Path:
    fmt, out, quantize = cfg.format, cfg.out, cfg.quantize
    needs = ("onnx", "onnxruntime", "onnxscript") if fmt == "onnx" else ("sentence_transformers",)
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"--format {fmt} needs {', '.join(missing)}, which is not installed", fmt,
                         f"pip install {' '.join(m.replace('_', '-') for m in missing)} (kd's 'export' extra)")
    with located(os.fspath(out)):  # a full disk inside safetensors' or ONNX's writer names no file: it is --out
        if fmt == "onnx":
            from kd.student.exporters.onnx_graph import export_onnx

            return export_onnx(cfg.student, out, cfg.overwrite, quantize)
        from kd.student.exporters.st_directory import export_sentence_transformers

        return export_sentence_transformers(cfg.student, out, cfg.overwrite)


def export_note(student_dir: str | os.PathLike, fmt: str) -> str | None:
    """What a user of this export should know (st_fit.export_note): why plain SentenceTransformer(path) cannot load
    it, or which texts it encodes differently; None for ONNX and for an exact built-in export."""
    if fmt != "sentence-transformers":
        return None
    from kd.student.exporters.st_fit import export_note as note
    from kd.student.models import StudentConfig
    from kd.student.saved import read_config

    return note(StudentConfig.from_dict(read_config(student_dir)["student"]))
