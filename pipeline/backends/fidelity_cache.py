"""A backend's measured fidelity, kept beside its exported graph, so that a warm run skips the torch teacher.

Loading an exported backend needs the torch teacher for two things only: exporting the graph and measuring the
graph's fidelity to torch fp32. Once both are in the export cache neither the weights nor torch nor transformers
are needed: the record also holds what the config and the transformers tokenizer would give (layers, width, head,
labels, max length, the tokenizer's settings) and the tokenizer's saved files, the input embeddings come from the
checkpoint's .safetensors file. Measured on MiniLM: the model load and fidelity pass were ~2.5 s and ~2.8 s of a
50-sentence job, importing torch and transformers ~1.6 s more.

- The record (`fidelity-<hash of its key>.json` in the cache folder) is used only when its key equals the one
  wanted exactly: the weights' sha256, the sha256 of the checkpoint's other files (config, tokenizer), the graph
  file's sha256, backend, quantize, compute precision, --max-length and this CPU's signature
  (`hardware.cpu_signature`). Other weights, an edited tokenizer or another CPU find no record, so the fidelity is
  measured again (and recorded beside the first).
- Its tokenizer files sit in `tokenizer-<same hash>/`, each with its sha256 in the record: a damaged one makes the
  record unusable (measured again), never a store with another tokenizer.
- A record of a fidelity below its threshold is kept too: the check runs on the cached numbers and refuses
  just as fast.
- Written atomically (temp file or folder, rename); a cache that cannot be written only costs the next run the
  measure. A re-exported graph replaces the folder, records included.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from kd.common import hardware
from kd.common.fast_tokenizer import FastTokenizer, TokenizerSettings
from kd.pipeline.teacher.batches import input_embeddings
from kd.pipeline.teacher.model import Teacher
from kd.storage import fs

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt", ".onnx", ".ot")
FORMAT = 2  # 2: checkpoint files in the key; the teacher's description and tokenizer in the record


def key(checkpoint: str, weights_sha256: str, graph_sha256: str, backend: str, quantize: str, precision: str,
        max_length: int | None) -> dict:
    """What a cached fidelity must match exactly to be used instead of a measure."""
    return {"format": FORMAT, "weights_sha256": weights_sha256, "files_sha256": other_files_sha256(checkpoint),
            "graph_sha256": graph_sha256, "backend": backend, "quantize": quantize, "precision": precision,
            "max_length": max_length, "cpu": hardware.cpu_signature()}


def other_files_sha256(checkpoint: str) -> str:
    """sha256 over the names and bytes of the checkpoint folder's files that are not weights (config, tokenizer,
    sentence-transformers modules; sub-folders included), ~1 MB for MiniLM or mpnet."""
    h = hashlib.sha256()
    root = Path(checkpoint)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in WEIGHT_SUFFIXES):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + fs.file_sha256(path).encode())
    return h.hexdigest()


def _digest(want: dict) -> str:
    return hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()[:16]


def _path(folder: Path, want: dict) -> Path:
    return folder / f"fidelity-{_digest(want)}.json"


def _tokenizer_folder(folder: Path, want: dict) -> Path:
    return folder / f"tokenizer-{_digest(want)}"


def read(folder: Path, want: dict) -> dict | None:
    """The record for `want` ({key, fidelity, architecture, embedding, teacher, tokenizer}), or None (absent,
    unreadable, made for another key, or its tokenizer files missing or changed)."""
    try:
        rec = json.loads(_path(folder, want).read_text(encoding="utf-8"))
        ok = (isinstance(rec, dict) and rec.get("key") == want and isinstance(rec.get("fidelity"), dict)
              and isinstance(rec.get("architecture"), str) and isinstance(rec.get("teacher"), dict)
              and _tokenizer_intact(_tokenizer_folder(folder, want), rec["tokenizer"]["files"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return rec if ok else None


def _tokenizer_intact(folder: Path, files: dict) -> bool:
    names = sorted(p.name for p in folder.iterdir())
    return bool(files) and names == sorted(files) and all(fs.file_sha256(folder / n) == h for n, h in files.items())


def write(folder: Path, want: dict, teacher: Teacher, fidelity: dict) -> None:
    """Record `fidelity` with what a model-free load needs (best effort); `teacher.tokenizer` must be the
    transformers tokenizer as no call has touched it (its files are what a store gets)."""
    with contextlib.suppress(OSError):
        files = _save_tokenizer(teacher.tokenizer, _tokenizer_folder(folder, want))
        rec = {"key": want, "fidelity": fidelity, "architecture": teacher.architecture,
               "embedding": embedding_source(teacher), "teacher": teacher.description(),
               "tokenizer": {"files": files, "settings": teacher.fast.settings.record()}}
        fs.atomic_write_bytes(fs.resolve(folder), json.dumps(rec, indent=1).encode("utf-8"), _path(folder, want).name)


def _save_tokenizer(tokenizer: Any, final: Path) -> dict[str, str]:
    """save_pretrained into a temp folder renamed to `final` (replacing one left before); {file: sha256}."""
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        tokenizer.save_pretrained(str(tmp))
        files = {p.name: fs.file_sha256(p) for p in sorted(tmp.iterdir())}
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return files


def fast_tokenizer(folder: Path, rec: dict) -> tuple[FastTokenizer, Path]:
    """The tokenizer a record's teacher tokenizes with, from its saved tokenizer.json, and the folder of its saved files
    (`Teacher.hf_tokenizer()` loads transformers' from there if vocab or init need it)."""
    tok_folder = _tokenizer_folder(folder, rec["key"])
    settings = TokenizerSettings.from_record(rec["tokenizer"]["settings"])
    return FastTokenizer.from_file(str(tok_folder / "tokenizer.json"), settings), tok_folder


def embedding_source(teacher: Teacher) -> dict | None:
    """{file, key} of the checkpoint tensor equal (bit for bit) to the teacher's input embeddings, or None
    (weights in .bin files, or no equal tensor: the model is then loaded when the embeddings are written)."""

    ref = input_embeddings(teacher)
    for name in sorted(f for f in os.listdir(teacher.ref.path) if f.endswith(".safetensors")):
        with safe_open(os.path.join(teacher.ref.path, name), "pt") as f:
            for k in f.keys():
                if list(f.get_slice(k).get_shape()) == list(ref.shape) and \
                        np.array_equal(f.get_tensor(k).float().numpy(), ref):
                    return {"file": name, "key": k}
    return None
