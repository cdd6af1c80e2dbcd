"""The `vocab` output: what the teacher says each vocabulary token means on its own.

Static students start here (the model2vec recipe), then learn from the store's sentence vectors
(the Tokenlearn recipe) without ever loading the teacher again.

- every token id of the teacher's tokenizer becomes one input `[CLS] token [SEP]`;
- the teacher's `mean` output of that input (masked mean of the last layer over all three
  positions, as model2vec's default pooling) is the token's vector;
- written once per teacher to `teachers/<name>/vocab.safetensors` (tensor `vectors`, [vocab, dim]
  float32; tensor `token_ids`, int64), with its sha256 in the manifest (`extras.files`), so
  `kd validate` and training verify it like every other file;
- computed once per machine (issue 50): it depends on the teacher alone, never on the corpus, and it is most of
  a small corpus's precompute (mpnet on one AVX2 core: 30,527 tokens at ~106/s, 4.8 min, where 1,000 sentences
  took 1.6 min). The file's bytes are kept in `$KD_CACHE/vocab/<key>.safetensors`, the key a hash of everything
  that determines the vectors (`cache_key`); a cached file is used only when it parses as this teacher's
  [vocab, dim] finite table, and is written atomically (temp + rename).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load, save

from kd.common.cache import cache_dir
from kd.common.errors import StoreError
from kd.pipeline.teacher.model import Output, Teacher
from kd.storage import fs

VOCAB_FILE = "vocab.safetensors"
ALGORITHM = 1  # bump when vocab_vectors changes what it computes: every cached table is then computed again
# the teacher's settings that do not change the vectors (where it came from, why a backend was chosen, what was
# measured of it) or that name its store files
_NOT_IN_KEY = ("source", "backend_choice", "fidelity", "outputs", "dtype", "tokenizer", "input_embeddings")


def vocab_inputs(teacher: Teacher) -> torch.Tensor:
    """[vocab, 3] input ids: [CLS] t [SEP] for every token id t (specials included, as model2vec)."""
    tok = teacher.hf_tokenizer()
    first = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
    last = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    ids = torch.arange(len(tok), dtype=torch.long)[:, None]
    parts = ([torch.full_like(ids, first)] if first is not None else []) + [ids] + \
        ([torch.full_like(ids, last)] if last is not None else [])
    return torch.cat(parts, 1)


def vocab_vectors(teacher: Teacher, batch: int = 1024, on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """[vocab, dim] float32: the teacher's mean output for every token alone (see module docstring)."""
    inputs = vocab_inputs(teacher)
    out = np.empty((len(inputs), teacher.dim), dtype=np.float32)
    for lo in range(0, len(inputs), batch):
        ids = inputs[lo : lo + batch]
        enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if "token_type_ids" in teacher.hf_tokenizer().model_input_names:
            enc["token_type_ids"] = torch.zeros_like(ids)
        out[lo : lo + len(ids)] = teacher.forward(enc, [Output.mean])["mean"]
        if on_batch:
            on_batch(len(ids))
    return out


def vocab_bytes(teacher: Teacher, on_batch: Callable[[int], None] | None = None) -> bytes:
    """The vocab file's content (safetensors); refuses non-finite vectors like every other output."""

    vecs = vocab_vectors(teacher, on_batch=on_batch)
    bad = np.nonzero(~np.isfinite(vecs).all(1))[0]
    if len(bad):
        raise StoreError(f"teacher {teacher.name!r} gave non-finite vocab vectors for {len(bad)} token(s) "
                         f"(first ids {bad[:3].tolist()})", teacher.name, "use --precision fp32")
    return save({"vectors": vecs, "token_ids": np.arange(len(vecs), dtype=np.int64)})


def cache_key(teacher: Teacher) -> str:
    """What the vocab vectors depend on (`Teacher.meta`: weights, architecture, precision, backend...), hashed."""
    meta = {k: v for k, v in teacher.meta([Output.mean], "float32").items() if k not in _NOT_IN_KEY}
    meta |= {"vocab_size": len(teacher.hf_tokenizer()), "algorithm": ALGORITHM}
    return hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()[:32]


def cached_path(teacher: Teacher) -> Path:
    return cache_dir() / "vocab" / f"{cache_key(teacher)}.safetensors"


def cached_vocab_bytes(teacher: Teacher) -> bytes | None:
    """The vocab file's content from the kd cache, when one was computed for exactly this teacher and is sound."""
    path = cached_path(teacher)
    try:
        data = path.read_bytes()
        vecs = load(data)["vectors"]
    except Exception:  # absent, unreadable or damaged: computed again (and the cache rewritten)
        return None
    ok = vecs.shape == (len(teacher.hf_tokenizer()), teacher.dim) and vecs.dtype == np.float32
    return data if ok and np.isfinite(vecs).all() else None


def keep_in_cache(teacher: Teacher, data: bytes) -> None:
    """Write the vocab file's content to the kd cache (atomically); a cache that cannot be written costs only the
    next run the pass."""
    path = cached_path(teacher)
    note = json.dumps({"weights_sha256": teacher.meta([Output.mean], "float32")["weights_sha256"]}).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = fs.resolve(str(path.parent))
        fs.atomic_write_bytes(folder, data, path.name)
        fs.atomic_write_bytes(folder, note, path.with_suffix(".json").name)
    except OSError:
        return


def cached_for(weights_sha256: str) -> bool:
    """Whether the kd cache holds a vocab table of a teacher with these weights (under some backend and precision):
    what `kd distill --dry-run` can tell without loading the teacher. The note beside each table says whose it is."""
    folder = cache_dir() / "vocab"
    for note in folder.glob("*.json") if folder.is_dir() else []:
        try:
            if json.loads(note.read_text(encoding="utf-8")).get("weights_sha256") == weights_sha256 \
                    and note.with_suffix(".safetensors").is_file():
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False
