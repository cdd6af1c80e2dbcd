"""Run a teacher over a list of texts: tokenize, length-sorted token-budget batches, restore order.

- Texts are tokenized once untruncated (the `n_tokens` / `truncated` columns); only those longer than
  max_length again, truncated, for the forward pass (`pipeline/fast_tokenizer.py`: the Rust tokenizer itself).
- Batches come from `common.token_batches.plan_batches`; results are scattered back to input order, so the output
  is independent of batching (up to float rounding).
- Pairs go through the tokenizer jointly (cross-encoders); bi-encoders on pair inputs encode each
  side separately and get `_a` / `_b` column suffixes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kd.common.token_batches import default_batch_tokens, plan_batches

if TYPE_CHECKING:  # annotations only: the teacher calls into this module (Teacher.encode), not back
    from kd.pipeline.teacher import Output, Teacher


def _tokenize(teacher: Teacher, texts: list, pairs: bool) -> tuple[dict[str, list], np.ndarray]:
    """Token ids truncated to max_length, and the untruncated counts. One pass untruncated; only the texts longer
    than max_length are tokenized again with truncation (on the rest truncation changes nothing)."""
    tok = teacher.fast
    a, b = ([t[0] for t in texts], [t[1] for t in texts]) if pairs else (texts, None)
    enc = tok.encode(a, b)
    n_tokens = np.fromiter((len(x) for x in enc["input_ids"]), dtype=np.int32, count=len(texts))
    long = np.nonzero(n_tokens > teacher.max_length)[0].tolist()
    if long:
        cut = tok.encode([a[i] for i in long], None if b is None else [b[i] for i in long], teacher.max_length)
        for key, rows in cut.items():
            for i, row in zip(long, rows):
                enc[key][i] = row
    return enc, n_tokens


def _run(teacher: Teacher, texts: list, pairs: bool, outputs: list[Output], batch_tokens: int,
         on_batch: Callable[[int], None] | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    enc, n_tokens = _tokenize(teacher, texts, pairs)
    lengths = np.fromiter((len(x) for x in enc["input_ids"]), dtype=np.int64, count=len(texts))
    result: dict[str, np.ndarray] = {}
    for idx in plan_batches(lengths, batch_tokens):
        batch = teacher.fast.pad(enc, idx)
        out = teacher.forward(batch, outputs)
        for k, v in out.items():
            if k not in result:
                result[k] = np.empty((len(texts), *v.shape[1:]), dtype=np.float32)
            result[k][idx] = v
        if on_batch:
            on_batch(len(idx))
    return result, n_tokens


def encode_all(teacher: Teacher, texts: list, outputs: list[Output], batch_tokens: int | None = None,
               on_batch: Callable[[int], None] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Outputs in input order plus untruncated token counts (max over both sides for pairs). `batch_tokens`
    None: the default for the device the forward pass runs on."""
    batch_tokens = batch_tokens or default_batch_tokens(_compute_device(teacher))
    pairs = bool(texts) and not isinstance(texts[0], str)
    if not pairs or teacher.has_head:
        return _run(teacher, texts, pairs, outputs, batch_tokens, on_batch)
    # A bi-encoder on pairs: each side on its own; progress counts a pair once both sides are done.
    half = (lambda n: on_batch(n / 2)) if on_batch else None  # noqa: E731
    a, na = _run(teacher, [t[0] for t in texts], False, outputs, batch_tokens, half)
    b, nb = _run(teacher, [t[1] for t in texts], False, outputs, batch_tokens, half)
    out = {f"{k}_a": v for k, v in a.items()} | {f"{k}_b": v for k, v in b.items()}
    return out, np.maximum(na, nb)


def _compute_device(teacher: Teacher) -> str:
    """Where the forward pass runs: the torch model's device, or an exported backend's (CPU unless ONNX on CUDA)."""
    if teacher.backend is None:
        return teacher.device.type
    return "cuda" if (teacher.backend.device or "cpu").startswith("cuda") else "cpu"


def input_embeddings(teacher: Teacher) -> np.ndarray:
    """The word-embedding matrix [vocab, dim] float32: students can start from its PCA. A teacher loaded without its
    model reads it from the checkpoint's .safetensors tensor recorded as equal to it (pipeline/fidelity_cache), as
    numpy (torch only for a bf16/fp16 tensor, which numpy cannot hold)."""
    if teacher.model is None and teacher.embedding:
        from safetensors import safe_open

        path, key = f"{teacher.ref.path}/{teacher.embedding['file']}", teacher.embedding["key"]
        with safe_open(path, "np") as f:
            dtype = f.get_slice(key).get_dtype()
            if dtype in ("F32", "F64"):
                return np.ascontiguousarray(f.get_tensor(key), dtype=np.float32)
        with safe_open(path, "pt") as f:
            return f.get_tensor(key).float().contiguous().numpy()
    import torch

    with torch.inference_mode():
        weight = teacher.reference_model().get_input_embeddings().weight
        return weight.detach().float().cpu().contiguous().numpy()
