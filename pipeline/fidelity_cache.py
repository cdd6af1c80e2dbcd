"""A backend's measured fidelity, kept beside its exported graph, so that a warm run skips the torch teacher.

Loading an exported backend needs the torch teacher for two things only: exporting the graph and measuring the
graph's fidelity to torch fp32. Once both are in the export cache the teacher's weights are not needed (the
tokenizer and config come from the checkpoint folder, the input embeddings from its .safetensors file), which
saves the model load and the fidelity pass (MiniLM: ~2.5 s and ~2.8 s of a 50-sentence job, profiled).

- The record (`fidelity-<hash of its key>.json` in the cache folder) is used only when its key equals the one
  wanted exactly: the weights' sha256, the graph file's sha256, backend, quantize, compute precision,
  --max-length and this CPU's signature (`hardware.cpu_signature`). Other weights or another CPU find no
  record, so the fidelity is measured again (and recorded beside the first).
- A record of a fidelity below its threshold is kept too: the check runs on the cached numbers and refuses
  just as fast.
- Written atomically (temp file, rename); a cache that cannot be written only costs the next run the measure.
  A re-exported graph replaces the folder, records included.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from kd.common import hardware
from kd.pipeline.teacher import Teacher
from kd.storage import fs

FORMAT = 1


def key(weights_sha256: str, graph_sha256: str, backend: str, quantize: str, precision: str,
        max_length: int | None) -> dict:
    """What a cached fidelity must match exactly to be used instead of a measure."""
    return {"format": FORMAT, "weights_sha256": weights_sha256, "graph_sha256": graph_sha256, "backend": backend,
            "quantize": quantize, "precision": precision, "max_length": max_length,
            "cpu": hardware.cpu_signature()}


def _path(folder: Path, want: dict) -> Path:
    digest = hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"fidelity-{digest}.json"


def read(folder: Path, want: dict) -> dict | None:
    """The record for `want` ({key, fidelity, architecture, embedding}), or None (absent, unreadable, or made
    for another key: a hash collision or a file copied from elsewhere)."""
    try:
        rec = json.loads(_path(folder, want).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(rec, dict) and rec.get("key") == want and isinstance(rec.get("fidelity"), dict)
    return rec if ok and isinstance(rec.get("architecture"), str) else None


def write(folder: Path, want: dict, teacher: Teacher, fidelity: dict) -> None:
    """Record `fidelity` with what a model-free load needs from the torch teacher (best effort)."""
    rec = {"key": want, "fidelity": fidelity, "architecture": teacher.architecture,
           "embedding": embedding_source(teacher)}
    with contextlib.suppress(OSError):
        fs.atomic_write_bytes(fs.resolve(folder), json.dumps(rec, indent=1).encode("utf-8"), _path(folder, want).name)


def embedding_source(teacher: Teacher) -> dict | None:
    """{file, key} of the checkpoint tensor equal (bit for bit) to the teacher's input embeddings, or None
    (weights in .bin files, or no equal tensor: the model is then loaded when the embeddings are written)."""
    import torch
    from safetensors import safe_open

    from kd.pipeline.batches import input_embeddings

    ref = input_embeddings(teacher)
    for name in sorted(f for f in os.listdir(teacher.ref.path) if f.endswith(".safetensors")):
        with safe_open(os.path.join(teacher.ref.path, name), "pt") as f:
            for k in f.keys():
                if list(f.get_slice(k).get_shape()) == list(ref.shape) and torch.equal(f.get_tensor(k).float(), ref):
                    return {"file": name, "key": k}
    return None
