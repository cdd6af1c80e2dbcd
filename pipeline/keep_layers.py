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
import re

from kd.common.errors import InputError
from kd.pipeline.teacher import Teacher


def default_layers(num_layers: int, k: int | None = None) -> list[int]:
    """k evenly spaced layer indices ending with the last: 6 layers, k=3 -> [1, 3, 5]; k=2 -> [2, 5]."""
    k = k or (num_layers + 1) // 2
    return sorted(num_layers - 1 - round(i * num_layers / k) for i in range(k))


def parse_layers(text: str | None, num_layers: int) -> list[int]:
    if not text:
        return default_layers(num_layers)
    try:
        layers = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise InputError(f"--keep-layers must be comma-separated layer numbers, got {text!r}", "--keep-layers",
                         f"e.g. --keep-layers 1,3,{num_layers - 1}") from None
    if not layers or layers[0] < 0 or layers[-1] >= num_layers:
        raise InputError(f"--keep-layers {text!r}: layers are numbered 0..{num_layers - 1}", "--keep-layers",
                         f"e.g. --keep-layers 1,3,{num_layers - 1}")
    return layers


def folder_name(layers: list[int]) -> str:
    return "init-" + "-".join(str(i) for i in layers)


def init_files(teacher: Teacher, layers: list[int]) -> dict[str, bytes]:
    """{file name: bytes} of the init output (see the module docstring)."""
    from safetensors.torch import save

    base = teacher.reference_model().base_model
    if getattr(base.config, "model_type", "") not in ("bert", "roberta", "xlm-roberta", "mpnet"):
        raise InputError(f"teacher {teacher.name!r} is a {base.config.model_type} model; the init output "
                         "supports BERT-style encoders", "--outputs init", "drop init from --outputs")
    renumber = {f"encoder.layer.{old}.": f"encoder.layer.{new}." for new, old in enumerate(layers)}
    state = {}
    for key, value in base.state_dict().items():
        if key.startswith("embeddings."):
            state[key] = value
        m = re.match(r"encoder\.layer\.(\d+)\.", key)
        if m and int(m.group(1)) in layers:
            state[renumber[m.group(0)] + key[m.end():]] = value
    # the teacher's sentence pooling (sentence-transformers modules), for students and exports that mimic it
    pooling = None if teacher.st is None else {"mode": teacher.st.mode, "normalize": teacher.st.normalize}
    config = base.config.to_dict() | {"num_hidden_layers": len(layers), "kept_layers": layers,
                                      "teacher_layers": base.config.num_hidden_layers, "teacher_pooling": pooling}
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in state.items()}
    return {"model.safetensors": save(tensors), "config.json": json.dumps(config, indent=1, default=str).encode()}
