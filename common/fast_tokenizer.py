"""The one way text becomes token ids in kd: the Rust `tokenizers.Tokenizer` inside a transformers fast tokenizer,
called directly (a warm precompute never imports transformers, ~0.6 s of a small job's start-up; transformers'
`__call__` and `pad` cost more than a small student's forward).

Every path from text to a model goes through `FastTokenizer.encode` and `common.padding.pad_rows`: the teacher
pass (pipeline/teacher/batches), a student's training batches (student/data), its `encode` (student/saved), its
sentence-transformers module (student/st_module) and the exported ONNX encoder (student/exporters/onnx_graph).
So a tokenizer saved with padding_side="left" or truncation_side="left" gives a student the same ids in training
and at inference (tests/student/test_tokenizer_path.py); which side a batch pads on is common/padding.py's to say.

- `from_transformers(tok)`: a copy of a loaded fast tokenizer's backend plus the settings its `__call__` and
  `pad` add on top (input names, pad id and type id, padding and truncation side);
- `from_file(tokenizer.json, settings)`: the same from a saved tokenizer and those settings, as recorded in the
  export cache by the run that measured the backend (pipeline/backends/fidelity_cache.py) or in an ONNX export;
- `encode(texts, pairs, max_length)`: what `tok(texts[, pairs], truncation=..., max_length=...)` gives (special
  tokens added, longest-first truncation on the tokenizer's side, no padding): ids (and type ids) per text;
  `first_ids=True`: instead the first max_length ids of the whole encoding, special tokens added before the cut
  (a longer text loses its final [SEP]), which is how sentence-transformers' WordEmbeddings cuts: students built
  on a token table (`StudentConfig.first_ids`) train and encode so, and their WordEmbeddings export gives their
  vectors on texts of any length;
- `pad(rows)`: the rows padded to the longest on the tokenizer's side, int64 arrays plus the attention mask, like
  `tok.pad(rows, return_tensors="np")`.
tests/common/test_fast_tokenizer.py checks ids, type ids and padded batches against transformers on real text and pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from kd.common.errors import KdError
from kd.common.padding import pad_rows

TOKEN_TYPES = "token_type_ids"


@dataclass(frozen=True)
class TokenizerSettings:
    """What a transformers tokenizer adds to its Rust backend for kd's calls."""

    input_names: tuple[str, ...]  # model_input_names: token_type_ids only where the model takes them
    pad_id: int
    pad_type_id: int
    padding_side: str  # right | left
    truncation_side: str  # right | left

    def record(self) -> dict:
        return asdict(self) | {"input_names": list(self.input_names)}

    @classmethod
    def from_record(cls, rec: dict) -> TokenizerSettings:
        return cls(tuple(rec["input_names"]), int(rec["pad_id"]), int(rec["pad_type_id"]), rec["padding_side"],
                   rec["truncation_side"])


class FastTokenizer:
    """A `tokenizers.Tokenizer` with the settings above (see the module docstring)."""

    def __init__(self, backend: Any, settings: TokenizerSettings) -> None:
        self.backend, self.settings = backend, settings
        self.backend.no_padding()  # padding is `pad`'s, per batch
        self._truncation: tuple[int | None, str] | None = None  # (max length, side) the backend is set to

    @classmethod
    def from_transformers(cls, tok: Any, where: str) -> FastTokenizer:
        if not getattr(tok, "is_fast", False):
            raise KdError(f"the tokenizer ({type(tok).__name__}) has no fast (Rust) version", where,
                          "save the checkpoint with a tokenizer.json (transformers converts most tokenizers: "
                          "AutoTokenizer.from_pretrained(path).save_pretrained(path))")
        backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())  # a copy: calls on `tok` leave state in it
        settings = TokenizerSettings(tuple(tok.model_input_names), int(tok.pad_token_id or 0),
                                     int(tok.pad_token_type_id), tok.padding_side, tok.truncation_side)
        return cls(backend, settings)

    @classmethod
    def from_file(cls, path: str, settings: TokenizerSettings) -> FastTokenizer:
        return cls(Tokenizer.from_file(path), settings)

    @property
    def wants_types(self) -> bool:
        return TOKEN_TYPES in self.settings.input_names

    def _truncate_at(self, max_length: int | None, side: str) -> None:
        if (max_length, side) == self._truncation:
            return
        if max_length is None:
            self.backend.no_truncation()
        else:
            self.backend.enable_truncation(max_length, strategy="longest_first", direction=side)
        self._truncation = (max_length, side)

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_length: int | None = None,
               first_ids: bool = False) -> dict[str, list[list[int]]]:
        """{input_ids[, token_type_ids]} per text (or pair), special tokens added; `max_length` None: untruncated.
        `first_ids`: each text's first `max_length` ids, special tokens added before the cut (module docstring)."""
        if first_ids and max_length is not None:
            # one id past the cut from the right keeps the same first ids as the whole encoding would ([CLS], the
            # first max_length - 1 tokens, then [SEP], cut below) without tokenizing a 1 MiB text whole
            self._truncate_at(max_length + 1, "right")
        else:
            self._truncate_at(max_length, self.settings.truncation_side)
        batch = list(zip(texts, pairs)) if pairs is not None else list(texts)
        encs = self.backend.encode_batch(batch, add_special_tokens=True)
        cut = max_length if first_ids and max_length is not None else None
        out = {"input_ids": [e.ids[:cut] for e in encs]}
        if self.wants_types:
            out[TOKEN_TYPES] = [e.type_ids[:cut] for e in encs]
        return out

    def pad(self, rows: dict[str, list[list[int]]], idx: Sequence[int] | None = None) -> dict[str, np.ndarray]:
        """Rows `idx` (all: None) padded to the longest: int64 input_ids[, token_type_ids] and attention_mask."""
        def pick(name: str) -> list[list[int]]:
            return rows[name] if idx is None else [rows[name][i] for i in idx]

        s = self.settings
        ids, mask = pad_rows(pick("input_ids"), s.pad_id, s.padding_side)
        out = {"input_ids": ids, "attention_mask": mask}
        if self.wants_types:
            out[TOKEN_TYPES] = pad_rows(pick(TOKEN_TYPES), s.pad_type_id, s.padding_side)[0]
        return out
