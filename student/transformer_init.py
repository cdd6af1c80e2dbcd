"""Teacher-initialised Transformer students: the teacher's embeddings and k of its layers, read from
the store's `init` output (written by `kd precompute --outputs init`), then trained on the store.

The encoder is a Hugging Face `BertModel` built from the stored config (never `from_pretrained`: the
teacher is never loaded), fed the student's token embeddings (`Student.embed`, which holds the
teacher's word embeddings), so positions, token types, LayerNorm and the kept layers run exactly as
in the teacher. With every layer kept and no training, the student's mean-pooled output equals the
teacher's `mean` output.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from kd.common.bert_config import bert_config_problem, init_type_problem
from kd.common.errors import KdError, StoreError
from kd.common.parsing import read_config


class TransformerInitEncoder(nn.Module):
    """BERT embeddings (positions, token types, LayerNorm) and k layers; token states of every layer."""

    def __init__(self, cfg) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        if not cfg.bert:
            raise KdError("a transformer-init student needs the teacher's stored config", "student config",
                          "train it from a store with the init output (kd precompute --outputs init)")
        # The word embeddings live in Student.embed: built with a 1-row table, which keeps the module's structure
        # without a second copy of the vocabulary (never allocated at the config's vocab_size).
        self.bert = BertModel(BertConfig(**{**cfg.bert, "vocab_size": 1, "pad_token_id": 0}), add_pooling_layer=False)

    def forward(self, x: Tensor, mask: Tensor) -> list[Tensor]:
        out = self.bert(inputs_embeds=x, attention_mask=mask.long(), output_hidden_states=True, return_dict=True)
        return list(out.hidden_states[1:])


def bert_config(folder: Path) -> dict:
    """The stored BERT config (teacher's, with num_hidden_layers = k), minus kd's own keys."""
    from kd.storage.store import file_repair  # lazy: pyarrow, only where a store's init output is read

    path = folder / "config.json"
    fix = file_repair(str(folder.parent.parent.parent))  # the store holding teachers/<name>/init-*/
    cfg = read_config(path, fix, StoreError)
    why = bert_config_problem(cfg)
    if why is None and (why := init_type_problem(cfg)):  # an MPNet one, written before kd refused them
        fix = "start from a BERT-style model's init output (e.g. minilm's): kd precompute <same inputs> -t minilm " \
              "--outputs init --add-to STORE"
    if why is not None:
        raise StoreError(f"the stored init output cannot be built: {why}", str(path), fix)
    for key in ("kept_layers", "teacher_layers", "teacher_pooling", "architectures", "transformers_version",
                "_name_or_path"):
        cfg.pop(key, None)
    return cfg


def load_init_weights(student: nn.Module, folder: Path) -> None:
    """Copy the stored embeddings and kept layers into a transformer-init student."""
    state = load_file(str(folder / "model.safetensors"))
    with torch.no_grad():
        student.embed.weight.copy_(state.pop("embeddings.word_embeddings.weight"))
    missing, unexpected = student.encoder.bert.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("embeddings.word_embeddings")]
    if missing or unexpected:
        raise KdError(f"the stored init weights do not fit (missing {missing[:3]}, unexpected {unexpected[:3]})",
                      str(folder), "re-run kd precompute --outputs init with this kd version")
