"""A sentence-transformers input module for the kd students that no built-in module reproduces.

Recurrent, convolutional, feed-forward and small-transformer students read WordPiece ids through their own
embedding table and encoder; sentence-transformers' `WordEmbeddings` splits on whitespace and cannot
give the same ids. This module is the student's tokenizer, embeddings and encoder; the built-in `Pooling`
and `Dense` modules after it do the rest (attentive pooling, which has no built-in, is done here).

Saved as safetensors + JSON + the tokenizer files, never pickle. sentence-transformers 6 imports a class
outside its own package only with `trust_remote_code=True`, and that flag lets the folder pick what runs (an
edited modules.json naming a planted `.py` file runs it). Load exports with `kd.student.load_exported(dir)`
instead (student.st_load): it accepts this exact class and sentence-transformers' own, refuses any other
class, Python file, pickle or `auto_map`, and builds each module with its `load` classmethod. A folder that
asks for `trust_remote_code=True` is asking to run its own code: do not grant it to a folder you received.
"""

from __future__ import annotations

from typing import Any

import torch
from sentence_transformers.base.modules.input_module import InputModule
from torch import nn
from transformers import AutoTokenizer

from kd.common.fast_tokenizer import FastTokenizer
from kd.common.padding import pad_rows
from kd.student.models import StudentConfig, build_student


class KdTokenEncoder(InputModule):
    """input_ids/attention_mask -> token_embeddings (the student's last encoder layer); with `pool`,
    also sentence_embedding (the student's own pooling)."""

    config_file_name = "kd_student.json"
    config_keys = ["student", "pool"]

    def __init__(self, student: dict[str, Any], pool: bool = False, tokenizer: Any = None) -> None:
        super().__init__()
        self.student, self.pool = student, pool
        self.cfg = StudentConfig.from_dict(student)
        self.model = build_student(self.cfg)
        self.model.head = nn.Identity()  # the head is the Dense module that follows
        self.tokenizer = tokenizer
        self._fast: FastTokenizer | None = None  # its Rust copy, made on the first call

    @property
    def max_seq_length(self) -> int:
        return self.cfg.max_length

    def get_embedding_dimension(self) -> int:
        return self.cfg.width

    def preprocess(self, inputs: list[str], prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor]:
        """The ids the student trained on (common/fast_tokenizer.py: special tokens, truncated to its max_length on
        its tokenizer's side), right-padded."""
        if prompt:
            inputs = self._prepend_prompt(inputs, prompt)
        if self._fast is None:
            self._fast = FastTokenizer.from_transformers(self.tokenizer, "the exported student's tokenizer")
        cfg = self.cfg
        rows = self._fast.encode(list(inputs), max_length=cfg.max_length, first_ids=cfg.first_ids)["input_ids"]
        ids, mask = pad_rows(rows, self.cfg.pad_id)
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}

    def forward(self, features: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        mask = features["attention_mask"].bool()
        states = self.model.encoder(self.model.embed(features["input_ids"]), mask)
        features["token_embeddings"] = states[-1]
        if self.pool:
            features["sentence_embedding"] = self.model.pool(states[-1], mask)
        return features

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.save_config(output_path)
        self.save_torch_weights(output_path, safe_serialization=True)  # safetensors whatever is asked
        self.save_tokenizer(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             **kwargs) -> KdTokenEncoder:
        hub = {"subfolder": subfolder, "token": token, "cache_folder": cache_folder, "revision": revision,
               "local_files_only": local_files_only}
        config = cls.load_config(model_name_or_path, **hub)
        tokenizer = AutoTokenizer.from_pretrained(cls.load_dir_path(model_name_or_path, **hub))
        module = cls(**config, tokenizer=tokenizer)
        cls.load_torch_weights(model_name_or_path, model=module, **hub)
        return module
