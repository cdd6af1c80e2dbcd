"""Run a teacher over a list of texts: tokenize, length-sorted token-budget batches, restore order.

- `tokenize`: the texts tokenized once untruncated (the `n_tokens` / `truncated` columns); only those longer
  than max_length again, truncated, for the forward pass (`common/fast_tokenizer.py`: the Rust tokenizer
  itself), and cut into batches (`common.token_batches.plan_batches`). Pure CPU work with no model, so
  precompute runs it for the next shard on another thread while this one's forward runs (local_engine).
- `forward_all`: each batch padded and handed to the teacher; on a GPU the next batch is launched before the
  last one's vectors are copied back (`Teacher.launch`), so the device never waits for the host's padding and
  scattering. Results are scattered back to input order (`common.token_batches.scatter_batches`), so the output
  is independent of batching (up to float rounding).
- Pairs go through the tokenizer jointly (cross-encoders); bi-encoders on pair inputs encode each
  side separately and get `_a` / `_b` column suffixes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from safetensors import safe_open

from kd.common.hardware import cpu_signature
from kd.common.token_batches import default_batch_tokens, plan_batches, scatter_batches
from kd.pipeline.teacher.partial import Partial

if TYPE_CHECKING:  # annotations only: the teacher calls into this module (Teacher.encode), not back
    from kd.pipeline.teacher.model import Output, Teacher

# Batches launched on a GPU before the oldest one's vectors are fetched: one queued behind the running one
# keeps the device busy while the host pads the next and scatters the last; more only holds more memory.
IN_FLIGHT = 2


@dataclass(frozen=True)
class Side:
    """One tokenized input of the forward pass (the texts, or one side of bi-encoder pairs)."""

    suffix: str  # "" for texts and cross-encoder pairs; "_a" / "_b" for the sides of bi-encoder pairs
    enc: dict[str, list[list[int]]]  # input_ids[, token_type_ids] per row, truncated to max_length
    batches: list[np.ndarray]  # row indices per batch, the longest rows' first (common.token_batches)


@dataclass(frozen=True)
class Tokenized:
    """Texts tokenized for one teacher: everything the forward pass needs that is not the model."""

    rows: int
    sides: list[Side]
    n_tokens: np.ndarray  # untruncated token counts per row (max over both sides of a bi-encoder pair)


def tokenize(teacher: Teacher, texts: list, batch_tokens: int | None = None) -> Tokenized:
    """`texts` (strings, or (a, b) pairs) tokenized and batched for `teacher`; `batch_tokens` None: the default
    for the device its forward pass runs on."""
    budget = batch_tokens or default_batch_tokens(_compute_device(teacher))
    pairs = bool(texts) and not isinstance(texts[0], str)
    if not pairs or teacher.has_head:
        enc, n_tokens = _tokenize(teacher, texts, pairs)
        return Tokenized(len(texts), [_side("", enc, budget)], n_tokens)
    # A bi-encoder on pairs: each side on its own.
    enc_a, na = _tokenize(teacher, [t[0] for t in texts], False)
    enc_b, nb = _tokenize(teacher, [t[1] for t in texts], False)
    return Tokenized(len(texts), [_side("_a", enc_a, budget), _side("_b", enc_b, budget)], np.maximum(na, nb))


def _side(suffix: str, enc: dict[str, list], batch_tokens: int) -> Side:
    lengths = np.fromiter((len(x) for x in enc["input_ids"]), dtype=np.int64, count=len(enc["input_ids"]))
    return Side(suffix, enc, plan_batches(lengths, batch_tokens))


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


def forward_all(teacher: Teacher, tokens: Tokenized, outputs: list[Output],
                on_batch: Callable[[float], None] | None = None, partial: Partial | None = None,
                on_kept: Callable[[float], None] | None = None) -> dict[str, np.ndarray]:
    """The outputs of every row of `tokens`, float32 in input order (`<output><suffix>` keys). Progress counts a
    bi-encoder pair once both its sides are done. `partial`: the batches a killed run kept are taken from it, not
    run again, and each batch run is added to it (pipeline/teacher/partial.py); their rows go to `on_kept`, not
    `on_batch`: no work of this run, they must not count in its rate (an ETA of 1 minute for an hour's work)."""
    share = 1 / len(tokens.sides)
    progress = None if on_batch is None else (lambda idx: on_batch(len(idx) * share))
    kept = partial.restore() if partial is not None else {}
    result: dict[str, np.ndarray] = {}
    for side in tokens.sides:
        def launch(idx: np.ndarray, side: Side = side) -> Callable[[], dict[str, np.ndarray]]:
            fetch = teacher.launch(teacher.fast.pad(side.enc, idx), outputs)
            if partial is None:
                return fetch

            def fetched() -> dict[str, np.ndarray]:
                vecs = fetch()
                partial.add(side.suffix, idx, vecs)
                return vecs
            return fetched

        done_rows, done_vecs = kept.get(side.suffix, (np.zeros(0, np.int64), {}))
        todo = _not_kept(side.batches, done_rows, tokens.rows)
        if on_kept and len(done_rows):
            on_kept(len(done_rows) * share)
        try:
            done = scatter_batches(tokens.rows, todo, launch, IN_FLIGHT, progress)
        except BaseException:  # a Ctrl-C or an error: what was finished is kept for the rerun
            if partial is not None:
                partial.flush()
            raise
        for name, v in done_vecs.items():
            if name not in done:  # every batch was kept
                done[name] = np.empty((tokens.rows, *v.shape[1:]), dtype=np.float32)
            done[name][done_rows] = v
        result.update({k + side.suffix: v for k, v in done.items()})
    return result


def _not_kept(batches: list[np.ndarray], kept_rows: np.ndarray, rows: int) -> list[np.ndarray]:
    """The batches some of whose rows were not kept (a kept batch is kept whole: parts hold whole batches)."""
    if not len(kept_rows):
        return batches
    kept = np.zeros(rows, dtype=bool)
    kept[kept_rows] = True
    return [b for b in batches if not kept[b].all()]


def encode_all(teacher: Teacher, texts: list, outputs: list[Output], batch_tokens: int | None = None,
               on_batch: Callable[[float], None] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Outputs in input order plus untruncated token counts (max over both sides for pairs): `tokenize` then
    `forward_all`."""
    tokens = tokenize(teacher, texts, batch_tokens)
    return forward_all(teacher, tokens, outputs, on_batch), tokens.n_tokens


def compute_signature(teacher: Teacher) -> str:
    """Where the forward pass runs, as its kernels see it: a GPU's name, or this CPU's signature (float results differ
    between the two, and between CPU models)."""
    if _compute_device(teacher) == "cuda":
        import torch

        return f"cuda:{torch.cuda.get_device_name(teacher.device if teacher.device.type == 'cuda' else None)}"
    return f"cpu:{cpu_signature()}"


def _compute_device(teacher: Teacher) -> str:
    """Where the forward pass runs: the torch model's device, or an exported backend's (CPU unless ONNX on CUDA)."""
    if teacher.backend is None:
        return teacher.device.type
    return "cuda" if (teacher.backend.device or "cpu").startswith("cuda") else "cpu"
def input_embeddings(teacher: Teacher) -> np.ndarray:
    """The word-embedding matrix [vocab, dim] float32: students can start from its PCA. A teacher loaded without its
    model reads it from the checkpoint's .safetensors tensor recorded as equal to it (backends/fidelity_cache), as
    numpy (torch only for a bf16/fp16 tensor, which numpy cannot hold)."""
    if teacher.model is None and teacher.embedding:
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
