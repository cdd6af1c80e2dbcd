"""The `vocab` output: what the teacher says each vocabulary token means on its own.

Static students start here (the model2vec recipe), then learn from the store's sentence vectors
(the Tokenlearn recipe) without ever loading the teacher again.

- every token id of the teacher's tokenizer becomes one input `[CLS] token [SEP]`;
- the teacher's `mean` output of that input (masked mean of the last layer over all three
  positions, as model2vec's default pooling) is the token's vector;
- written once per teacher to `teachers/<name>/vocab.safetensors` (tensor `vectors`, [vocab, dim]
  float32; tensor `token_ids`, int64), with its sha256 in the manifest (`extras.files`), so
  `kd validate` and training verify it like every other file.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from kd.pipeline.teacher import Output, Teacher

VOCAB_FILE = "vocab.safetensors"


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
    from safetensors.numpy import save

    from kd.common.errors import StoreError

    vecs = vocab_vectors(teacher, on_batch=on_batch)
    bad = np.nonzero(~np.isfinite(vecs).all(1))[0]
    if len(bad):
        raise StoreError(f"teacher {teacher.name!r} gave non-finite vocab vectors for {len(bad)} token(s) "
                         f"(first ids {bad[:3].tolist()})", teacher.name, "use --precision fp32")
    return save({"vectors": vecs, "token_ids": np.arange(len(vecs), dtype=np.int64)})
