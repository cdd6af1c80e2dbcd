"""The teacher's vectors of the evaluation sets, cached: in `kd eval` and `kd demo` too the teacher is paid once.

Without it every call ran the teacher again over the same sets (26 s for MiniLM, 147 s for mpnet on 2 cores).

- Key (`TeacherCache.key`): the teacher's weights sha256 and the sha256 of its other checkpoint files (config,
  tokenizer, sentence-transformers pooling), the output compared with, backend and precision (what
  `models.teacher_model` runs: torch fp32), the device (CPU signature or GPU name) and torch's version; each
  entry adds the sha256 of its texts, in order. An entry is used only when the key it records equals the one
  wanted, so other weights, another output, an edited tokenizer or another evaluation set miss.
- Entry: `$KD_CACHE/eval/vectors-<hash of the key>.safetensors` (the kd cache folder the teacher exports use),
  the vectors plus, in its metadata, the key and the sha256 of the vector bytes; written atomically (temp file,
  rename). On read the key is compared and the bytes hashed: a truncated or altered file, NaN or a wrong row
  count is a miss, computed again and rewritten, never trusted.
- The teacher's speed and size (`speed-<hash>.json`), measured on this machine with the same threads and texts:
  without them a warm `kd eval` with `--task speed` (the default, and `kd demo`) would load the teacher anyway.
- A cache that cannot be written only costs the next call the teacher again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, save

from kd.common.cache import cache_dir
from kd.common.hardware import cpu_signature, resolve_device
from kd.pipeline.backends.fidelity_cache import other_files_sha256
from kd.pipeline.teacher.model import read_st_pooling, weights_sha256
from kd.pipeline.teacher.resolve import TeacherSpec, resolve_teacher
from kd.storage import fs

FORMAT = 1
BACKEND, PRECISION = "torch", "float32"  # what models.teacher_model runs (load_teacher's library defaults)


def texts_sha256(texts: list[str]) -> str:
    """sha256 of the texts in order, each length-prefixed (so ["ab"] and ["a", "b"] differ)."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(struct.pack("<Q", len(b)) + b)
    return h.hexdigest()


def device_signature() -> str:
    """Where the eval teacher runs (`load_teacher`'s default device): fp32 kernels differ between CPUs and GPUs."""
    import torch


    dev = resolve_device(None)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_signature()
    return f"{dev.type}:{name}:torch {torch.__version__}"


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


class TeacherCache:
    """Vectors (and speed) of one teacher checkpoint's `target` output; the key is computed on first use, since
    hashing the weights reads them (~0.3 s for MiniLM, ~1.5 s for mpnet)."""

    def __init__(self, spec: str | TeacherSpec, target: str | None, folder: Path | None = None) -> None:
        self.spec, self.target = spec, target
        self.folder = folder or cache_dir() / "eval"

    @cached_property
    def key(self) -> dict[str, Any]:
        path = resolve_teacher(self.spec).path
        output = self.target or ("sentence" if read_st_pooling(path) is not None else "mean")  # as teacher_model
        return {"format": FORMAT, "weights_sha256": weights_sha256(path), "files_sha256": other_files_sha256(path),
                "output": output, "backend": BACKEND, "precision": PRECISION, "device": device_signature()}

    def _path(self, kind: str, want: dict, suffix: str) -> Path:
        return self.folder / f"{kind}-{_digest(want)}{suffix}"

    def vectors(self, texts: list[str]) -> np.ndarray | None:
        """The cached vectors of exactly `texts`, or None (absent, damaged or made for another key)."""
        want = {**self.key, "texts_sha256": texts_sha256(texts)}
        try:
            data = self._path("vectors", want, ".safetensors").read_bytes()
            return _verified(data, want, len(texts))
        except (OSError, ValueError, KeyError, TypeError, struct.error, SafetensorError):
            return None

    def put_vectors(self, texts: list[str], vecs: np.ndarray) -> None:
        want = {**self.key, "texts_sha256": texts_sha256(texts)}
        arr = np.ascontiguousarray(vecs, dtype=np.float32)
        meta = {"key": json.dumps(want, sort_keys=True), "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}
        self._write(self._path("vectors", want, ".safetensors"), save({"vectors": arr}, metadata=meta))

    def speed(self, settings: dict) -> dict | None:
        """The recorded speed and size measured with `settings` (threads, sizes, texts), or None."""
        want = {**self.key, **settings}
        try:
            rec = json.loads(self._path("speed", want, ".json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        ok = isinstance(rec, dict) and rec.get("key") == want and isinstance(rec.get("speed"), dict)
        return rec if ok else None

    def put_speed(self, settings: dict, speed: dict, size: dict | None) -> None:
        want = {**self.key, **settings}
        rec = {"key": want, "speed": speed, "size": size}
        self._write(self._path("speed", want, ".json"), json.dumps(rec, indent=1).encode("utf-8"))

    def _write(self, path: Path, data: bytes) -> None:
        with contextlib.suppress(OSError):  # best effort: the next call computes again
            fs.atomic_write_bytes(fs.resolve(path.parent), data, path.name)


def _verified(data: bytes, want: dict, rows: int) -> np.ndarray | None:
    """The vectors of a cache file when its key is `want` and its bytes hash to the recorded sha256."""
    (n,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8 : 8 + n])["__metadata__"]
    if meta["key"] != json.dumps(want, sort_keys=True):
        return None
    arr = load(data)["vectors"]
    ok = (arr.dtype == np.float32 and arr.ndim == 2 and len(arr) == rows and bool(np.isfinite(arr).all())
          and hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest() == meta["sha256"])
    return arr if ok else None
