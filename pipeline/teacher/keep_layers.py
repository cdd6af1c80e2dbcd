"""The `init` output: a teacher's embeddings and k of its layers, for students that start as a smaller
copy of the teacher (DistilBERT-style layer selection) and then learn from the store.

- which layers: `--keep-layers 1,3,5`, or by default k = half the layers (rounded up), evenly spaced
  and always ending with the last one, because the last layer's output space is what the stored
  targets live in;
- what is written, under `teachers/<name>/init-<layers>/`: `model.safetensors` (the embeddings and the
  kept layers renumbered 0..k-1, nothing else of the teacher) and `config.json` (the teacher's
  BERT config with `num_hidden_layers = k`, plus `kept_layers`, `teacher_layers` and `teacher_pooling`,
  the teacher's sentence pooling {mode, normalize} or null), both with their sha256 in the
  manifest (`extras.files`), so training verifies them and never loads the teacher.
"""

from __future__ import annotations

import json

from kd.common.bert_config import BERT_SHAPED
from kd.common.errors import InputError
from kd.common.layers import keep_layers
from kd.pipeline.teacher.model import Teacher


def folder_name(layers: list[int]) -> str:
    return "init-" + "-".join(str(i) for i in layers)


def init_files(teacher: Teacher, layers: list[int]) -> dict[str, bytes]:
    """{file name: bytes} of the init output (see the module docstring)."""
    from safetensors.torch import save

    base = teacher.reference_model().base_model
    if getattr(base.config, "model_type", "") not in BERT_SHAPED:
        raise InputError(f"teacher {teacher.name!r} is a {base.config.model_type} model; the init output supports "
                         f"the encoders a transformer-init student starts from ({', '.join(BERT_SHAPED)})",
                         "--outputs init", "drop init from --outputs (or start from a BERT-style model, e.g. minilm)")
    # the embeddings and the kept layers, nothing else of the teacher (no pooler, no task head)
    state = {k: v for k, v in keep_layers(base.state_dict(), layers).items()
             if k.startswith(("embeddings.", "encoder.layer."))}
    # the teacher's sentence pooling (sentence-transformers modules), for students and exports that mimic it
    pooling = None if teacher.st is None else {"mode": teacher.st.mode, "normalize": teacher.st.normalize}
    config = base.config.to_dict() | {"num_hidden_layers": len(layers), "kept_layers": layers,
                                      "teacher_layers": base.config.num_hidden_layers, "teacher_pooling": pooling}
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in state.items()}
    return {"model.safetensors": save(tensors), "config.json": json.dumps(config, indent=1, default=str).encode()}
