"""Synthetic inputs for the objective tests (objectives, CoDIR, DvBERT): a store manifest of a bi-encoder and
cross-encoder teachers, batches shaped as student.data yields them for it, and a tiny student of any architecture."""

from __future__ import annotations

import torch
from student_stores import tiny_bert_config

from kd.common.ids import row_ids
from kd.storage.manifest import Manifest, TableRecord
from kd.storage.schema import VectorDType, vector_type
from kd.student.models import Arch, StudentConfig, StudentOutput

VOCAB, B, T, D, L, N_LABELS = 30, 8, 6, 10, 2, 3  # teacher width D, teacher layers L (+1 embeddings)


def manifest(*, pairs: bool = False, label: str | None = "int64", cross_encoders: int = 2) -> Manifest:
    """A store holding a bi-encoder `bi` and `cross_encoders` cross-encoders `ce0`, `ce1`, ..."""

    def vec(*shape: int) -> str:
        return str(vector_type(shape, VectorDType.float32))

    sides = ("_a", "_b") if pairs else ("",)
    bi = {f"{c}{s}": vec(*shape) for c, shape in (("sentence", (D,)), ("mean", (D,)), ("layers", (L + 1, D)))
          for s in sides}
    texts = {"id": "int64", **({"text_a": "string", "text_b": "string"} if pairs else {"text": "string"})}
    tables = {
        "texts": TableRecord("texts", {**texts, **({"label": label} if label else {})}),
        "teachers/bi": TableRecord("teacher", {"id": "int64", "n_tokens": "int32", **bi},
                                   {"dim": D, "num_layers": L, "default_target": "sentence", "label_names": None}),
    }
    for k in range(cross_encoders):
        cols = {"id": "int64", "logits": vec(N_LABELS), "cls": vec(D), "layers": vec(L + 1, D)}
        meta = {"dim": D, "num_layers": L, "label_names": [f"l{i}" for i in range(N_LABELS)]}
        tables[f"teachers/ce{k}"] = TableRecord("teacher", cols, meta)
    inputs = {"fingerprint": "synthetic", "num_rows": 64, "rows_per_shard": 64, "num_shards": 1, "pairs": pairs}
    return Manifest(inputs, tables)


def hash_ids(n: int, start: int = 0) -> torch.Tensor:
    """Real row ids: 64-bit content hashes of distinct texts (common.ids), not 0, 1, 2, ..."""
    return torch.from_numpy(row_ids([f"sentence number {i} of the corpus" for i in range(start, start + n)]))


def make_batch(m: Manifest, seed: int = 0, pos: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """A batch as student.data yields it: hash ids, row positions `pos` (default 0..B-1), tokens, columns."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    pos = torch.arange(B) if pos is None else pos
    batch = {"id": hash_ids(B, int(pos[0])), "pos": pos}
    for side in ("a.", "b.") if m.pairs else ("",):
        batch[f"{side}input_ids"] = torch.randint(1, VOCAB, (B, T), generator=g) * mask
        batch[f"{side}attention_mask"] = mask
    for table, rec in m.tables.items():
        if table.startswith("teachers/"):
            for col in rec.columns:
                if col in ("id", "n_tokens"):
                    continue
                shape = (L + 1, D) if col.startswith("layers") else (N_LABELS,) if col == "logits" else (D,)
                batch[f"{table.split('/')[1]}.{col}"] = 3 * torch.randn(B, *shape, generator=g)
    label = m.tables["texts"].columns.get("label")
    if label == "int64":
        batch["label"] = torch.randint(0, N_LABELS, (B,), generator=g)
    elif label == "double":
        batch["label"] = torch.rand(B, generator=g, dtype=torch.float64)
    return batch


def student_cfg(arch: Arch = Arch.bigru, out_dim: int = D) -> StudentConfig:
    """A student of width 8 over the batches' vocabulary and length, any architecture."""
    bert = tiny_bert_config(8, 1, VOCAB, T) if arch is Arch.transformer_init else None
    return StudentConfig(arch=arch, vocab_size=VOCAB, embed_dim=8, hidden_dim=8, num_layers=1, out_dim=out_dim,
                         dropout=0.0, max_length=T, num_heads=2, ffn_dim=16, attention_dim=4, kernel_sizes=(3,),
                         bert=bert)


def run(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StudentOutput | tuple[StudentOutput, StudentOutput]:
    """The student's output on `batch`: one output, or one per side of a pair batch."""
    if "a.input_ids" in batch:
        return model(batch["a.input_ids"], batch["a.attention_mask"]), model(batch["b.input_ids"],
                                                                               batch["b.attention_mask"])
    return model(batch["input_ids"], batch["attention_mask"])
